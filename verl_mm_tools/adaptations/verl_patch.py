"""Replacing a verl function safely: check it still looks the way the replacement assumes (fail loudly when verl
changed), then put the replacement wherever verl's modules bound the original by name. Used by every replacement in
this package: the verl fixes every run gets (``verl_fixes``), the CPU run's patches (``cpu_patches``), the tool
loader's ``remote:`` key (``tool_loader``) and the vLLM plugin (``vllm_cpu_weights``, on a vLLM method).

Must import without verl and torch: the vLLM plugin uses it in every vLLM engine process."""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Callable

from verl_mm_tools.errors import PluginRegistrationError

logger = logging.getLogger(__name__)

PATCHED_MARK = "__verl_mm_tools_patched__"


class VerlChangedError(PluginRegistrationError):
    """A verl function verl-mm-tools replaces no longer looks the way the replacement assumes."""


def checked_original(
    module_name: str, function_name: str, expected_source: str, parameters: tuple[str, ...], owner: str
) -> Callable | None:
    """verl's function, checked: it must still have ``parameters`` and contain ``expected_source``. None when it is
    already replaced (the plugin module can be imported twice). ``owner`` names the file holding the replacement."""
    function = getattr(importlib.import_module(module_name), function_name)
    return _checked(function, f"{module_name}.{function_name}", expected_source, parameters, owner)


def _checked(
    function: Callable,
    name: str,
    expected_source: str,
    parameters: tuple[str, ...],
    owner: str,
    supported: str = "verl==0.9.1",
) -> Callable | None:
    if getattr(function, PATCHED_MARK, False):
        return None
    found = tuple(inspect.signature(function).parameters)
    if found != parameters or expected_source not in inspect.getsource(function):
        raise VerlChangedError(
            f"verl-mm-tools replaces {name} ({owner}), but it changed in this version: expected parameters "
            f"{parameters} and the line {expected_source!r}, found parameters {found}. verl-mm-tools supports "
            f"{supported}; install it or update {owner}."
        )
    return function


def install(module_name: str, function_name: str, original: Callable, replacement: Callable) -> None:
    """Put ``replacement`` wherever verl's modules hold ``original`` under ``function_name``."""
    setattr(replacement, PATCHED_MARK, True)
    for name, module in list(sys.modules.items()):
        if (name == module_name or name.startswith("verl.")) and getattr(module, function_name, None) is original:
            setattr(module, function_name, replacement)
    logger.debug("replaced %s.%s", module_name, function_name)


def checked_method(
    module_name: str,
    class_name: str,
    method_name: str,
    expected_source: str,
    parameters: tuple[str, ...],
    owner: str,
    supported: str = "verl==0.9.1",
) -> Callable | None:
    """``checked_original`` for a method of a class (of verl's, or of the ``supported`` package's)."""
    method = getattr(importlib.import_module(module_name), class_name).__dict__[method_name]
    return _checked(method, f"{module_name}.{class_name}.{method_name}", expected_source, parameters, owner, supported)


def install_method(module_name: str, class_name: str, method_name: str, replacement: Callable) -> None:
    setattr(replacement, PATCHED_MARK, True)
    setattr(getattr(importlib.import_module(module_name), class_name), method_name, replacement)
    logger.debug("replaced %s.%s.%s", module_name, class_name, method_name)
