"""Multi-turn SFT data that mixes rows with and without images, any batch whose first row has none. verl's
``MultiTurnSFTDataset`` gives a row ``multi_modal_inputs`` only when it has images, and
``SFTTensorCollator.collate_variable_batch`` (``pad_mode: no_padding``, verl's default) asks the batch's first row for
every key any row has: "KeyError: 'multi_modal_inputs'" and the trainer stops (on GPUs too). Fixed: a row without such
a key gets None for it, which verl's collator already stores for rows after the first (the engine skips None,
``extract_multi_modal_inputs``). Keys that hold tensors are left to verl."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.utils.dataset.dataset_utils import SFTTensorCollator

TARGET = Target(
    "verl.utils.dataset.dataset_utils",
    "SFTTensorCollator.collate_variable_batch",
    "70f7827fbec87c55f485f6c82000ee557380533cac65ce19fb9fe4058d91b178",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="gives a row without a non-tensor key other rows have (`multi_modal_inputs`) None for it, as verl's collator "
    "already does for rows after the first (the engine skips None)",
    why="`MultiTurnSFTDataset` gives only rows with images `multi_modal_inputs`, and verl's collator asks the batch's "
    'first row for every key: a batch whose first row is text-only stops the trainer with "KeyError: '
    "'multi_modal_inputs'\" (GPUs too)",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::test_verls_sft_collator_fails_when_the_first_row_has_no_images`",
)


@ADAPTATION.replaces(TARGET)
def collate_variable_batch(
    collate: Callable[..., dict[str, object]], self: SFTTensorCollator, batch: list[dict]
) -> dict[str, object]:
    return collate(self, with_absent_keys_as_none(batch))


@ADAPTATION.implements
def with_absent_keys_as_none(batch: list[dict]) -> list[dict]:
    """Each row with None for the non-tensor keys (``multi_modal_inputs``) that only other rows have."""
    import torch

    keys = {key for row in batch for key in row}
    holds_tensors = {key for row in batch for key, value in row.items() if isinstance(value, torch.Tensor)}
    absent_as_none = dict.fromkeys(keys - holds_tensors)
    return [{**absent_as_none, **row} for row in batch]
