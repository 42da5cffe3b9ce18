"""Fixes for verl bugs that any verl-mm-tools run can hit (CPU or GPU), and the ``remote:`` key of verl's tool YAML:
one module each, applied by the plugin (``plugin.apply_verl_fixes``) when verl imports the module each one changes.
Each module declares its ``ADAPTATION`` record (target, sha256, what, why, versions, proof test) and the code that
replaces its target (``Adaptation.replaces``) or installs it (``Adaptation.installs``); ``guard.apply`` installs it."""

from __future__ import annotations

import functools
from types import ModuleType

from verl_mm_tools.adaptations.fixes import (
    compact_images,
    fully_async_versions,
    gemma4_arguments,
    glm4v_flops,
    glm4v_image_features,
    glm_stop_token,
    glm_vision_embeddings,
    processed_images,
    qwen2_5_vl_video_positions,
    qwen2_vl_text_only,
    qwen_video_reader,
    remote_tools,
    separate_async_logger,
    sft_rows_without_images,
    sft_tools_nulls,
    sft_video_sampling,
    shared_images,
    video_timing_positions,
    vllm_image_tokens,
    weight_sync,
)
from verl_mm_tools.adaptations.guard import apply_declared
from verl_mm_tools.adaptations.import_order import call_after_import

EVERY_RUN: tuple[ModuleType, ...] = (
    qwen2_vl_text_only,
    weight_sync,
    glm_stop_token,
    glm4v_image_features,
    glm4v_flops,
    glm_vision_embeddings,
    gemma4_arguments,
    vllm_image_tokens,
    sft_tools_nulls,
    sft_rows_without_images,
    remote_tools,
    processed_images,
    compact_images,
    shared_images,
    separate_async_logger,
    fully_async_versions,
    qwen_video_reader,
    qwen2_5_vl_video_positions,
    video_timing_positions,
    sft_video_sampling,
)


def apply_verl_fixes() -> None:
    """Each fix right after verl imports the module of its (first) target: at once where verl imported it already.
    A target whose source changed refuses to start (``guard``), from inside that import."""
    for fix in EVERY_RUN:
        call_after_import(fix.ADAPTATION.targets[0].module, functools.partial(apply_declared, fix))
