"""Pure PIL image operations behind the image tools. No verl import.

Conventions (documented here once; every op and tool follows them):

* **Coordinates** are absolute pixel coordinates of the referenced image: origin at the top-left corner, x to the
  right, y down. A box ``(x1, y1, x2, y2)`` covers the pixels ``x1 <= x < x2`` and ``y1 <= y < y2`` (as in
  ``PIL.Image.crop``), so the whole image of size W x H is ``(0, 0, W, H)``. Fractional box coordinates are rounded
  outward (the box grows to whole pixels). A line ``(x1, y1, x2, y2)`` runs between two pixel positions.
* **Out-of-range geometry is clipped** to the image: a box is intersected with ``(0, 0, W, H)``, a line segment is
  cut at the image border. It is refused (``ToolInputError``) when nothing is left, when ``x2 <= x1`` or
  ``y2 <= y1`` for a box, when a line's two end points coincide, or when a coordinate is not a finite number within
  ``+-MAX_COORDINATE``.
* **Minimum crop size**: a crop or zoom whose shorter side is under ``MIN_SIDE`` (28 px, two 14 px patches of the
  Qwen-VL vision encoders) is upscaled, aspect kept, until its shorter side is ``MIN_SIDE``, so the processor always
  gets at least one patch. A crop or zoom box whose long side exceeds ``MAX_ASPECT_RATIO`` (50) times its short
  side (after clipping) is refused.
* **Angles** are degrees in ``[-360, 360]``; positive turns counter-clockwise (PIL's convention). The canvas expands
  to hold the whole rotated image; uncovered corners are filled black.
* **Output size**: every op returns a new RGB image of at most ``max_pixels`` pixels (default
  ``DEFAULT_MAX_PIXELS``); larger results are downscaled with their aspect ratio kept, and sizes are computed before
  any pixel is allocated, so no argument can make an op allocate more than about ``max_pixels`` pixels beyond its
  input.

Invalid arguments raise ``verl_mm_tools.errors.ToolInputError`` whose message is written for the model: what was
wrong, what was received, what is allowed.
"""

from verl_mm_tools.ops.draw import COLOR_NAMES, MAX_LABEL_LENGTH, MAX_LINE_WIDTH, PALETTE, Color, draw_bbox, draw_line
from verl_mm_tools.ops.geometry import (
    DEFAULT_MAX_PIXELS,
    MAX_ASPECT_RATIO,
    MAX_COORDINATE,
    MIN_MAX_PIXELS,
    MIN_SIDE,
    clip_box,
    clip_segment,
    fit_pixels,
    scaled_size,
)
from verl_mm_tools.ops.transform import (
    DEFAULT_ZOOM_SIDE,
    FLIP_DIRECTIONS,
    ROTATE_RESAMPLING,
    crop,
    flip,
    rotate,
    zoom_in,
)

__all__ = [
    "COLOR_NAMES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_ZOOM_SIDE",
    "FLIP_DIRECTIONS",
    "MAX_ASPECT_RATIO",
    "MAX_COORDINATE",
    "MAX_LABEL_LENGTH",
    "MAX_LINE_WIDTH",
    "MIN_MAX_PIXELS",
    "MIN_SIDE",
    "PALETTE",
    "ROTATE_RESAMPLING",
    "Color",
    "clip_box",
    "clip_segment",
    "crop",
    "draw_bbox",
    "draw_line",
    "fit_pixels",
    "flip",
    "rotate",
    "scaled_size",
    "zoom_in",
]
