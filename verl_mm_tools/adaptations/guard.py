"""The one guard and the one failure policy of every adaptation, and the installation of a replacement.

Guard: before an adaptation patches anything, the sha256 of each target's source (``inspect.getsource``, decorators'
``__wrapped__`` followed) must equal the one its record holds (``record.Target.sha256``): the code it was written
against. A replacement carries ``PATCHED_MARK``; a target that carries it is already adapted (the plugin can be
imported twice) and is left alone.

Failure policy: a changed target refuses to start (``VerlChangedError``, naming the inventory row, the target, the
expected and the found hash, and what to do). ``VERL_MM_TOOLS_ADAPTATIONS=warn`` downgrades that to an ERROR in the
log, and the adaptation is then not applied: verl's (or vLLM's) code runs as it is.

The rows that patch nothing but subclass or copy verl's code (the mm_tool loop, the step hooks, the in-process
worker) are checked by ``confirm`` where that code is used, under the same policy; downgraded, our code still runs.

Must import without verl and torch: the vLLM plugin uses it in every vLLM engine process.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.errors import PluginRegistrationError

logger = logging.getLogger(__name__)

PATCHED_MARK = "__verl_mm_tools_patched__"
POLICY_ENV = "VERL_MM_TOOLS_ADAPTATIONS"
REFUSE, WARN = "refuse", "warn"
INVENTORY = "docs/verl_adaptations.md"
_ENTRY = re.compile(r"^(?P<table>\w+)\[(?P<key>[\w.]+)\]$")
_CONFIRMED: set[Adaptation] = set()  # the rows ``confirm`` checked in this process
_Replacement = TypeVar("_Replacement", bound=Callable[..., object])

ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    what="the mechanism of every replacement (the rows of this table; the records: `adaptations/record.py`): "
    "checks the sha256 of each target's "
    "source against its record, then installs the replacement in its home module and in every verl module (vLLM "
    "module, for the vLLM plugin's rows) that bound it by name (marked, so a second import is a no-op). A changed "
    "target refuses to start, naming the adaptation's code, the target, the expected and found hashes and what to do; "
    f"`{POLICY_ENV}={WARN}` downgrades that to an ERROR in the log, and the adaptation is then not applied. The "
    "same check, by `confirm`, guards the rows whose code subclasses or copies verl's where that code is used "
    "(downgraded, that code runs as it is)",
    why="verl's modules bind functions by name at import (`from verl.utils.distributed import ...`), and a blind "
    "patch of a changed function would hide the change",
    applies_to="any",
    proof="n/a (mechanism); its refusal is tested: "
    "`tests/adaptations/test_cpu_patches_on_cpu.py::test_a_changed_verl_function_is_refused_with_its_name`, "
    "`::test_a_changed_offload_module_is_refused_with_its_name`, "
    "`tests/adaptations/test_records_on_cpu.py::test_a_changed_target_refuses_to_start_unless_downgraded`; the "
    "install: `::test_the_install_skeleton_replaces_a_function_a_method_and_a_table_entry_once`; "
    "`confirm`'s: `tests/adaptations/test_extension_checks_on_cpu.py::"
    "test_using_the_code_of_a_changed_row_refuses_to_start_naming_its_code`, "
    "`::test_a_changed_row_downgraded_to_warn_is_logged_once_and_its_code_runs`",
)


class VerlChangedError(PluginRegistrationError):
    """Code of verl's (or vLLM's) that an adaptation relies on is not the code it was written against."""


def source_sha256(code: object) -> str:
    return hashlib.sha256(inspect.getsource(code).encode()).hexdigest()  # type: ignore[arg-type]


def locate(target: Target) -> Any:
    """The object ``target`` names (importing its module). A class's own attribute, not an inherited one."""
    found: object = importlib.import_module(target.module)
    *path, last = target.name.split(".") if not _ENTRY.match(target.name) else [target.name]
    for part in path:
        found = getattr(found, part)
    entry = _ENTRY.match(last)
    if entry is not None:
        table, key = table_entry(found, entry)
        return table[key]
    return vars(found)[last] if isinstance(found, type) else getattr(found, last)


def table_entry(owner: object, entry: re.Match[str]) -> tuple[Any, object]:
    """The table and key a ``TABLE[Enum.MEMBER]`` target name (``entry``, matched) names in ``owner``, a module."""
    key: object = owner
    for part in entry["key"].split("."):
        key = getattr(key, part)
    return getattr(owner, entry["table"]), key


def policy() -> str:
    value = os.environ.get(POLICY_ENV, REFUSE).strip().lower() or REFUSE
    if value not in (REFUSE, WARN):
        raise VerlChangedError(f"{POLICY_ENV} must be {REFUSE!r} (the default) or {WARN!r}, got {value!r}")
    return value


@ADAPTATION.implements
def checked(adaptation: Adaptation) -> list[Any] | None:
    """The objects ``adaptation``'s targets name, once their source hashes are checked. None when the adaptation is
    applied already, or when a target changed and the policy is ``warn`` (logged); raises ``VerlChangedError``
    when a target changed and the policy is ``refuse`` (the default)."""
    found = [locate(target) for target in adaptation.targets]
    if any(getattr(code, PATCHED_MARK, False) for code in found):
        return None
    return found if verified(adaptation) else None


@ADAPTATION.implements
def verified(adaptation: Adaptation) -> bool:
    """Whether ``adaptation``'s targets are the code it was written against, read through any fix installed on them
    (another adaptation may replace a method a subclass relies on): True; a changed one raises
    ``VerlChangedError`` (policy ``refuse``) or is logged (``warn``): False, run without it."""
    message = mismatch(adaptation, [locate(target) for target in adaptation.targets])
    if message is None:
        return True
    refuse_or_warn(message, "verl-mm-tools runs WITHOUT this adaptation.")
    return False


@ADAPTATION.implements
def confirm(adaptation: Adaptation) -> None:
    """Check the targets of a row that patches nothing (an extension subclass, a copied method) where its code is
    used, once per process: a changed target refuses to start (``VerlChangedError``), or, downgraded, is logged once
    and our code runs as it is (a subclass cannot be left out)."""
    if adaptation in _CONFIRMED:
        return
    message = mismatch(adaptation, [locate(target) for target in adaptation.targets], downgraded="run it anyway")
    if message is not None:
        refuse_or_warn(message, "verl-mm-tools runs this code, written against the old one, as it is.")
    _CONFIRMED.add(adaptation)


def mismatch(adaptation: Adaptation, found: Sequence[object], downgraded: str = "run without it") -> str | None:
    """What is wrong when a target's source is not the one ``adaptation`` was written against; None when none is.
    ``downgraded``: what the ``warn`` policy does, for the message."""
    changed = [
        (target, digest)
        for target, code in zip(adaptation.targets, found, strict=True)
        if (digest := source_sha256(code)) != target.sha256
    ]
    return changed_message(adaptation, changed, downgraded) if changed else None


def refuse_or_warn(message: str, consequence: str) -> None:
    if policy() == REFUSE:
        raise VerlChangedError(message)
    logger.error("%s\n%s=%s: %s", message, POLICY_ENV, WARN, consequence)


def changed_message(
    adaptation: Adaptation, changed: Sequence[tuple[Target, str]], downgraded: str = "run without it"
) -> str:
    targets = "; ".join(
        f"{target.qualname}: expected sha256 {target.sha256}, found {digest}" for target, digest in changed
    )
    return (
        f"verl-mm-tools' adaptation {adaptation.origin} ({INVENTORY}, the row of its module) relies on code that "
        f"is not the code it was written against ({adaptation.applies_to}): {targets}. Install "
        f"{adaptation.applies_to}; or re-read the changed code, update the adaptation and its sha256 (or drop it if "
        f"its proof test shows the problem is gone); or set {POLICY_ENV}={WARN} to {downgraded}."
    )


@ADAPTATION.implements
def apply(adaptation: Adaptation) -> None:
    """The one install skeleton: check the targets (``checked``), then put each target's replacement where verl (or
    vLLM) looks it up and run the record's installers with the targets' objects. Once per process: applied already,
    or a changed target downgraded to ``warn``, it does nothing."""
    found = checked(adaptation)
    if found is None:
        return
    for target, original in zip(adaptation.targets, found, strict=True):
        replacement = adaptation.replacements.get(target)
        if replacement is not None:
            install_replacement(target, original, calling(replacement, original))
    for installer in adaptation.installers:
        installer(*found)


def apply_declared(declaring: ModuleType, _imported: ModuleType | None = None) -> None:
    """``apply`` the ``ADAPTATION`` that module ``declaring`` holds, read at the call (a test may have replaced it).
    ``_imported``: the module whose import triggered it (``import_order.call_after_import``), unused."""
    apply(declaring.ADAPTATION)


def calling(replacement: Callable[..., object], original: Callable[..., object]) -> Callable[..., object]:
    """``replacement`` with ``original`` as its first argument, looking like ``original`` (its ``__wrapped__`` keeps
    the guard reading the original's source). ``updated=()``: a compiled function's attributes are not ours."""

    @functools.wraps(original, updated=())
    def replaced(*args: object, **kwargs: object) -> object:
        return replacement(original, *args, **kwargs)

    return replaced


def install_replacement(target: Target, original: Callable[..., object], replacement: Callable[..., object]) -> None:
    """``replacement`` in ``target``'s place: a table entry, a class's method, or a function (in its module and in
    every loaded module of the same package that bound it by name)."""
    entry = _ENTRY.match(target.name)
    if entry is not None:
        table, key = table_entry(importlib.import_module(target.module), entry)
        table[key] = mark(replacement)
        logger.debug("replaced %s", target.qualname)
    elif "." in target.name:
        install_method(target, replacement)
    else:
        install(target, original, replacement, bound_in=target.module.split(".")[0] + ".")


def mark(replacement: _Replacement) -> _Replacement:
    setattr(replacement, PATCHED_MARK, True)
    return replacement


def install(
    target: Target, original: Callable[..., object], replacement: Callable[..., object], bound_in: str = "verl."
) -> None:
    """Put ``replacement`` wherever ``target``'s module and the loaded modules under ``bound_in`` (verl's, or vLLM's)
    hold ``original`` under its name."""
    mark(replacement)
    for name, module in list(sys.modules.items()):
        is_home = name == target.module
        if (is_home or name.startswith(bound_in)) and getattr(module, target.name, None) is original:
            setattr(module, target.name, replacement)
    logger.debug("replaced %s", target.qualname)


def install_method(target: Target, replacement: Callable[..., object]) -> None:
    """Put ``replacement`` on the class: ``target.name`` is ``Class.method``."""
    class_name, method_name = target.name.rsplit(".", 1)
    owner: object = importlib.import_module(target.module)
    for part in class_name.split("."):
        owner = getattr(owner, part)
    setattr(owner, method_name, mark(replacement))
    logger.debug("replaced %s", target.qualname)
