"""The adaptations' records (``verl_mm_tools/adaptations/registry.py``): every target is the code its record was
written against (the one guard: the sha256 of its source), the inventory document is generated from the records, every
proof test they name exists, and a changed target refuses to start unless the policy is downgraded."""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import re
from pathlib import Path

import pytest

from verl_mm_tools.adaptations import guard
from verl_mm_tools.adaptations.inventory import REGENERATE, inventory
from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.adaptations.registry import ADAPTATIONS

ROOT = Path(__file__).resolve().parents[2]
TARGETS = [(adaptation.row, target) for adaptation in ADAPTATIONS for target in adaptation.targets]


@pytest.mark.parametrize(("row", "target"), TARGETS, ids=[f"{row}-{target.qualname}" for row, target in TARGETS])
def test_every_target_is_the_code_its_record_was_written_against(row, target):
    found = guard.source_sha256(guard.locate(target))
    assert found == target.sha256, (
        f"row {row}: {target.qualname} changed (sha256 {found}, the record has {target.sha256}). Re-read it, update "
        f"the adaptation and its record's sha256 (or drop it), then: {REGENERATE}"
    )


def test_the_inventory_document_is_generated_from_the_records():
    written = (ROOT / "docs" / "verl_adaptations.md").read_text(encoding="utf-8")
    assert written == inventory(), f"docs/verl_adaptations.md is not the records' inventory: run `{REGENERATE}`"


def test_every_row_is_numbered_once_and_every_earlier_row_survives():
    rows = [adaptation.row for adaptation in ADAPTATIONS]
    # 35 rows before the records, the MoE SiLU (36), fully async (37), processed images (38), the eager sampler (39),
    # separate_async's logger (40), the resume recording (41), the compact images' expansion (42), the loop's output
    # model (43)
    assert sorted(rows) == list(range(1, 44))


@functools.cache
def defined_functions(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))


def proof_nodes(proof: str) -> list[tuple[str, str]]:
    """(file, test) of each ``tests/x.py::test`` in ``proof``; a bare ``::test`` is in the file named before it."""
    nodes, current = [], ""
    for path, test in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)", proof):
        current = path or current
        nodes.append((current, test))
    return nodes


@pytest.mark.parametrize("adaptation", ADAPTATIONS, ids=lambda adaptation: str(adaptation.row))
def test_every_proof_test_the_records_name_exists(adaptation):
    for path, test in proof_nodes(adaptation.proof):
        assert (ROOT / path).is_file(), f"row {adaptation.row} names {path}, which does not exist"
        assert test in defined_functions(ROOT / path), f"row {adaptation.row} names {path}::{test}, not defined there"


def changed_json_dumps() -> Adaptation:
    """A record whose target (``json.dumps``) is not the code it pins."""
    return Adaptation(
        row=99,
        section=Section.REPLACEMENTS,
        where="`tests/adaptations/test_records_on_cpu.py`",
        targets=(Target("json", "dumps", "0" * 64),),
        what="nothing",
        why="a test",
        applies_to="json of a Python that never was",
        proof="none",
    )


def test_a_changed_target_refuses_to_start_unless_downgraded(monkeypatch, caplog):
    import json

    found = guard.source_sha256(json.dumps)
    monkeypatch.delenv(guard.POLICY_ENV, raising=False)
    with pytest.raises(guard.VerlChangedError) as refused:
        guard.checked(changed_json_dumps())
    message = str(refused.value)
    for part in (
        "#99",
        "docs/verl_adaptations.md row 99",
        "json.dumps",
        "0" * 64,
        found,
        "VERL_MM_TOOLS_ADAPTATIONS=warn",
    ):
        assert part in message
    monkeypatch.setenv(guard.POLICY_ENV, "warn")
    with caplog.at_level(logging.ERROR, logger=guard.__name__):
        assert guard.checked(changed_json_dumps()) is None  # not applied
    assert "json.dumps" in caplog.text and "runs WITHOUT this adaptation" in caplog.text
    monkeypatch.setenv(guard.POLICY_ENV, "sometimes")
    with pytest.raises(guard.VerlChangedError, match="VERL_MM_TOOLS_ADAPTATIONS must be 'refuse'"):
        guard.checked(changed_json_dumps())


def test_an_unchanged_target_is_returned_and_an_adapted_one_left_alone():
    import json

    pinned = dataclasses.replace(
        changed_json_dumps(), targets=(Target("json", "dumps", guard.source_sha256(json.dumps)),)
    )
    assert guard.checked(pinned) == [json.dumps]
    marked = dataclasses.replace(pinned, targets=(Target("json", "JSONEncoder.encode", "0" * 64),))
    original = json.JSONEncoder.__dict__["encode"]
    try:
        json.JSONEncoder.encode = guard.mark(functools.wraps(original)(lambda self, o: original(self, o)))
        assert guard.checked(marked) is None  # applied already: the hash is not even looked at
    finally:
        json.JSONEncoder.encode = original
