"""Drawing ops: a bounding box with an optional label, a line. Conventions: see ``verl_mm_tools.ops``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal, get_args

from PIL import Image, ImageDraw, ImageFont

from verl_mm_tools.errors import ToolInputError, did_you_mean
from verl_mm_tools.ops.argument_checks import check_int, kind_of, show
from verl_mm_tools.ops.geometry import DEFAULT_MAX_PIXELS, clip_box, clip_segment, fit_pixels

Color = Literal["red", "green", "blue", "yellow", "cyan", "magenta", "orange", "purple", "white", "black"]
COLOR_NAMES: tuple[str, ...] = get_args(Color)
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "orange": (255, 165, 0),
    "purple": (128, 0, 128),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
}
MAX_LINE_WIDTH = 32
MAX_LABEL_LENGTH = 64
_MIN_FONT_SIZE = 10


def rgb_of(color: str | tuple[int, int, int]) -> tuple[int, int, int]:
    """An RGB triple from a palette name or an ``(r, g, b)`` tuple of ints in [0, 255]."""
    if isinstance(color, str) and color in PALETTE:
        return PALETTE[color]
    if isinstance(color, tuple) and len(color) == 3:
        return tuple(check_int("color channel", channel, 0, 255) for channel in color)  # type: ignore[return-value]
    hint = did_you_mean(color, COLOR_NAMES) if isinstance(color, str) else ""
    raise ToolInputError(f"color must be one of {list(COLOR_NAMES)}, got {show(color)}.{hint}")


def clean_label(label: str) -> str:
    """The label as drawn: printable ASCII (other characters become '?'), at most ``MAX_LABEL_LENGTH`` long."""
    if not isinstance(label, str):
        raise ToolInputError(f"label must be a string, got {show(label)} ({kind_of(label)})")
    if len(label) > MAX_LABEL_LENGTH:
        raise ToolInputError(f"label must be at most {MAX_LABEL_LENGTH} characters, got {len(label)}")
    return "".join(c if " " <= c <= "~" else "?" for c in label.strip())


@functools.lru_cache(maxsize=16)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _draw_label(canvas: Image.Image, text: str, box: tuple[int, int, int, int], rgb: tuple[int, int, int]) -> None:
    """``text`` on a box-colored tag just above the box (inside it when there is no room above)."""
    draw, (width, height) = ImageDraw.Draw(canvas), canvas.size
    font = _font(max(_MIN_FONT_SIZE, min(width, height) // 32))
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tag_width, tag_height = right - left + 4, bottom - top + 4
    x = max(0, min(box[0], width - tag_width))
    y = box[1] - tag_height if box[1] >= tag_height else box[1]
    draw.rectangle((x, y, x + tag_width - 1, y + tag_height - 1), fill=rgb)
    ink = (0, 0, 0) if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else (255, 255, 255)
    draw.text((x + 2 - left, y + 2 - top), text, fill=ink, font=font)


def draw_bbox(
    image: Image.Image,
    box: Sequence[float],
    *,
    label: str | None = None,
    color: str | tuple[int, int, int] = "red",
    width: int = 3,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """A copy of ``image`` with the outline of ``box`` (clipped to the image) drawn ``width`` px thick along the
    inside of the box (never outside it), and ``label`` written on a tag above it."""
    clipped = clip_box(box, image.width, image.height)
    width = check_int("width", width, 1, MAX_LINE_WIDTH)
    rgb = rgb_of(color)
    text = clean_label(label) if label is not None else ""
    canvas = image.convert("RGB")
    outline = (clipped[0], clipped[1], clipped[2] - 1, clipped[3] - 1)
    thickness = min(width, (min(clipped[2] - clipped[0], clipped[3] - clipped[1]) + 1) // 2)  # stay inside the box
    ImageDraw.Draw(canvas).rectangle(outline, outline=rgb, width=thickness)
    if text:
        _draw_label(canvas, text, clipped, rgb)
    return fit_pixels(canvas, max_pixels)


def draw_line(
    image: Image.Image,
    line: Sequence[float],
    *,
    color: str | tuple[int, int, int] = "red",
    width: int = 3,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """A copy of ``image`` with the segment ``line = (x1, y1, x2, y2)`` (clipped to the image) drawn ``width`` px
    wide."""
    x1, y1, x2, y2 = clip_segment(line, image.width, image.height)
    width = check_int("width", width, 1, MAX_LINE_WIDTH)
    rgb = rgb_of(color)
    canvas = image.convert("RGB")
    ImageDraw.Draw(canvas).line(((x1, y1), (x2, y2)), fill=rgb, width=width)
    return fit_pixels(canvas, max_pixels)
