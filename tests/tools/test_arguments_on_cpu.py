"""ArgumentSpec: a schema function's signature checks a model's argument dict."""

import math
from typing import Literal

import pytest

from verl_mm_tools.errors import ToolInputError
from verl_mm_tools.tools.arguments import ArgumentSpec


def paint(
    x: float,
    mode: Literal["fill", "outline"],
    count: int = 2,
    label: str | None = None,
    bold: bool = False,
    image_id: int | None = None,
):
    """Schema function used by these tests."""


SPEC = ArgumentSpec(paint)
DEFAULTS = {"count": 2, "label": None, "bold": False, "image_id": None}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"x": 1.5, "mode": "fill"}, {"x": 1.5, "mode": "fill"}),
        ({"x": 3, "mode": "outline"}, {"x": 3, "mode": "outline"}),
        ({"x": 0, "mode": "fill", "count": 5.0}, {"x": 0, "mode": "fill", "count": 5}),
        ({"x": 0, "mode": "fill", "count": None, "label": None}, {"x": 0, "mode": "fill"}),
        (
            {"x": 0, "mode": "fill", "label": "cat", "bold": True},
            {"x": 0, "mode": "fill", "label": "cat", "bold": True},
        ),
        ({"x": 0, "mode": "fill", "image_id": 2}, {"x": 0, "mode": "fill", "image_id": 2}),
    ],
)
def test_valid_arguments_get_defaults(arguments, expected):
    assert SPEC.parse(arguments) == {**DEFAULTS, **expected}


SUMMARY = (
    "paint takes: x (number, required), mode (one of 'fill', 'outline', required), count (integer, optional), "
    "label (string, optional), bold (boolean, optional), image_id (integer, optional)"
)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"mode": "fill"}, f"missing required argument 'x'; {SUMMARY}"),
        ({"x": None, "mode": "fill"}, f"missing required argument 'x'; {SUMMARY}"),
        ({"x": 1, "mode": "fill", "y": 2}, f"unknown argument 'y'. {SUMMARY}"),
        ({"x": 1, "mode": "fill", "cout": 2}, f"unknown argument 'cout'. Did you mean 'count'? {SUMMARY}"),
        ({"x": "1", "mode": "fill"}, "x must be a number, got '1' (a string)"),
        ({"x": True, "mode": "fill"}, "x must be a number, got True (a boolean)"),
        ({"x": [1], "mode": "fill"}, "x must be a number, got [1] (a list)"),
        ({"x": {"v": 1}, "mode": "fill"}, "x must be a number, got {'v': 1} (an object)"),
        ({"x": math.nan, "mode": "fill"}, "x must be a finite number, got nan"),
        ({"x": -math.inf, "mode": "fill"}, "x must be a finite number, got -inf"),
        ({"x": 10**400, "mode": "fill"}, "x is far too large, got 1" + "0" * 56 + "..."),
        ({"x": 1, "mode": "fil"}, "mode must be one of ['fill', 'outline'], got 'fil'. Did you mean 'fill'?"),
        ({"x": 1, "mode": 1}, "mode must be one of ['fill', 'outline'], got 1."),
        ({"x": 1, "mode": ["fill"]}, "mode must be one of ['fill', 'outline'], got ['fill']."),
        ({"x": 1, "mode": "fill", "count": 1.5}, "count must be a whole number, got 1.5 (a float)"),
        ({"x": 1, "mode": "fill", "count": False}, "count must be a whole number, got False (a boolean)"),
        ({"x": 1, "mode": "fill", "label": 7}, "label must be a string, got 7 (an integer)"),
        ({"x": 1, "mode": "fill", "bold": "yes"}, "bold must be true or false, got 'yes' (a string)"),
        ({"x": 1, "mode": "fill", "bold": 1}, "bold must be true or false, got 1 (an integer)"),
        ({"x": 1, "mode": "fill", "image_id": "2"}, "image_id must be a whole number, got '2' (a string)"),
        ([1, 2], f"the arguments must be a JSON object, got [1, 2]; {SUMMARY}"),
        (None, f"the arguments must be a JSON object, got None; {SUMMARY}"),
    ],
)
def test_invalid_arguments_are_explained(arguments, message):
    with pytest.raises(ToolInputError) as error:
        SPEC.parse(arguments)
    assert str(error.value) == message


def test_unsupported_annotations_fail_at_definition():
    def bad(points: list[float]):
        """Bad."""

    def untyped(x):
        """Untyped."""

    with pytest.raises(TypeError, match="unsupported annotation"):
        ArgumentSpec(bad)
    with pytest.raises(TypeError, match="needs a type annotation"):
        ArgumentSpec(untyped)
