"""Two import hooks that keep ``import verl_mm_tools`` (and so the CLI's parser) free of verl's ~5 s import.

verl imports our plugin (its ``verl.plugins`` entry point) while verl itself is being imported, and the plugin
imports our modules to register them. Had a user's ``import verl_mm_tools.rewards`` reached verl first, the plugin
would find that module half-initialised: an import cycle. ``import_first`` imports verl just before Python runs
the first of our modules that may need it, so none of ours is half-initialised when the plugin runs (what an
``import verl`` at the top of the package did, at a cost every light import paid).

``call_after_import`` runs a function right after a module's own code ran: verl's agent-loop registry is a plain
dict in a module that costs seconds to import, so the plugin fills it when something imports that module.

Both wrap the module's real loader for that one import (``_HookedLoader``) and put it back afterwards. One finder
serves every ``call_after_import`` (the verl fixes and the agent-loop registration), keyed by module name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Callable, Collection, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TypeGuard, cast

from verl_mm_tools.adaptations.record import Adaptation, Section

IMPORT_FIRST = Adaptation(
    section=Section.IMPORT_ORDER,
    what="imports verl just before the first of our modules that may need it (all but `LIGHT_MODULES`); installed "
    "by the package's `__init__.py`",
    why="verl imports our plugin inside `import verl`; had one of our modules imported verl first, the "
    "plugin would find it half-initialised (an import cycle). Keeps `import verl_mm_tools` and the "
    "CLI's parser free of verl's ~5 s import",
    applies_to="verl 0.9.1 (loads plugins in `verl/__init__.py`)",
    proof="the cycle, with a stand-in for verl: "
    "`tests/adaptations/test_import_order_on_cpu.py::test_import_first_breaks_the_plugin_import_cycle[False]`;"
    " that verl loads the plugin inside `import verl`: "
    "`tests/test_plugin_on_cpu.py::test_import_verl_registers_mm_tool_through_the_installed_entry_point`."
    " None on verl itself without the hook",
)
CALL_AFTER_IMPORT = Adaptation(
    section=Section.IMPORT_ORDER,
    what="runs a function right after a verl module's code ran: fills each of verl's registries (agent loops, "
    "reward managers, advantage estimators, checkpoint engines, rollouts) and applies the verl fixes "
    "(`adaptations/fixes/`) and the CPU patches (`adaptations/cpu/`) only when verl imports that module",
    why="every process that imports verl loads the plugin; importing those modules at its load made every "
    "`import verl` load 1,323 more modules (vLLM and torch's inductor through verl's checkpoint engines, "
    "verl's reward loop and worker configs): ~2.5 s and ~100 MiB per process",
    applies_to="any",
    proof="none (a start-up cost, not a bug); that `import verl` loads none of verl's modules more: "
    "`tests/test_plugin_on_cpu.py::test_the_plugin_adds_only_its_own_modules_to_import_verl`",
)


class _HookedLoader(importlib.abc.Loader):
    """The real loader, plus ``before()`` (runs before the module exists) and ``after(module)`` (after its code)."""

    def __init__(
        self,
        loader: importlib.abc.Loader,
        before: Callable[[], None] | None = None,
        after: Callable[[ModuleType], None] | None = None,
    ) -> None:
        self.loader, self.before, self.after = loader, before, after
        self.imported_by_before: ModuleType | None = None
        self.own_spec: ModuleSpec | None = None

    # get_code, get_source, get_resource_reader, ...: the real loader's (runpy uses them)
    def __getattr__(self, name: str) -> object:
        if name == "loader":  # not set yet (a copy in the making): no endless recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        if self.before is not None:
            self.before()
            # before() (importing verl, which loads our plugin) may have imported this very module: reuse it rather
            # than run its code a second time
            self.imported_by_before = sys.modules.get(spec.name)
            if self.imported_by_before is not None:
                self.own_spec = self.imported_by_before.__spec__
                return self.imported_by_before
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = cast(ModuleSpec, module.__spec__)  # the import system set it before calling exec_module
        spec.loader = module.__loader__ = self.loader  # the wrapper was for this one import only
        if module is self.imported_by_before:
            module.__spec__ = self.own_spec
            return
        self.loader.exec_module(module)
        if self.after is not None:
            self.after(module)


def _spec_from_other_finders(
    finder: importlib.abc.MetaPathFinder, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    for other in sys.meta_path:
        if other is not finder and hasattr(other, "find_spec"):
            spec = other.find_spec(fullname, path, target)
            if spec is not None:
                return spec
    return None


def _hookable(loader: object) -> TypeGuard[importlib.abc.Loader]:
    return loader is not None and hasattr(loader, "exec_module")


class _ImportFirst(importlib.abc.MetaPathFinder):
    """Hooks the loader of each module ``wants(name)`` selects with ``before``."""

    def __init__(self, wants: Callable[[str], bool], before: Callable[[], None]) -> None:
        self.wants, self.before = wants, before

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not self.wants(fullname):
            return None
        spec = _spec_from_other_finders(self, fullname, path, target)
        if spec is not None and _hookable(spec.loader):
            spec.loader = _HookedLoader(spec.loader, before=self.before)
        return spec


class _AfterImport(importlib.abc.MetaPathFinder):
    """One finder for every ``call_after_import``: the callbacks of each module not imported yet, in order."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.pending or fullname in sys.modules:
            return None
        spec = _spec_from_other_finders(self, fullname, path, target)
        if spec is not None and _hookable(spec.loader):
            spec.loader = _HookedLoader(spec.loader, after=lambda module: self.run(fullname, module))
        return spec

    def run(self, name: str, module: ModuleType) -> None:
        for callback in self.pending.pop(name, []):
            callback(module)


_AFTER_IMPORT = _AfterImport()


@IMPORT_FIRST.implements
def import_first(dependency: str, package: str, light: Collection[str]) -> None:
    """Import ``dependency`` (verl) before running any module of ``package`` except the ``light`` ones, which must
    never import it, directly or not (tests/test_cli_on_cpu.py checks the CLI's)."""

    def wants(name: str) -> bool:
        return name.startswith(package + ".") and name not in light and dependency not in sys.modules

    def import_dependency() -> None:
        importlib.import_module(dependency)  # verl's plugin loader imports our plugin, which registers us

    sys.meta_path.insert(0, _ImportFirst(wants, import_dependency))


@CALL_AFTER_IMPORT.implements
def call_after_import(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` right after ``module_name``'s code ran; at once if it is imported already."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    _AFTER_IMPORT.pending.setdefault(module_name, []).append(callback)
    if _AFTER_IMPORT not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER_IMPORT)
