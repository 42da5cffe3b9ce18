"""The record every adaptation declares: what of verl's (or vLLM's) code it relies on, pinned by the sha256 of that
code's source, what it does and why, the versions it applies to, and the test that proves it is still needed.

``docs/verl_adaptations.md`` is generated from these records (``inventory.py``); ``guard.py`` checks the hashes before
anything is patched. Must import without verl and torch: the vLLM plugin declares its records in every vLLM process.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

VERL = "verl 0.9.1"
ROOT = Path(__file__).resolve().parents[2]  # the repository (or site-packages) holding verl_mm_tools
_Code = TypeVar("_Code", bound=Callable[..., object])  # a class or a function
_Replacement = TypeVar("_Replacement", bound=Callable[..., Any])
_Installer = TypeVar("_Installer", bound=Callable[..., None])


class Section(Enum):
    """The inventory's tables, in the order the document shows them (the value is the table's heading)."""

    REPLACEMENTS = "Replacements of verl's (and vLLM's) code"
    SUBCLASS_FIXES = "Fixes by subclass"
    IMPORT_ORDER = "Import order and plugin loading"
    PRIVATE_STATE = "Registrations that reach into verl's private state (they stay with what they register)"
    EXTENSIONS = "Extension-point subclasses and copied methods (they stay where they are)"
    CONFIGURATION = "Configuration and packaging workarounds"


@dataclass(frozen=True)
class CodeLocation:
    """Where a piece of an adaptation's code is: its file (from ``ROOT``), name and first and last lines."""

    path: str
    name: str
    first_line: int
    last_line: int

    @classmethod
    def of(cls, code: Callable[..., object]) -> CodeLocation:
        source = inspect.getsourcefile(code)
        lines, first = inspect.getsourcelines(code)
        path = Path(source or "?").resolve()
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        name = getattr(code, "__qualname__", repr(code))
        return cls(shown.as_posix(), name, first, first + len(lines) - 1)

    def __str__(self) -> str:
        return f"{self.path}:{self.first_line}-{self.last_line} ({self.name})"


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


Replacement = Callable[..., Any]  # called as ``replacement(original, *args, **kwargs)`` in the target's place
Installer = Callable[..., None]  # called with the checked targets' objects, in the record's order


@dataclass(frozen=True)
class Adaptation:
    """One row of the inventory, declared beside the code it describes.

    - ``section``: the inventory's table.
    - ``targets``: the code of verl's or vLLM's it depends on, each pinned by its source's sha256 (empty for rows
      that replace nothing: a registration, a configuration workaround).
    - ``what`` / ``why``: what it does, and the problem in verl's (or vLLM's) code it answers.
    - ``applies_to``: the versions it was written and tested against.
    - ``proof``: the test(s) showing verl's original still needs it (``path::test`` node ids), or why there is none.
    - ``files``: code outside the package's modules it lives in (``setup.py``), from the repository's root.

    Derived, never typed: where it lives (``code``: the functions and classes that carry it, added by the decorators
    ``implements``, ``replaces`` and ``installs`` where they are defined: their module, name and lines) and its row
    (its place in ``registry.ADAPTATIONS``). ``guard.apply`` is the one way a replacement is installed.
    """

    section: Section
    what: str
    why: str
    applies_to: str
    proof: str
    targets: tuple[Target, ...] = ()
    files: tuple[str, ...] = ()
    code: list[Callable[..., object]] = field(default_factory=list, compare=False, repr=False)
    replacements: dict[Target, Replacement] = field(default_factory=dict, compare=False, repr=False)
    installers: list[Installer] = field(default_factory=list, compare=False, repr=False)

    def implements(self, code: _Code) -> _Code:
        """Decorator: ``code`` (a class or function) carries this adaptation."""
        if code not in self.code:  # a replacement of two targets is one piece of code
            self.code.append(code)
        return code

    def replaces(self, target: Target) -> Callable[[_Replacement], _Replacement]:
        """Decorator: the function replaces ``target`` (one of ``targets``); it takes the original first."""
        if target not in self.targets:
            raise ValueError(f"{target.qualname} is not one of this adaptation's targets: {self.targets}")

        def register(replacement: _Replacement) -> _Replacement:
            self.replacements[target] = replacement
            return self.implements(replacement)

        return register

    def installs(self, installer: _Installer) -> _Installer:
        """Decorator: the function installs this adaptation otherwise than by replacing its targets (a class, a
        table entry, a logger), given the checked targets' objects."""
        self.installers.append(installer)
        return self.implements(installer)

    def locations(self) -> list[CodeLocation]:
        return [CodeLocation.of(code) for code in self.code]

    @property
    def origin(self) -> str:
        """Where its code is, for messages: its first code's file, lines and name, or its first file."""
        if self.code:
            return str(CodeLocation.of(self.code[0]))
        return self.files[0] if self.files else "(no code declared)"
