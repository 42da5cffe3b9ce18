"""The six shipped image tools: each is a schema function (what the model sees) plus a thin ``ImageTool``.

Coordinates, clipping and size rules are those of ``verl_mm_tools.ops``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from PIL import Image

from verl_mm_tools import ops
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.ops.draw import Color, clean_label
from verl_mm_tools.ops.geometry import clip_box
from verl_mm_tools.ops.transform import DEFAULT_ZOOM_SIDE, MAX_ZOOM_SIDE
from verl_mm_tools.tools.base import ImageTool, ImageToolConfig


def _box_text(box: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in box) + ")"


def _clipped_box(image: Image.Image, box: tuple[float, float, float, float]) -> tuple[tuple[int, ...], str]:
    """The box clipped to the image, and its text (noting when clipping or rounding changed it)."""
    clipped = clip_box(box, image.width, image.height)
    if clipped == box:
        return clipped, _box_text(clipped)
    inside = box[0] >= 0 and box[1] >= 0 and box[2] <= image.width and box[3] <= image.height
    change = "rounded outward to whole pixels" if inside else "clipped to the image"
    return clipped, f"{_box_text(clipped)} (requested {_box_text(box)}, {change})"


def rotate(degrees: float, image_id: int | None = None) -> None:
    """Rotate an image counter-clockwise by any angle; the canvas grows to keep the whole image, corners are black.

    Args:
        degrees: Angle in degrees between -360 and 360; positive turns counter-clockwise, negative clockwise.
        image_id: Number of the image to rotate (Image 1 is the first image). Default: the latest image.
    """


@dataclasses.dataclass(frozen=True)
class RotateConfig(ImageToolConfig):
    """RotateTool's config: ``resample`` interpolates angles that are not multiples of 90 degrees (nearest,
    bilinear or bicubic: quality against speed, see ``ops.rotate``)."""

    resample: str = "bicubic"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resample not in ops.ROTATE_RESAMPLING:
            raise ConfigError(f"resample must be one of {sorted(ops.ROTATE_RESAMPLING)}, got {self.resample!r}")


class RotateTool(ImageTool[RotateConfig]):
    schema_fn = rotate
    config_cls = RotateConfig
    example_arguments = {"degrees": 90}

    def apply(self, image: Image.Image, degrees: float) -> tuple[Image.Image, str]:
        rotated = ops.rotate(image, degrees, max_pixels=self.settings.max_pixels, resample=self.settings.resample)
        return rotated, f"rotated by {degrees:g} degrees counter-clockwise"


def flip(direction: Literal["horizontal", "vertical"], image_id: int | None = None) -> None:
    """Mirror an image.

    Args:
        direction: "horizontal" swaps left and right, "vertical" swaps top and bottom.
        image_id: Number of the image to flip (Image 1 is the first image). Default: the latest image.
    """


class FlipTool(ImageTool[ImageToolConfig]):
    schema_fn = flip
    example_arguments = {"direction": "horizontal"}

    def apply(self, image: Image.Image, direction: str) -> tuple[Image.Image, str]:
        swapped = "left and right" if direction == "horizontal" else "top and bottom"
        flipped = ops.flip(image, direction, max_pixels=self.settings.max_pixels)
        return flipped, f"flipped {direction}ly ({swapped} swapped)"


def crop(x1: float, y1: float, x2: float, y2: float, image_id: int | None = None) -> None:
    """Cut out a box of an image. Coordinates are pixels of that image: origin top-left, x right, y down.

    Args:
        x1: Left edge of the box in pixels.
        y1: Top edge of the box in pixels.
        x2: Right edge of the box in pixels (greater than x1).
        y2: Bottom edge of the box in pixels (greater than y1).
        image_id: Number of the image to crop (Image 1 is the first image). Default: the latest image.
    """


class CropTool(ImageTool[ImageToolConfig]):
    schema_fn = crop
    example_arguments = {"x1": 8, "y1": 8, "x2": 56, "y2": 40}

    def apply(self, image: Image.Image, x1: float, y1: float, x2: float, y2: float) -> tuple[Image.Image, str]:
        box, text = _clipped_box(image, (x1, y1, x2, y2))
        return ops.crop(image, box, max_pixels=self.settings.max_pixels), f"cropped to box {text}"


def zoom_in(x1: float, y1: float, x2: float, y2: float, image_id: int | None = None) -> None:
    """Zoom in on a box of an image: cut it out and enlarge it. Coordinates are pixels of that image: origin
    top-left, x right, y down.

    Args:
        x1: Left edge of the box in pixels.
        y1: Top edge of the box in pixels.
        x2: Right edge of the box in pixels (greater than x1).
        y2: Bottom edge of the box in pixels (greater than y1).
        image_id: Number of the image to zoom into (Image 1 is the first image). Default: the latest image.
    """


@dataclasses.dataclass(frozen=True)
class ZoomInConfig(ImageToolConfig):
    """ZoomInTool's config: ``target_side`` is the longer side of a zoomed image, before the ``max_pixels`` cap."""

    target_side: int = DEFAULT_ZOOM_SIDE

    def __post_init__(self) -> None:
        super().__post_init__()
        if not ops.MIN_SIDE <= self.target_side <= MAX_ZOOM_SIDE:
            raise ConfigError(f"target_side must be between {ops.MIN_SIDE} and {MAX_ZOOM_SIDE}, got {self.target_side}")


class ZoomInTool(ImageTool[ZoomInConfig]):
    schema_fn = zoom_in
    config_cls = ZoomInConfig
    example_arguments = {"x1": 16, "y1": 12, "x2": 48, "y2": 36}

    def apply(self, image: Image.Image, x1: float, y1: float, x2: float, y2: float) -> tuple[Image.Image, str]:
        box, text = _clipped_box(image, (x1, y1, x2, y2))
        zoomed = ops.zoom_in(image, box, target_side=self.settings.target_side, max_pixels=self.settings.max_pixels)
        return zoomed, f"zoomed in on box {text}"


def draw_bbox(
    x1: float,
    y1: float,
    x2: float,
    y2: float,
    label: str | None = None,
    color: Color = "red",
    width: int = 3,
    image_id: int | None = None,
) -> None:
    """Draw a rectangle (bounding box) on an image, optionally with a text label above it. Coordinates are pixels
    of that image: origin top-left, x right, y down.

    Args:
        x1: Left edge of the box in pixels.
        y1: Top edge of the box in pixels.
        x2: Right edge of the box in pixels (greater than x1).
        y2: Bottom edge of the box in pixels (greater than y1).
        label: Short text (at most 64 characters) written above the box. Default: no label.
        color: Color of the box.
        width: Line thickness in pixels, 1 to 32.
        image_id: Number of the image to draw on (Image 1 is the first image). Default: the latest image.
    """


class DrawBBoxTool(ImageTool[ImageToolConfig]):
    schema_fn = draw_bbox
    example_arguments = {"x1": 8, "y1": 8, "x2": 40, "y2": 32, "label": "cat"}

    def apply(
        self, image: Image.Image, x1: float, y1: float, x2: float, y2: float, label: str | None, color: str, width: int
    ) -> tuple[Image.Image, str]:
        box, text = _clipped_box(image, (x1, y1, x2, y2))
        drawn = ops.draw_bbox(image, box, label=label, color=color, width=width, max_pixels=self.settings.max_pixels)
        labeled = f" labeled {clean_label(label)!r}" if label else ""
        return drawn, f"with a {color} box drawn at {text}{labeled}"


def draw_line(
    x1: float, y1: float, x2: float, y2: float, color: Color = "red", width: int = 3, image_id: int | None = None
) -> None:
    """Draw a straight line between two points of an image. Coordinates are pixels of that image: origin top-left,
    x right, y down.

    Args:
        x1: x of the start point in pixels.
        y1: y of the start point in pixels.
        x2: x of the end point in pixels.
        y2: y of the end point in pixels.
        color: Color of the line.
        width: Line thickness in pixels, 1 to 32.
        image_id: Number of the image to draw on (Image 1 is the first image). Default: the latest image.
    """


class DrawLineTool(ImageTool[ImageToolConfig]):
    schema_fn = draw_line
    example_arguments = {"x1": 4, "y1": 4, "x2": 60, "y2": 44, "color": "blue"}

    def apply(
        self, image: Image.Image, x1: float, y1: float, x2: float, y2: float, color: str, width: int
    ) -> tuple[Image.Image, str]:
        drawn = ops.draw_line(image, (x1, y1, x2, y2), color=color, width=width, max_pixels=self.settings.max_pixels)
        return drawn, f"with a {color} line drawn from ({x1:g}, {y1:g}) to ({x2:g}, {y2:g})"
