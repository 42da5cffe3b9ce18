"""Boxes, segments and output sizes under the conventions in ``verl_mm_tools.ops`` (see its docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from PIL import Image

from verl_mm_tools.errors import ToolInputError
from verl_mm_tools.ops.argument_checks import check_number, check_quad

MIN_SIDE = 28
"""Shortest side of a crop or zoom result: two 14 px patches, so the processor always gets at least one patch."""
MAX_ASPECT_RATIO = 50
"""Longest allowed side ratio of a cropped region (vision processors refuse very elongated images)."""
MAX_COORDINATE = 1_000_000
"""Largest absolute coordinate accepted; anything further out cannot be meant and only risks overflow."""
DEFAULT_MAX_PIXELS = 1280 * 28 * 28
"""Default cap on the pixels of an op's output (Qwen2.5-VL's common ``max_pixels``)."""
MIN_MAX_PIXELS = MIN_SIDE * MIN_SIDE * MAX_ASPECT_RATIO
"""Smallest sensible ``max_pixels``: the most elongated allowed crop still reaches ``MIN_SIDE``."""
RESAMPLE = Image.Resampling.BICUBIC

_BOX_NAMES = ("x1", "y1", "x2", "y2")


def _coordinates(values: Sequence[float], name: str) -> tuple[float, float, float, float]:
    quad = check_quad(name, values)
    x1, y1, x2, y2 = (
        check_number(n, v, -MAX_COORDINATE, MAX_COORDINATE) for n, v in zip(_BOX_NAMES, quad, strict=True)
    )
    return x1, y1, x2, y2


def _outside(what: str, width: int, height: int) -> ToolInputError:
    return ToolInputError(
        f"the {what} lies outside the image, which is {width}x{height} px: x must be within [0, {width}] "
        f"and y within [0, {height}] (origin top-left, x right, y down)"
    )


def clip_box(box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int]:
    """The box ``(x1, y1, x2, y2)`` rounded outward to whole pixels and clipped to a ``width`` x ``height`` image."""
    x1, y1, x2, y2 = _coordinates(box, "box")
    if x2 <= x1:
        raise ToolInputError(f"x2 must be greater than x1 (the box's right edge), got x1={x1:g}, x2={x2:g}")
    if y2 <= y1:
        raise ToolInputError(f"y2 must be greater than y1 (the box's bottom edge), got y1={y1:g}, y2={y2:g}")
    left, top = max(0, math.floor(x1)), max(0, math.floor(y1))
    right, bottom = min(width, math.ceil(x2)), min(height, math.ceil(y2))
    if right <= left or bottom <= top:
        raise _outside(f"box ({x1:g}, {y1:g}, {x2:g}, {y2:g})", width, height)
    return left, top, right, bottom


def clip_segment(line: Sequence[float], width: int, height: int) -> tuple[float, float, float, float]:
    """The part of the segment ``(x1, y1, x2, y2)`` inside the pixel grid ``[0, width-1] x [0, height-1]``
    (Liang-Barsky clipping)."""
    x1, y1, x2, y2 = _coordinates(line, "line")
    if x1 == x2 and y1 == y2:
        raise ToolInputError(f"a line needs two different end points, got ({x1:g}, {y1:g}) twice")
    dx, dy = x2 - x1, y2 - y1
    start, end = 0.0, 1.0
    for p, q in ((-dx, x1), (dx, width - 1 - x1), (-dy, y1), (dy, height - 1 - y1)):
        if p == 0:
            if q < 0:
                raise _outside(f"line ({x1:g}, {y1:g}) -> ({x2:g}, {y2:g})", width, height)
            continue
        t = q / p
        if p < 0:
            start = max(start, t)
        else:
            end = min(end, t)
    if start > end:
        raise _outside(f"line ({x1:g}, {y1:g}) -> ({x2:g}, {y2:g})", width, height)
    return x1 + start * dx, y1 + start * dy, x1 + end * dx, y1 + end * dy


def check_aspect(width: int, height: int) -> None:
    """Refuse a region more elongated than ``MAX_ASPECT_RATIO``."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ToolInputError(
            f"the box is {width}x{height} px; its sides may differ by at most {MAX_ASPECT_RATIO}x, "
            "choose a less elongated box"
        )


def scaled_size(width: int, height: int, scale: float, max_pixels: int) -> tuple[int, int]:
    """``(width, height)`` times ``scale``, at least 1 px per side, shrunk (aspect kept) to at most ``max_pixels``."""
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be at least 1, got {max_pixels}")
    scale = min(scale, math.sqrt(max_pixels / (width * height)))
    new_width, new_height = max(1, round(width * scale)), max(1, round(height * scale))
    if new_width * new_height > max_pixels:
        new_width = max(1, min(math.floor(width * scale + 1e-9), max_pixels))
        new_height = max(1, min(math.floor(height * scale + 1e-9), max_pixels // new_width))
    return new_width, new_height


def fit_pixels(image: Image.Image, max_pixels: int) -> Image.Image:
    """``image`` itself when it has at most ``max_pixels`` pixels, else a downscaled copy (aspect kept)."""
    if image.width * image.height <= max_pixels:
        return image
    return image.resize(scaled_size(image.width, image.height, 1.0, max_pixels), RESAMPLE)
