"""A request's forward inputs as verl's trainer sees the same tokens, made by the trainer's own code: the multimodal
inputs of verl's agent-loop worker (``_compute_multi_modal_inputs``, with this package's fixes) read through the
trainer engine's ``extract_multi_modal_inputs``, and the worker's position ids (``_compute_position_ids``: the
processor's ``get_rope_index`` with each video's timing, fixed by ``adaptations/fixes/video_timing_positions.py`` and
``qwen2_5_vl_video_positions.py``). eval's checkpoint engine generates from them for a prompt with videos, so a
video's frames, grid and M-RoPE positions are the ones training computes, not a copy of that computation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

VERL_ONLY_KEYS = ("images_seqlens",)  # verl's bookkeeping beside the processor's outputs, not a model input


def trainer_inputs(
    worker: AgentLoopWorker,
    prompt_ids: Sequence[int],
    images: Sequence[Image.Image] | None,
    videos: Sequence[Any] | None,
    mm_processor_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    """The forward's inputs for ``prompt_ids`` (placeholders expanded) with the request's images and videos (verl's
    ``(frames, metadata)`` pairs), as ``worker`` computes them for the trainer: ``input_ids``, ``attention_mask``,
    ``position_ids`` in the model's layout ((4, 1, L) for M-RoPE families) and the processor's vision inputs."""
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.model import extract_multi_modal_inputs

    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)
    sample = AgentLoopOutput(
        prompt_ids=list(prompt_ids),
        response_ids=[],
        response_mask=[],
        multi_modal_data={"images": list(images) if images else None, "videos": list(videos) if videos else None},
        mm_processor_kwargs=mm_processor_kwargs,
        metrics=AgentLoopMetrics(),
    )
    # verl's postprocess: the inputs, then the positions from them (it pops mm_token_type_ids from the inputs)
    multi_modal_inputs = worker._compute_multi_modal_inputs(sample, input_ids)
    kwargs = mm_processor_kwargs if mm_processor_kwargs is not None else worker._get_mm_processor_kwargs(None)
    position_ids = worker._compute_position_ids(input_ids, attention_mask, multi_modal_inputs, kwargs)
    if position_ids.dim() == 3:  # verl's (1, 4, L), as the trainer's engine hands it to the model: (4, 1, L)
        position_ids = position_ids.transpose(0, 1)
    vision = extract_multi_modal_inputs([multi_modal_inputs])  # the trainer engine's reading of the sample
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        **{key: value for key, value in vision.items() if key not in VERL_ONLY_KEYS},
    }
