"""What GUI environments and tools share: the exact map from a shown screenshot to the page, and the checks on
model-written points, text and keys."""

from __future__ import annotations

import pytest
from PIL import Image

from verl_mm_tools.envs.gui.screen import (
    MAX_TYPED_CHARS,
    SCREEN_INFO_KEY,
    checked_key,
    checked_text,
    mark_screenshot,
    page_point,
    shown_size,
)
from verl_mm_tools.errors import ToolInputError


@pytest.mark.parametrize(
    ("point", "shown", "page", "expected"),
    [
        ((84, 112), (168, 224), (160, 210), (80.0, 105.0)),  # the tiny Qwen's sizing of a MiniWoB page
        ((0, 0), (168, 224), (160, 210), (0.0, 0.0)),
        ((167, 223), (168, 224), (160, 210), (167 * 160 / 168, 223 * 210 / 224)),
        ((10.5, 20.25), (160, 210), (160, 210), (10.5, 20.25)),  # shown at the page's size: the identity
        ((40, 30), (80, 60), (1280, 960), (640.0, 480.0)),  # a screenshot downscaled 16x by the image budget
    ],
)
def test_a_shown_point_maps_to_the_page_by_the_ratio_of_sizes(point, shown, page, expected):
    assert page_point(*point, shown, page) == expected


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (168, 10, r"the point \(168, 10\) is off the screenshot, which is 168x224 px: x must be in \[0, 168\)"),
        (-1, 10, r"off the screenshot"),
        (10, 224, r"and y in \[0, 224\)"),
        ("10", 10, r"x must be a number of pixels, got '10'"),
        (10, None, r"y must be a number of pixels, got None"),
        (True, 10, r"x must be a number of pixels, got True"),
        (float("nan"), 10, r"x must be a number of pixels, got nan"),
        (10, float("inf"), r"y must be a number of pixels, got inf"),
    ],
)
def test_a_bad_point_is_refused_with_the_screenshot_size(x, y, message):
    with pytest.raises(ToolInputError, match=message):
        page_point(x, y, (168, 224), (160, 210))


def test_text_and_keys_are_checked():
    assert checked_text("Jerald 42!") == "Jerald 42!"
    with pytest.raises(ToolInputError, match=f"at most {MAX_TYPED_CHARS} characters, got 100000"):
        checked_text("a" * 100_000)
    with pytest.raises(ToolInputError, match="printable characters only"):
        checked_text("line\nbreak")
    with pytest.raises(ToolInputError, match="text must be a string, got int"):
        checked_text(42)
    named = ("Enter", "Tab")
    assert [checked_key(key, named) for key in ("a", "Enter", "7")] == ["a", "Enter", "7"]
    for bad in ("F13", "", "ab", "\n", None, 5):
        with pytest.raises(ToolInputError, match=r"unknown key .*one printable character or one of \['Enter', 'Tab'\]"):
            checked_key(bad, named)


def test_the_latest_screenshot_of_a_screen_is_found_through_resizes():
    page = mark_screenshot(Image.new("RGB", (160, 210)), "screen-a")
    shown = page.resize((168, 224))  # how the loop sizes it for the processor: PIL keeps info
    other = mark_screenshot(Image.new("RGB", (50, 50)), "screen-b")
    assert shown.info[SCREEN_INFO_KEY] == "screen-a"
    assert shown_size([page, shown, other, Image.new("RGB", (9, 9))], "screen-a") == (168, 224)
    assert shown_size([other], "screen-b") == (50, 50)
    with pytest.raises(ToolInputError, match="no screenshot of the page is in the conversation"):
        shown_size([other, Image.new("RGB", (9, 9))], "screen-a")
