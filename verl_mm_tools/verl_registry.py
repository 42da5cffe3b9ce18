"""Register components into verl's registries without ever silently replacing someone else's entry, each when verl
imports the module that holds the registry (``when_imported``): the plugin loads in every process that imports verl,
and most of those processes never read most registries."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Hashable, MutableMapping
from types import ModuleType
from typing import Any

from verl_mm_tools.adaptations.import_order import call_after_import
from verl_mm_tools.errors import PluginRegistrationError

logger = logging.getLogger(__name__)


def qualified_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _describe(entry: object) -> str:
    if isinstance(entry, type) or callable(entry) and hasattr(entry, "__qualname__"):
        return qualified_name(entry)
    if isinstance(entry, MutableMapping) and "_target_" in entry:
        return str(entry["_target_"])
    return repr(entry)


def register_unique(registry: MutableMapping, name: Hashable, entry: object, kind: str) -> None:
    """Put ``entry`` under ``name`` unless another package already owns that name.

    Re-registering the very same entry is a no-op (the plugin module may be imported twice: once by verl's
    entry-point loader, once directly).
    """
    existing = registry.get(name)
    if existing is not None and _describe(existing) != _describe(entry):
        raise PluginRegistrationError(
            f"verl-mm-tools cannot register {kind} {name!r} as {_describe(entry)}: that name is already registered "
            f"by {_describe(existing)}. Uninstall the other package, or select ours explicitly under another name."
        )
    registry[name] = entry
    logger.debug("registered %s %r -> %s", kind, name, _describe(entry))


def when_imported(module_name: str, register: Callable[[ModuleType], None], what: str) -> None:
    """``register(module)`` once verl's ``module_name`` is imported: at once, raising its errors, where it is imported
    already; else right after its code runs, where a failure is logged at ERROR with its traceback and verl's module
    stays usable without ``what``."""
    if module_name in sys.modules:
        register(sys.modules[module_name])
        return

    def register_or_report(module: ModuleType) -> None:
        try:
            register(module)
        except Exception:
            logger.error(
                "verl-mm-tools failed to register its %s with verl; they are NOT available. Traceback:",
                what,
                exc_info=True,
            )

    call_after_import(module_name, register_or_report)
