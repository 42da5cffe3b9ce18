"""Qwen2.5-VL's video positions in the trainer. transformers 5.9's ``Qwen2_5_VLModel.get_rope_index`` (which verl binds
to the processor and calls for every trajectory's position ids) departs from the reference design (Qwen's own code,
transformers 4, vLLM) for videos in two ways: the text after a video resumes at the video's start plus its larger
spatial side, not one past the video's largest position, so with a temporal extent longer than the picture's side
(any clip of more than a few seconds) the text's positions overlap the video's; and it truncates each video's
seconds per grid step to an integer before scaling (0.5 s at 4 fps becomes 0: every frame at the same time). The
model was pretrained, and vLLM generates, with the reference positions. Prompts with videos get the reference's
positions here (temporal ``int(index * seconds_per_grid * tokens_per_second)``, text resuming at the maximum plus
one); prompts without videos keep transformers' (the same for images)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    import torch

TEXT, IMAGE, VIDEO = 0, 1, 2  # transformers' mm_token_type_ids
TARGET = Target(
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "Qwen2_5_VLModel.get_rope_index",
    "690e539be08514b7dd6a87fa6af928d90b0e492d3789bb461b8f04792b62eeb8",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="a prompt with videos gets Qwen2.5-VL's reference M-RoPE positions (a video's temporal positions "
    "`int(index * second_per_grid_ts * tokens_per_second)`, the text after it resuming one past its largest "
    "position); prompts without videos keep transformers'",
    why="transformers 5.9 resumes the text after a video at the video's start plus its larger spatial side (the "
    "text's positions overlap a long video's) and truncates `second_per_grid_ts` to an integer (0.5 s becomes 0): "
    "the trainer's positions differ from the pretrained model's and from vLLM's (tiny Qwen2.5-VL, a 4 s clip at "
    "1 fps: log-probs 7e-4 apart)",
    applies_to=f"{VERL} with transformers 5.9",
    proof="`tests/adaptations/test_qwen2_5_vl_video_positions_on_cpu.py::"
    "test_transformers_own_positions_overlap_a_videos_and_truncate_its_timing`",
)


# owner: the model, or the processor verl binds it to (``hf_processor`` sets ``processor.config``)
@ADAPTATION.replaces(TARGET)
def get_rope_index(
    original: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    owner: Any,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    if video_grid_thw is None:
        return original(
            owner, input_ids, mm_token_type_ids, image_grid_thw, None, second_per_grid_ts, attention_mask, **kwargs
        )
    return reference_rope_index(
        owner.config, input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, second_per_grid_ts, attention_mask
    )


@ADAPTATION.implements
def reference_rope_index(
    config: Any,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor,
    second_per_grid_ts: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids (3, batch, length) and each row's M-RoPE delta (batch, 1), as Qwen's reference computes them;
    padding (``attention_mask`` 0) keeps position 0. Each run of image or video placeholders takes the next grid."""
    import torch

    grids = {IMAGE: iter(_rows(image_grid_thw)), VIDEO: iter(_rows(video_grid_thw))}
    seconds = iter(_rows(second_per_grid_ts) if second_per_grid_ts is not None else [1.0] * len(video_grid_thw))
    position_ids = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    for row in range(input_ids.shape[0]):
        kept = (
            torch.ones_like(input_ids[row], dtype=torch.bool) if attention_mask is None else attention_mask[row].bool()
        )
        pieces: list[torch.Tensor] = []
        following = 0  # the next text position: one past the largest so far
        for modality, run in itertools.groupby(mm_token_type_ids[row][kept].tolist()):
            length = len(list(run))
            if modality == TEXT:
                piece = torch.arange(length).expand(3, -1) + following
            else:
                step = float(next(seconds)) * config.vision_config.tokens_per_second if modality == VIDEO else 1.0
                grid = next(grids[modality])
                piece = _vision_positions(grid, config.vision_config.spatial_merge_size, step, length) + following
            pieces.append(piece)
            following = int(piece.max()) + 1
        position_ids[:, row, kept] = torch.cat(pieces, dim=1).to(position_ids)
        deltas.append(following - int(kept.sum()))
    return position_ids, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


def _vision_positions(grid: list[int], merge: int, step: float, length: int) -> torch.Tensor:
    """(temporal, height, width) positions of one image or video from 0: temporal ``int(index * step)``."""
    import torch

    frames, height, width = grid[0], grid[1] // merge, grid[2] // merge
    if frames * height * width != length:
        raise ValueError(
            f"a run of {length} vision placeholders in the prompt, but its grid {grid} (merge {merge}) needs "
            f"{frames * height * width}: the prompt's placeholders and the processor's grids disagree"
        )
    temporal = (torch.arange(frames) * step).long().repeat_interleave(height * width)
    rows = torch.arange(height).repeat_interleave(width).repeat(frames)
    columns = torch.arange(width).repeat(height * frames)
    return torch.stack([temporal, rows, columns])


def _rows(values: torch.Tensor | None) -> list[Any]:
    return [] if values is None else values.tolist()
