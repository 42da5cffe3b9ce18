"""Qwen2-VL / Qwen2.5-VL, a micro-batch without images. verl's ``_get_input_embeds`` runs the vision tower on a dummy
image when a micro-batch has no pixels (so every parameter gets a gradient) and calls ``.mean()`` on what the tower
returns, which transformers >= 5 returns as a ``BaseModelOutputWithPooling``: "AttributeError:
'BaseModelOutputWithPooling' object has no attribute 'mean'". verl's v1 trainer pads a batch whose size is not a
multiple of the mini-batch with text-only samples; with mm_tool's ``export: per_turn`` the number of samples varies,
so a micro-batch of padding samples comes often and the run stops. The fixed function treats that branch as verl's
Qwen3-VL code does (``unpack_visual_output``) and leaves every other case to verl's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    import torch
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

TARGET = Target(
    "verl.models.transformers.qwen2_vl",
    "_get_input_embeds",
    "16ff653d7bc184afe1a2221e7aa8e0894e95b3c796a0c647609cfd7f849e6132",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="a micro-batch without images runs the vision tower on a dummy image the way verl's Qwen3-VL code does "
    "(`unpack_visual_output`)",
    why="transformers 5 returns a `BaseModelOutputWithPooling` from the tower, so verl's `.mean()` raises "
    "`AttributeError`; the v1 trainer pads batches with text-only samples, and with mm_tool's `export: per_turn` "
    "such micro-batches come often",
    applies_to=f"{VERL} with transformers >= 5",
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::test_verls_own_text_only_path_fails_on_transformers_5`",
)


# model: the base model whose forward verl replaces (verl's annotation names the ForConditionalGeneration class)
@ADAPTATION.replaces(TARGET)
def _get_input_embeds(
    original: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
    model: Qwen2VLModel,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    pixel_values: torch.FloatTensor | None = None,
    pixel_values_videos: torch.FloatTensor | None = None,
    image_grid_thw: torch.LongTensor | None = None,
    video_grid_thw: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if pixel_values is not None or pixel_values_videos is not None:
        return original(
            model, input_ids, attention_mask, pixel_values, pixel_values_videos, image_grid_thw, video_grid_thw
        )
    return text_only_input_embeds(model, input_ids, attention_mask)


@ADAPTATION.implements
def text_only_input_embeds(
    model: Qwen2VLModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token embeddings plus zero times the vision tower's output on a dummy 4x4-patch image, as verl intends."""
    import torch
    from verl.utils.transformers_compat import unpack_visual_output

    inputs_embeds = model.get_input_embeddings()(input_ids)
    # transformers types the sizes int | list | tuple (the sub-config: also dict or None): Qwen2-VL's are ints
    config: Any = model.config.vision_config
    patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixel_values = torch.zeros((16, patch_dim), dtype=inputs_embeds.dtype, device=inputs_embeds.device)
    image_grid_thw = torch.tensor([[1, 4, 4]], dtype=torch.long, device=inputs_embeds.device)
    image_embeds, _ = unpack_visual_output(model.visual(pixel_values.type(model.visual.dtype), grid_thw=image_grid_thw))
    inputs_embeds = inputs_embeds + 0.0 * image_embeds.mean()
    if attention_mask is not None:
        attention_mask = attention_mask.to(inputs_embeds.device)
    return inputs_embeds, attention_mask
