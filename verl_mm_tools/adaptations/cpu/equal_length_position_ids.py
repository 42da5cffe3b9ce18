"""Qwen-VL's (batch, 4, L) position ids packed by verl when every sequence has the same length: torch makes the 4
the ragged dimension, and ``update_actor`` dies in ``split_with_sizes``. A verl bug on GPUs too; patched on CPU runs
only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from tensordict import TensorDict
    from torch.nested._internal.nested_tensor import NestedTensor

TARGET = Target(
    "verl.workers.utils.padding",
    "left_right_2_no_padding",
    "8b09e2ef9bb544fa95661223f7d002e6cd8ec76b250b0ca6335916d5082acf87",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="rebuilds the nested (batch, 4, L) position ids with the sequence dimension ragged",
    why="`as_nested_tensor` of equal-length Qwen-VL (4, L) ids makes the 4 ragged; `update_actor` then dies in "
    "`split_with_sizes`. A verl bug on GPUs too; patched on CPU runs only",
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_equal_lengths_break_verls_packing_and_the_fix_repairs_it`",
)


@ADAPTATION.replaces(TARGET)
def left_right_2_no_padding(original: Callable[[TensorDict], TensorDict], data: TensorDict) -> TensorDict:
    data = original(data)
    data["position_ids"] = fix_ragged_position_ids(data["position_ids"])
    return data


@ADAPTATION.implements
def fix_ragged_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Nested (batch, 4, L_i) position ids with the sequence dimension ragged, whatever torch chose.

    Two ways it goes wrong: ``as_nested_tensor`` of equal-shape (4, L) components makes dimension 1 (the 4) ragged
    (values (4 * batch, L), offsets over dimension 1): the components are rebuilt along L. And a nested tensor that
    went through tensordict's consolidate and pickle comes back with ``_ragged_idx`` 1 although its values and
    offsets run along L (values (4, sum L)): verl's ``maybe_fix_3d_position_ids`` repairs that by setting the index,
    which on the first case produced ``split_with_sizes expects split_sizes to sum exactly to ...``.
    """
    nested = cast("NestedTensor", position_ids)  # read only where is_nested: torch's jagged nested tensor
    if not position_ids.is_nested or position_ids.dim() != 3 or nested._ragged_idx == 2:
        return position_ids
    values, offsets = nested.values(), nested.offsets()
    if int(offsets[-1]) != values.shape[0]:  # offsets run along L: only the index was lost
        nested._ragged_idx = 2
        return position_ids
    components = values.split(offsets.diff().tolist(), dim=0)
    lengths = torch.tensor([0] + [component.shape[-1] for component in components])
    return torch.nested.nested_tensor_from_jagged(
        torch.cat(components, dim=-1), offsets=lengths.cumsum(0), jagged_dim=2
    )
