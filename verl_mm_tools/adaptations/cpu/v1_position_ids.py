"""The same ragged position ids on verl's v1 trainer: the batch comes packed the same way from TransferQueue, and
verl's own repair (reset the ragged index, for tensors that lost it in a pickle) turns it into the same crash."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.cpu.equal_length_position_ids import fix_ragged_position_ids
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from tensordict import TensorDict

TARGET = Target(
    "verl.utils.tensordict_utils",
    "maybe_fix_3d_position_ids",
    "dc8fa98190805633010a81a926e8d296da2a0b136f5db61160bb4c39d2de9397",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="repairs either way the ragged dimension went wrong (see `equal_length_position_ids`, or lost in a pickle)",
    why="on the v1 trainer the batch comes packed the same way from TransferQueue and verl's repair (reset the "
    "ragged index) turns it into the same crash",
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_v1_batches_are_repaired_where_verl_only_resets_the_ragged_index`",
)


@ADAPTATION.replaces(TARGET)
def maybe_fix_3d_position_ids(_original: Callable[[TensorDict], None], data: TensorDict) -> None:
    if "position_ids" in data.keys():
        data["position_ids"] = fix_ragged_position_ids(data["position_ids"])
