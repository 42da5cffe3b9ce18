"""The record every adaptation declares: what of verl's (or vLLM's) code it relies on, pinned by the sha256 of that
code's source, what it does and why, the versions it applies to, and the test that proves it is still needed.

``docs/verl_adaptations.md`` is generated from these records (``inventory.py``); ``guard.py`` checks the hashes before
anything is patched. Must import without verl and torch: the vLLM plugin declares its records in every vLLM process.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

VERL = "verl 0.9.1"


class Section(Enum):
    """The inventory's tables, in the order the document shows them (the value is the table's heading)."""

    REPLACEMENTS = "Replacements of verl's (and vLLM's) code"
    SUBCLASS_FIXES = "Fixes by subclass"
    IMPORT_ORDER = "Import order and plugin loading"
    PRIVATE_STATE = "Registrations that reach into verl's private state (they stay with what they register)"
    EXTENSIONS = "Extension-point subclasses and copied methods (they stay where they are)"
    CONFIGURATION = "Configuration and packaging workarounds"


@dataclass(frozen=True)
class Target:
    """One piece of verl's (or vLLM's) code an adaptation replaces, subclasses or copies.

    ``name`` is the attribute path inside ``module``: ``function``, ``Class.method``, or ``TABLE[Enum.MEMBER]`` (a
    dict entry keyed by a member of the module's enum). ``sha256`` is the hex digest of ``inspect.getsource`` of it
    (decorators' ``__wrapped__`` followed) in the version the adaptation was written against."""

    module: str
    name: str
    sha256: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class Adaptation:
    """One row of the inventory.

    - ``row``: its number in ``docs/verl_adaptations.md`` (stable: error messages and other docs cite it).
    - ``where``: where the code lives, and when it is applied.
    - ``targets``: the code of verl's or vLLM's it depends on, each pinned by its source's sha256 (empty for rows
      that replace nothing: a registration, a configuration workaround).
    - ``what`` / ``why``: what it does, and the problem in verl's (or vLLM's) code it answers.
    - ``applies_to``: the versions it was written and tested against.
    - ``proof``: the test(s) showing verl's original still needs it (``path::test`` node ids), or why there is none.
    """

    row: int
    section: Section
    where: str
    what: str
    why: str
    applies_to: str
    proof: str
    targets: tuple[Target, ...] = ()
