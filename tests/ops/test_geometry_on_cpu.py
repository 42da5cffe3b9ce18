"""Boxes, segments, sizes and argument checks of verl_mm_tools.ops."""

import math
import re

import pytest
from PIL import Image

from verl_mm_tools.errors import ToolInputError
from verl_mm_tools.ops import MAX_COORDINATE, MIN_MAX_PIXELS, clip_box, clip_segment, fit_pixels, scaled_size
from verl_mm_tools.ops.argument_checks import check_int, check_number, show

W, H = 64, 48


@pytest.mark.parametrize(
    ("box", "expected"),
    [
        ((0, 0, 64, 48), (0, 0, 64, 48)),
        ((8, 4, 24, 20), (8, 4, 24, 20)),
        ([8, 4, 24, 20], (8, 4, 24, 20)),
        ((0.5, 0.5, 30.2, 30.7), (0, 0, 31, 31)),  # rounded outward
        ((-10, -5, 20, 20), (0, 0, 20, 20)),  # clipped
        ((50, 40, 1000, 1000), (50, 40, 64, 48)),
        ((-1e6, -1e6, 1e6, 1e6), (0, 0, 64, 48)),
        ((63.5, 47.5, 64, 48), (63, 47, 64, 48)),
    ],
)
def test_clip_box(box, expected):
    assert clip_box(box, W, H) == expected


@pytest.mark.parametrize(
    ("box", "message"),
    [
        ((10, 10, 10, 20), "x2 must be greater than x1"),
        ((30, 10, 10, 20), "x2 must be greater than x1"),
        ((10, 20, 30, 20), "y2 must be greater than y1"),
        ((64, 0, 70, 10), "lies outside the image, which is 64x48 px"),
        ((-20, -20, 0, 0), "lies outside the image"),
        ((0, 48, 10, 60), "lies outside the image"),
        ((0, 0, 10), "box must be four numbers"),
        ("0, 0, 10, 10", "box must be four numbers"),
        (None, "box must be four numbers"),
        ((0, 0, math.nan, 10), "x2 must be a number, got NaN"),
        ((0, 0, math.inf, 10), "x2 must be between -1e+06 and 1e+06, got inf"),
        ((0, 0, 10**400, 10), "x2 must be between"),
        ((0, 0, "10", 10), "x2 must be a number, got '10' (a string)"),
        ((0, True, 10, 10), "y1 must be a number, got True (a boolean)"),
        ((0, 0, [10], 10), "x2 must be a number, got [10] (a list)"),
        ((0, 0, MAX_COORDINATE + 1, 10), "x2 must be between"),
    ],
)
def test_clip_box_refusals(box, message):
    with pytest.raises(ToolInputError, match=re.escape(message)):
        clip_box(box, W, H)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ((5, 10, 20, 10), (5, 10, 20, 10)),
        ((-10, 10, 100, 10), (0, 10, 63, 10)),
        ((10, -10, 10, 100), (10, 0, 10, 47)),
        ((-10, -10, 100, 100), (0, 0, 47, 47)),
        ((100, 100, -10, -10), (47, 47, 0, 0)),
        ((0, 0, 63, 47), (0, 0, 63, 47)),
    ],
)
def test_clip_segment(line, expected):
    assert clip_segment(line, W, H) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ((5, 5, 5, 5), "two different end points"),
        ((-10, -10, -1, -1), "line .* lies outside the image"),
        ((64, 0, 80, 10), "lies outside the image"),
        ((0, 48, 63, 48), "lies outside the image"),
        ((70, -10, 100, 100), "lies outside the image"),
        ((0, 0, math.nan, 1), "x2 must be a number, got NaN"),
    ],
)
def test_clip_segment_refusals(line, message):
    with pytest.raises(ToolInputError, match=message):
        clip_segment(line, W, H)


@pytest.mark.parametrize(
    ("size", "scale", "max_pixels", "expected"),
    [
        ((64, 48), 1.0, 10_000, (64, 48)),
        ((16, 16), 14.0, 10**6, (224, 224)),
        ((64, 48), 100.0, 64 * 48 * 4, (128, 96)),
        ((2800, 56), 1.0, MIN_MAX_PIXELS, (1400, 28)),
        ((1, 1), 0.001, 100, (1, 1)),
        ((100_000, 1), 1.0, 4, (4, 1)),
    ],
)
def test_scaled_size(size, scale, max_pixels, expected):
    assert scaled_size(*size, scale, max_pixels) == expected


def test_scaled_size_refuses_zero_budget():
    with pytest.raises(ValueError, match="max_pixels must be at least 1, got 0"):
        scaled_size(10, 10, 1.0, 0)


def test_fit_pixels_keeps_small_images_and_shrinks_large_ones():
    image = Image.new("RGB", (64, 48))
    assert fit_pixels(image, 64 * 48) is image
    assert fit_pixels(image, 64 * 48 // 4).size == (32, 24)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1.0), (2.5, 2.5), (-360, -360.0), (360.0, 360.0)],
)
def test_check_number_accepts(value, expected):
    assert check_number("degrees", value, -360, 360) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "degrees must be a number, got True (a boolean)"),
        ("90", "degrees must be a number, got '90' (a string)"),
        (None, "degrees must be a number, got None (null)"),
        ({"a": 1}, "degrees must be a number, got {'a': 1} (an object)"),
        (math.nan, "degrees must be a number, got NaN"),
        (720, "degrees must be between -360 and 360, got 720"),
        (-math.inf, "degrees must be between -360 and 360, got -inf"),
    ],
)
def test_check_number_refuses(value, message):
    with pytest.raises(ToolInputError) as error:
        check_number("degrees", value, -360, 360)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), (3.0, 3), (32, 32)],
)
def test_check_int_accepts(value, expected):
    assert check_int("width", value, 1, 32) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "width must be a whole number, got True (a boolean)"),
        (2.5, "width must be a whole number, got 2.5 (a float)"),
        (0, "width must be between 1 and 32, got 0"),
        pytest.param(10**5000, "width must be between 1 and 32, got <int>", id="unprintably-huge"),
    ],
)
def test_check_int_refuses(value, message):
    with pytest.raises(ToolInputError) as error:
        check_int("width", value, 1, 32)
    assert str(error.value) == message


def test_show_cuts_long_values():
    assert show("x" * 200) == "'" + "x" * 56 + "..."
    assert len(show(list(range(1000)))) == 60
