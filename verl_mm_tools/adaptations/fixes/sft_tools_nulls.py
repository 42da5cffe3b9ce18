"""Multi-turn SFT with tools whose parameters differ, every row. verl's ``MultiTurnSFTDataset`` reads its parquet with
pandas, and Parquet stores a column of dicts as one struct type: the union of every row's keys, in the order first
seen, the absent ones read back as None. Two tools (``rotate`` with ``degrees`` and ``image_id``, ``zoom_in`` with
``x1``..``y2`` and ``image_id``) come back each padded with the other's parameters as nulls, reordered, and the chat
template renders that: verl trains on a tool prompt the model never sees in rollouts. Messages gain
``"tool_calls": null`` and ``"name": null`` the same way. Fixed: a ``tools`` cell may be JSON text (``export-sft``
writes it so: exact, order kept), decoded as read; a tools list of dicts and each message lose the None values
Parquet added (``without_nulls``). verl's reading is otherwise unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

SFT_DATASET_MODULE = "verl.utils.dataset.multiturn_sft_dataset"
READ = Target(
    SFT_DATASET_MODULE,
    "MultiTurnSFTDataset._read_files_and_process",
    "7c9cc7d0873f43d7ecbd6adb64cdb29a08c2fc0389fd671aac10cb1e9e258acd",
)
BUILD = Target(
    SFT_DATASET_MODULE,
    "MultiTurnSFTDataset._build_messages",
    "8c2ffb7e4cbd90b4cb2b9f0c55562186c2d714c54036995f326e2b10dc786575",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(READ, BUILD),
    what="decodes a `tools` cell written as JSON text (`export-sft` writes it so: exact, key order kept); drops the "
    "None values Parquet added to a tools list of dicts and to each message (`without_nulls`)",
    why="Parquet stores a column of dicts as one struct, the union of every row's keys in first-seen order, absent "
    "keys read back as None: two tools with different parameters come back padded with each other's parameters as "
    "nulls and reordered, and the chat template renders that, so verl trains on a tool prompt the rollouts never "
    "showed",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_sft_dataset_reads_differing_tools_padded_and_reordered`",
)


@ADAPTATION.replaces(READ)
def _read_files_and_process(read: Callable[..., None], self: MultiTurnSFTDataset) -> None:
    read(self)
    if self.tools is not None:
        self.tools = [read_tools_cell(tools, row) for row, tools in enumerate(self.tools)]


@ADAPTATION.replaces(BUILD)
def _build_messages(build: Callable[..., list], self: MultiTurnSFTDataset, example: dict) -> list:
    from verl.utils.py_functional import convert_nested_value_to_list_recursive

    messages = convert_nested_value_to_list_recursive(example[self.messages_key])
    return build(self, {**example, self.messages_key: without_nulls(messages)})


def read_tools_cell(cell: object, row: int) -> object:
    """One row's ``tools``: JSON text decoded, a list of dicts without the None values Parquet added."""
    if not isinstance(cell, str):
        return without_nulls(cell)
    try:
        return json.loads(cell)
    except ValueError as error:
        raise ValueError(
            f"multi-turn SFT data: row {row}'s tools is text but not JSON ({error}): {cell[:200]!r}"
        ) from None


@ADAPTATION.implements
def without_nulls(value: object) -> object:
    """``value`` with every None-valued dict entry removed, at any depth (what Parquet adds to a struct column)."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value
