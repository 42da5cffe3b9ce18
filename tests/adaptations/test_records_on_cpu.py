"""The adaptations' records (``verl_mm_tools/adaptations/registry.py``): every target is the code its record was
written against (the one guard: the sha256 of its source), every record the package declares is listed once and names
its code, the inventory document is generated from the records, every proof test they name exists, a changed target
refuses to start unless the policy is downgraded, and the one install skeleton (``guard.apply``) puts a replacement
where verl looks its target up."""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import re
from pathlib import Path

import pytest

from verl_mm_tools.adaptations import guard, touchpoints
from verl_mm_tools.adaptations.inventory import REGENERATE, inventory
from verl_mm_tools.adaptations.record import Adaptation, CodeLocation, Section, Target
from verl_mm_tools.adaptations.registry import ADAPTATIONS, row

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "verl_mm_tools"
TARGETS = [(row(adaptation), target) for adaptation in ADAPTATIONS for target in adaptation.targets]


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


def declared_records() -> list[tuple[str, str]]:
    """(module, name) of every module-level ``NAME = Adaptation(...)`` in the package's sources."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Adaptation":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                found += [(module, target.id) for target in targets if isinstance(target, ast.Name)]
    return found


def test_every_record_the_package_declares_is_listed_once_in_the_registry():
    import importlib

    declared = [getattr(importlib.import_module(module), name) for module, name in declared_records()]
    assert len(declared) == len(ADAPTATIONS) == 51  # one row per record, numbered by its place
    assert all(any(record is listed for listed in ADAPTATIONS) for record in declared)
    assert len(set(ADAPTATIONS)) == len(ADAPTATIONS)  # no record twice (``row`` finds each by equality)
    assert [row(adaptation) for adaptation in ADAPTATIONS] == list(range(1, 52))


@pytest.mark.parametrize("adaptation", ADAPTATIONS, ids=lambda adaptation: str(row(adaptation)))
def test_every_record_names_its_code_and_every_replacement_covers_its_targets(adaptation):
    assert adaptation.code or adaptation.files, f"row {row(adaptation)} names no code: decorate it (record.py)"
    for path in adaptation.files:
        assert (ROOT / path).is_file(), f"row {row(adaptation)} names {path}, which does not exist"
    for location in adaptation.locations():
        assert location.path.startswith("verl_mm_tools/") and location.first_line <= location.last_line
    if adaptation.section is Section.REPLACEMENTS and adaptation.targets:  # ``guard.apply`` installs something
        assert adaptation.replacements or adaptation.installers, f"row {row(adaptation)} replaces nothing"


def test_where_is_derived_from_the_decorated_code():
    from verl_mm_tools.adaptations.fixes import glm_stop_token
    from verl_mm_tools.adaptations.inventory import ranges, where_cell

    assert where_cell(glm_stop_token.ADAPTATION) == (
        "`adaptations/fixes/glm_stop_token.py`: `_merge_context_token_ids` "
        "(every run, applied when verl imports the module)"
    )
    assert where_cell(touchpoints.PACKAGING) == "`setup.py`"
    assert ranges([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"


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


@pytest.mark.parametrize("adaptation", ADAPTATIONS, ids=lambda adaptation: str(row(adaptation)))
def test_every_proof_test_the_records_name_exists(adaptation):
    for path, test in proof_nodes(adaptation.proof):
        assert (ROOT / path).is_file(), f"row {row(adaptation)} names {path}, which does not exist"
        assert test in defined_functions(ROOT / path), f"row {row(adaptation)} names {path}::{test}, not defined there"


def changed_json_dumps() -> Adaptation:
    """A record whose target (``json.dumps``) is not the code it pins."""
    record = Adaptation(
        section=Section.REPLACEMENTS,
        targets=(Target("json", "dumps", "0" * 64),),
        what="nothing",
        why="a test",
        applies_to="json of a Python that never was",
        proof="none",
    )
    record.implements(changed_json_dumps)  # its "code": this function, named in the message
    return record


def test_a_changed_target_refuses_to_start_unless_downgraded(monkeypatch, caplog):
    import json

    found = guard.source_sha256(json.dumps)
    monkeypatch.delenv(guard.POLICY_ENV, raising=False)
    with pytest.raises(guard.VerlChangedError) as refused:
        guard.checked(changed_json_dumps())
    message = str(refused.value)
    for part in (
        str(CodeLocation.of(changed_json_dumps)),
        "tests/adaptations/test_records_on_cpu.py:",
        "docs/verl_adaptations.md",
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


def test_a_subclass_verifies_a_target_another_adaptation_replaced_through_the_replacement(monkeypatch, caplog):
    """``verified`` (``manager_tq``'s subclass relies on a method the shared-images fix replaces) reads a fixed
    target's source through its ``__wrapped__``: the original's hash passes; another refuses, or is logged and
    False when downgraded."""
    import json

    original = json.JSONEncoder.__dict__["encode"]
    pinned = dataclasses.replace(
        changed_json_dumps(), targets=(Target("json", "JSONEncoder.encode", guard.source_sha256(original)),)
    )
    monkeypatch.setattr(json.JSONEncoder, "encode", guard.mark(guard.calling(lambda encode, *a: encode(*a), original)))
    assert guard.checked(pinned) is None and guard.verified(pinned) is True
    changed = dataclasses.replace(pinned, targets=(Target("json", "JSONEncoder.encode", "0" * 64),))
    monkeypatch.delenv(guard.POLICY_ENV, raising=False)
    with pytest.raises(guard.VerlChangedError, match="json.JSONEncoder.encode"):
        guard.verified(changed)
    monkeypatch.setenv(guard.POLICY_ENV, "warn")
    with caplog.at_level(logging.ERROR, logger=guard.__name__):
        assert guard.verified(changed) is False
    assert "runs WITHOUT this adaptation" in caplog.text


VICTIM = """
import enum


class Kind(enum.Enum):
    A = "a"


def double(x):
    return 2 * x


class Box:
    def size(self):
        return 1


TABLE = {Kind.A: double}
"""


def test_the_install_skeleton_replaces_a_function_a_method_and_a_table_entry_once(tmp_path, monkeypatch):
    import importlib
    import sys

    (tmp_path / "victim_module.py").write_text(VICTIM, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    victim = importlib.import_module("victim_module")
    monkeypatch.setitem(sys.modules, "victim_module", victim)
    bound_copy = type(sys)("victim_module.bound")  # a module of the same package that bound the function by name
    bound_copy.double = victim.double
    monkeypatch.setitem(sys.modules, "victim_module.bound", bound_copy)
    function, method, entry = (
        Target("victim_module", name, guard.source_sha256(code))
        for name, code in (("double", victim.double), ("Box.size", victim.Box.size), ("TABLE[Kind.A]", victim.double))
    )
    record = Adaptation(
        section=Section.REPLACEMENTS,
        targets=(function, method, entry),
        what="",
        why="",
        applies_to="",
        proof="none",
    )
    record.replaces(function)(lambda original, x: original(x) + 1)
    record.replaces(method)(lambda original, self: original(self) * 10)
    record.replaces(entry)(lambda original, x: -original(x))

    guard.apply(record)
    guard.apply(record)  # applied already: nothing wrapped twice

    assert victim.double(3) == 7 and bound_copy.double(3) == 7
    assert victim.Box().size() == 10
    assert victim.TABLE[victim.Kind.A](3) == -6
    assert victim.double.__name__ == "double" and guard.source_sha256(victim.double) == function.sha256
    with pytest.raises(ValueError, match="is not one of this adaptation's targets"):
        record.replaces(Target("victim_module", "other", "0" * 64))


def test_no_adaptation_installs_itself_outside_the_one_skeleton():
    """Only ``guard`` checks and installs (``guard.apply``); ``manager_tq`` verifies the verl code its subclass
    relies on where it is built (``guard.verified``)."""
    allowed = {PACKAGE / "adaptations" / "guard.py"}
    skeleton = re.compile(r"(?:^|[^.\w]|guard\.)(checked|install|install_method|install_replacement)\(")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in allowed
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if skeleton.search(line) and not line.lstrip().startswith("def ")
    ]
    assert not found, "install through guard.apply (Adaptation.replaces / installs), not by hand:\n" + "\n".join(found)
