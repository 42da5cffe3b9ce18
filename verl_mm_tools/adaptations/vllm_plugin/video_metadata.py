"""Qwen2.5-VL's video positions on vLLM. verl's vLLM server sends each prompt video as qwen-vl-utils loaded it, a
(frames, metadata) pair, and the trainer's processor reads the metadata: the frames' sampled fps gives the video's
``second_per_grid_ts`` (2 frames per grid step / 1 fps = 2.0 s), which scales the temporal M-RoPE positions of its
tokens. vLLM 0.24's data parser for Qwen2-VL and Qwen2.5-VL drops the metadata (``video_needs_metadata=False``;
Qwen3-VL's keeps it), so the HF processor inside vLLM builds default metadata (24 fps): 0.5 s a grid step, other
positions than the trainer's, log-probs 5e-4 to 1e-3 apart on the tiny model, on GPUs too. Here a Qwen2.5-VL parser
keeps the metadata when every video carries it, and the processor call passes it to the HF processor with
``do_sample_frames=False`` (the frames are sampled already), as vLLM's Qwen3-VL processor does. A video without
metadata (vLLM's own dummy inputs, a user's bare array) is processed as before. Qwen2-VL's positions do not use time:
unchanged.

Must import without verl and torch (vLLM imports the plugin in every engine process).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from verl_mm_tools.adaptations.record import Adaptation, Section, Target

QWEN2_VL = "vllm.model_executor.models.qwen2_vl"
QWEN2_5_VL = "vllm.model_executor.models.qwen2_5_vl"
PARSER = Target(
    QWEN2_VL,
    "Qwen2VLProcessingInfo.get_data_parser",
    "3722100763e6d62164f8aa87a2e23ae1addebdafba02e3b96218d104e0d1a1f0",
)
PARSE_VIDEOS = Target(
    QWEN2_VL,
    "Qwen2VLMultiModalDataParser._parse_video_data",
    "19389079cb671c55cc48286c760287b60612d4fdf4c3c4c96c1f43ea83279c93",
)
PROCESS = Target(
    QWEN2_5_VL,
    "Qwen2_5_VLMultiModalProcessor._call_hf_processor",
    "f9fe1f32ca4d31e4f88beca807aaf8047c135b03c5425de3cc5c9c665f0ac539",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(PARSER, PARSE_VIDEOS, PROCESS),
    what="Qwen2.5-VL's data parser keeps each video's metadata when every video of a prompt carries it, and its "
    "processor call hands it to the HF processor (`video_metadata`, `do_sample_frames=False`), as vLLM's Qwen3-VL "
    "processor does; videos without metadata as before",
    why="vLLM 0.24 drops Qwen2/2.5-VL videos' metadata, so the HF processor inside vLLM computes "
    "`second_per_grid_ts` from default metadata (0.5 s a grid step where the trainer's processor computes 2.0 for "
    "frames sampled at 1 fps): the video's temporal M-RoPE positions differ from the trainer's, log-probs 5e-4 "
    "to 1e-3 apart on the tiny Qwen2.5-VL, on GPUs too",
    applies_to="vllm 0.24.0 (any platform)",
    proof="`tests/adaptations/test_vllm_video_metadata_on_cpu.py::test_vllms_own_qwen2_5_vl_processor_drops_the_metadata`"
    "; in vLLM: `tests/tiny/test_vllm_engine_on_cpu.py` (the video prompt of `scripts/check_vllm_engine.py`)",
)
KEEPS_VIDEO_METADATA = "_verl_mm_tools_keeps_video_metadata"


@ADAPTATION.replaces(PARSER)
def get_data_parser(original: Callable[[Any], Any], info: Any) -> Any:
    """The family's parser; Qwen2.5-VL's marked to keep video metadata (Qwen2-VL's positions do not use time)."""
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLProcessingInfo

    parser = original(info)
    if isinstance(info, Qwen2_5_VLProcessingInfo):
        setattr(parser, KEEPS_VIDEO_METADATA, True)
    return parser


@ADAPTATION.replaces(PARSE_VIDEOS)
def parse_video_data(original: Callable[[Any, Any], Any], parser: Any, data: Any) -> Any:
    """vLLM's parse; with each video's metadata kept as (frames, metadata) where the parser is marked and every
    video carries metadata (vLLM's own parse with ``video_needs_metadata``, on a copy: parsers are shared)."""
    if not getattr(parser, KEEPS_VIDEO_METADATA, False) or not _all_with_metadata(data):
        return original(parser, data)
    keeping = copy.copy(parser)
    keeping.video_needs_metadata = True
    return original(keeping, data)


@ADAPTATION.replaces(PROCESS)
def call_hf_processor(
    original: Callable[..., Any],
    processor: Any,
    prompt: str,
    mm_data: Mapping[str, object],
    mm_kwargs: Mapping[str, object],
    tok_kwargs: Mapping[str, object],
) -> Any:
    """vLLM's call; videos given with metadata are passed as frames plus ``video_metadata``, already sampled."""
    videos = mm_data.get("videos")
    if isinstance(videos, list) and _all_with_metadata(videos):
        frames, metadata = zip(*videos, strict=True)
        mm_data = {**mm_data, "videos": list(frames), "video_metadata": list(metadata)}
        mm_kwargs = {**mm_kwargs, "do_sample_frames": False}
    return original(processor, prompt, mm_data, mm_kwargs, tok_kwargs)


def _all_with_metadata(data: object) -> bool:
    """Whether ``data`` (one video or a list of them, as a prompt's ``multi_modal_data["video"]``) is one or more
    (frames, metadata) pairs."""
    if _with_metadata(data):
        return True
    return isinstance(data, list) and bool(data) and all(_with_metadata(video) for video in data)


def _with_metadata(video: object) -> bool:
    return isinstance(video, tuple) and len(video) == 2 and isinstance(video[1], Mapping)
