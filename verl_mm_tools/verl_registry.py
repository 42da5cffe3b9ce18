"""Register components into verl's registries without ever silently replacing someone else's entry."""

from __future__ import annotations

import logging
from collections.abc import Hashable, MutableMapping
from typing import Any

from verl_mm_tools.errors import PluginRegistrationError

logger = logging.getLogger(__name__)


def qualified_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _describe(entry: Any) -> str:
    if isinstance(entry, type) or callable(entry) and hasattr(entry, "__qualname__"):
        return qualified_name(entry)
    if isinstance(entry, MutableMapping) and "_target_" in entry:
        return str(entry["_target_"])
    return repr(entry)


def register_unique(registry: MutableMapping, name: Hashable, entry: Any, kind: str) -> None:
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
