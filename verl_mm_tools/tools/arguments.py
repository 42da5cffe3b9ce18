"""Checks a model's tool-call arguments against the signature of a tool's schema function.

Supported annotations: ``int``, ``float``, ``str``, ``bool``, ``Literal[...]`` and any of them ``| None``.
``None`` for a parameter with a default means "use the default". Every failure is a ``ToolInputError`` that says
what was wrong, what was received and what is allowed.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from verl_mm_tools.errors import ToolInputError, did_you_mean
from verl_mm_tools.ops.argument_checks import check_int, kind_of, show

_JSON_KIND = {int: "integer", float: "number", str: "string", bool: "boolean"}


@dataclass(frozen=True)
class Parameter:
    """One argument of a tool: its JSON kind, allowed literal values, and default (``inspect._empty``: required)."""

    name: str
    kind: type
    choices: tuple[object, ...] | None
    default: object

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty

    def describe(self) -> str:
        kind = "one of " + ", ".join(repr(c) for c in self.choices) if self.choices else _JSON_KIND[self.kind]
        return f"{self.name} ({kind}, {'required' if self.required else 'optional'})"

    def check(self, value: object) -> object:
        """``value`` converted to the parameter's kind, or a ToolInputError."""
        if self.choices is not None:
            return _check_choice(self.name, value, self.choices)
        if self.kind is float:
            return _check_float(self.name, value)
        if self.kind is int:
            return check_int(self.name, value, -(2**63), 2**63 - 1)
        if not isinstance(value, self.kind) or (self.kind is not bool and isinstance(value, bool)):
            raise ToolInputError(f"{self.name} must be {_article(self.kind)}, got {show(value)} ({kind_of(value)})")
        return value


def _article(kind: type) -> str:
    return {str: "a string", bool: "true or false"}.get(kind, _JSON_KIND.get(kind, kind.__name__))


def _check_float(name: str, value: object) -> int | float:
    """``value`` itself when it is a finite int or float (ints stay ints, so messages print them as given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolInputError(f"{name} must be a number, got {show(value)} ({kind_of(value)})")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        raise ToolInputError(f"{name} is far too large, got {show(value)}") from None
    if not finite:
        raise ToolInputError(f"{name} must be a finite number, got {show(value)}")
    return value


def _check_choice(name: str, value: object, choices: tuple[object, ...]) -> object:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool) and value in choices:
        return value
    hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
    raise ToolInputError(f"{name} must be one of {list(choices)}, got {show(value)}.{hint}")


def _unwrap(name: str, annotation: Any) -> tuple[type, tuple[object, ...] | None]:
    """(kind, literal choices) of an annotation, ``| None`` removed."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"parameter {name!r}: only 'X | None' unions are supported, got {annotation}")
        annotation = inner[0]
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    if annotation not in _JSON_KIND:
        raise TypeError(f"parameter {name!r}: unsupported annotation {annotation}; use int, float, str, bool, Literal")
    return annotation, None


class ArgumentSpec:
    """The parameters of a schema function, and ``parse`` for a model's argument dict."""

    def __init__(self, fn: Callable[..., object]):
        hints = typing.get_type_hints(fn)
        self.name = fn.__name__
        self.parameters: dict[str, Parameter] = {}
        for name, param in inspect.signature(fn).parameters.items():
            if name not in hints:
                raise TypeError(f"{fn.__qualname__}: parameter {name!r} needs a type annotation")
            kind, choices = _unwrap(name, hints[name])
            self.parameters[name] = Parameter(name, kind, choices, param.default)

    def summary(self) -> str:
        return f"{self.name} takes: " + ", ".join(p.describe() for p in self.parameters.values())

    def parse(self, arguments: object) -> dict[str, Any]:
        """Checked arguments with defaults filled in."""
        if not isinstance(arguments, Mapping):
            raise ToolInputError(f"the arguments must be a JSON object, got {show(arguments)}; {self.summary()}")
        for name in arguments:
            if name not in self.parameters:
                hint = did_you_mean(str(name), self.parameters)
                raise ToolInputError(f"unknown argument {show(name)}.{hint} {self.summary()}")
        parsed: dict[str, Any] = {}  # the checked JSON values, each of its parameter's kind
        for name, parameter in self.parameters.items():
            value = arguments.get(name)
            if value is None and parameter.required:
                raise ToolInputError(f"missing required argument {name!r}; {self.summary()}")
            parsed[name] = parameter.default if value is None else parameter.check(value)
        return parsed
