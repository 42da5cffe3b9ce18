"""Argument checks shared by the ops and the tools; every failure is a ToolInputError written for the model."""

from __future__ import annotations

import math
from typing import Any

from verl_mm_tools.errors import ToolInputError

_SHOW_LIMIT = 60


def show(value: object) -> str:
    """A short, safe repr of a received value (long or hostile values are cut)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int too large to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def kind_of(value: object) -> str:
    """The JSON-ish kind of a value, for messages ('a string', 'a list', ...)."""
    names = {bool: "a boolean", int: "an integer", str: "a string", list: "a list", tuple: "a list", dict: "an object"}
    if value is None:
        return "null"
    return names.get(type(value), f"a {type(value).__name__}")


def check_number(name: str, value: object, low: float, high: float) -> float:
    """``value`` as a finite float in ``[low, high]``; bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolInputError(f"{name} must be a number, got {show(value)} ({kind_of(value)})")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        raise ToolInputError(f"{name} must be a number, got NaN")
    if not low <= number <= high:
        raise ToolInputError(f"{name} must be between {low:g} and {high:g}, got {show(value)}")
    return number


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``; integral floats such as 3.0 are accepted, bools are refused."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolInputError(f"{name} must be a whole number, got {show(value)} ({kind_of(value)})")
    if not low <= value <= high:
        raise ToolInputError(f"{name} must be between {low} and {high}, got {show(value)}")
    return value


def check_quad(name: str, values: Any) -> tuple[Any, Any, Any, Any]:
    """Four values (x1, y1, x2, y2) unpacked from a sequence, or a ToolInputError."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != 4:
        raise ToolInputError(f"{name} must be four numbers (x1, y1, x2, y2), got {show(values)}")
    return tuple(values)
