"""What a GUI environment and its tools share: the actions on a screen, what an action gives back, and how a point
on the screenshot the model was shown maps to the page. No verl, no browser import.

A GUI environment (``ScreenEnvironment``) shows screenshots; the GUI tools (``verl_mm_tools.tools.gui_tools``) act on
it with ``act``. Coordinates are pixels of the latest screenshot in the conversation as the model saw it: the
loop sizes every image as the processor does (and the image budget may downscale it), so a screenshot of a 160x210
px page may be shown at 168x224. ``page_point`` maps such a point back to the page exactly, by the ratio of the two
sizes. Each screenshot carries its environment's screen token in ``image.info`` (PIL keeps ``info`` through
resizes and conversions), so the tool finds the latest screenshot of its own screen among the conversation's images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image

from verl_mm_tools.errors import ToolInputError

SCREEN_INFO_KEY = "vmt_screen"  # image.info key holding the screen token of the environment that took it
MAX_TYPED_CHARS = 200  # a longer text is refused, not typed: a model's runaway string never reaches the page
SCROLL_DIRECTIONS = ("up", "down")


@dataclass(frozen=True)
class Click:
    x: float  # in the shown screenshot's pixels
    y: float


@dataclass(frozen=True)
class TypeText:
    text: str  # typed into the focused element, key by key


@dataclass(frozen=True)
class PressKey:
    key: str  # a printable character or a named key (``ScreenEnvironment.keys``)


@dataclass(frozen=True)
class Scroll:
    x: float
    y: float
    direction: str  # "up" or "down"


ScreenAction = Click | TypeText | PressKey | Scroll


@dataclass(frozen=True)
class ActionResult:
    """What one action did: the new screenshot (None once the episode is over), the environment's reward for it,
    whether the episode ended, and what the environment reports (JSON)."""

    screenshot: Image.Image | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ScreenEnvironment(Protocol):
    """An environment the GUI tools can act on."""

    screen_token: str  # marks this environment's screenshots (``SCREEN_INFO_KEY``)
    page_size: tuple[int, int]  # the page's screenshot size in CSS pixels, before any resize
    keys: tuple[str, ...]  # the named keys ``PressKey`` accepts besides printable characters

    async def act(self, action: ScreenAction) -> ActionResult: ...


def mark_screenshot(image: Image.Image, token: str) -> Image.Image:
    """``image`` marked as a screenshot of the screen ``token``."""
    image.info[SCREEN_INFO_KEY] = token
    return image


def shown_size(images: Sequence[Image.Image], token: str) -> tuple[int, int]:
    """The size of the latest screenshot of the screen ``token`` among the conversation's images, as shown to the
    model; ToolInputError when none was shown (the image budget refused them all)."""
    for image in reversed(images):
        if image.info.get(SCREEN_INFO_KEY) == token:
            return image.size
    raise ToolInputError("no screenshot of the page is in the conversation (the image budget refused them)")


def page_point(x: object, y: object, shown: tuple[int, int], page: tuple[int, int]) -> tuple[float, float]:
    """The page point under pixel (x, y) of a screenshot shown at ``shown`` (width, height) of a page of size
    ``page``: each coordinate scaled by page/shown. ToolInputError for a point that is not a finite number or lies
    off the shown screenshot, naming its size."""
    width, height = shown
    for name, value, limit in (("x", x, width), ("y", y, height)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ToolInputError(f"{name} must be a number of pixels, got {value!r}")
        if not 0 <= value < limit:
            raise ToolInputError(
                f"the point ({x}, {y}) is off the screenshot, which is {width}x{height} px: x must be in "
                f"[0, {width}) and y in [0, {height})"
            )
    assert isinstance(x, (int, float)) and isinstance(y, (int, float))  # checked above
    return x * page[0] / width, y * page[1] / height


def checked_text(text: object) -> str:
    """Text to type: a string of at most ``MAX_TYPED_CHARS`` printable characters."""
    if not isinstance(text, str):
        raise ToolInputError(f"text must be a string, got {type(text).__name__}")
    if len(text) > MAX_TYPED_CHARS:
        raise ToolInputError(f"text may have at most {MAX_TYPED_CHARS} characters, got {len(text)}")
    if not text.isprintable():
        raise ToolInputError("text may hold printable characters only; press named keys (Enter, Tab) with press")
    return text


def checked_key(key: object, named: Sequence[str]) -> str:
    """A key to press: one printable character, or one of the ``named`` keys."""
    if isinstance(key, str) and ((len(key) == 1 and key.isprintable()) or key in named):
        return key
    shown = repr(key)[:40]
    raise ToolInputError(f"unknown key {shown}; press one printable character or one of {list(named)}")
