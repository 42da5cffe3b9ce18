"""verl computes a trajectory's position ids (``AgentLoopWorker._compute_position_ids``) without a Qwen2.5-VL video's
``second_per_grid_ts``, though the processor returns it: the model's ``get_rope_index`` then takes 1 s per grid step
for every video, where the processor computed 2 s for frames sampled at 1 fps (0.5 s at 4 fps), and vLLM generates
with the real value. verl's own hook for it, the processor's ``get_rope_index_kwargs``, is set here on Qwen2.5-VL's
processors, passing the processor's ``second_per_grid_ts`` on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

TARGET = Target(
    "verl.utils.tokenizer.tokenizer",
    "hf_processor",
    "7777da490d5ec991b52b1e9ad3f616cd8321b2c8d5189e981c0e21d4b69a1ea1",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="a Qwen2.5-VL processor made by verl's `hf_processor` carries `get_rope_index_kwargs` (verl's hook), which "
    "passes the processor's `second_per_grid_ts` to `get_rope_index`",
    why="verl's `_compute_position_ids` passes only the grids, so every Qwen2.5-VL video's temporal positions take "
    "1 s per grid step whatever its sampling (2 s at 1 fps, 0.5 s at 4 fps), unlike the processor's, the pretrained "
    "model's and vLLM's",
    applies_to=VERL,
    proof="`tests/adaptations/test_qwen2_5_vl_video_positions_on_cpu.py::"
    "test_verls_position_ids_ignore_the_videos_timing`",
)


@ADAPTATION.replaces(TARGET)
def hf_processor(original: Callable[..., Any], name_or_path: str, **kwargs: Any) -> Any:
    processor = original(name_or_path, **kwargs)
    if type(processor).__name__ == "Qwen2_5_VLProcessor" and getattr(processor, "get_rope_index_kwargs", None) is None:
        processor.get_rope_index_kwargs = video_timing
    return processor


@ADAPTATION.implements
def video_timing(multi_modal_inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``get_rope_index``'s ``second_per_grid_ts`` from the processor's outputs (none for a prompt without videos)."""
    seconds = multi_modal_inputs.get("second_per_grid_ts")
    return {} if seconds is None else {"second_per_grid_ts": seconds}
