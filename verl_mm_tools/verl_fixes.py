"""Fixes for verl 0.9.1 bugs that any verl-mm-tools run can hit (CPU or GPU), applied by the plugin.

1. Qwen2-VL / Qwen2.5-VL, a micro-batch without images. ``verl.models.transformers.qwen2_vl._get_input_embeds``
   runs the vision tower on a dummy image when a micro-batch has no pixels (so every parameter gets a gradient) and
   calls ``.mean()`` on what the tower returns, which transformers >= 5 returns as a ``BaseModelOutputWithPooling``:
   "AttributeError: 'BaseModelOutputWithPooling' object has no attribute 'mean'". verl's v1 trainer pads a batch
   whose size is not a multiple of the mini-batch with text-only samples (``upsample_batch_to_divisible_size``); with
   mm_tool's ``export: per_turn`` the number of samples varies, so a micro-batch of padding samples comes often and
   the run stops. The fixed function treats that branch as verl's Qwen3-VL code does (``unpack_visual_output``) and
   leaves every other case to verl's. Applied when verl imports the module; it checks the module still looks the way
   the fix assumes and fails loudly otherwise.
"""

from __future__ import annotations

import functools
import logging

from verl_mm_tools.import_order import call_after_import
from verl_mm_tools.verl_patch import VerlChangedError, checked_original, install

logger = logging.getLogger(__name__)

QWEN2_VL_MODULE = "verl.models.transformers.qwen2_vl"
QWEN2_VL_TARGET = (QWEN2_VL_MODULE, "_get_input_embeds")
QWEN2_VL_EXPECTED_SOURCE = "inputs_embeds = inputs_embeds + 0.0 * image_embeds.mean()"
QWEN2_VL_PARAMETERS = ("model", "input_ids", "attention_mask", "pixel_values", "pixel_values_videos",
                       "image_grid_thw", "video_grid_thw")


def fix_qwen2_vl_text_only_micro_batch(_module=None) -> None:
    original = checked_original(*QWEN2_VL_TARGET, QWEN2_VL_EXPECTED_SOURCE, QWEN2_VL_PARAMETERS,
                                "verl_mm_tools/verl_fixes.py")
    if original is None:
        return

    @functools.wraps(original)
    def _get_input_embeds(model, input_ids, attention_mask=None, pixel_values=None, pixel_values_videos=None,
                          image_grid_thw=None, video_grid_thw=None):
        if pixel_values is not None or pixel_values_videos is not None:
            return original(model, input_ids, attention_mask, pixel_values, pixel_values_videos, image_grid_thw,
                            video_grid_thw)
        return text_only_input_embeds(model, input_ids, attention_mask)

    install(*QWEN2_VL_TARGET, original, _get_input_embeds)


def text_only_input_embeds(model, input_ids, attention_mask):
    """Token embeddings plus zero times the vision tower's output on a dummy 4x4-patch image, as verl intends."""
    import torch
    from verl.utils.transformers_compat import unpack_visual_output

    inputs_embeds = model.get_input_embeddings()(input_ids)
    config = model.config.vision_config
    patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixel_values = torch.zeros((16, patch_dim), dtype=inputs_embeds.dtype, device=inputs_embeds.device)
    image_grid_thw = torch.tensor([[1, 4, 4]], dtype=torch.long, device=inputs_embeds.device)
    image_embeds, _ = unpack_visual_output(model.visual(pixel_values.type(model.visual.dtype), grid_thw=image_grid_thw))
    inputs_embeds = inputs_embeds + 0.0 * image_embeds.mean()
    if attention_mask is not None:
        attention_mask = attention_mask.to(inputs_embeds.device)
    return inputs_embeds, attention_mask


def _fix_or_report(module) -> None:
    try:
        fix_qwen2_vl_text_only_micro_batch(module)
    except VerlChangedError:  # inside verl's own import: report, and leave verl's code as it is
        logger.error("verl-mm-tools did not apply its fix for Qwen2-VL micro-batches without images", exc_info=True)


def apply_verl_fixes() -> None:
    call_after_import(QWEN2_VL_MODULE, _fix_or_report)
