"""Figure 3 against OpenCV: each image op of ``verl_mm_tools.ops`` (Pillow) and OpenCV doing the same on the same
512x512 input, at the op's semantics, CPU time in interleaved rounds in fresh processes (as ``bench.ops``).

What "the same" is, and how close the pixels come (``pixel_differences``; ``tests/bench/test_opencv_ops_on_cpu.py``
checks the bounds on a noisy image):

- rotate 90, flip, crop: exact (``cv2.rotate``, ``cv2.flip``, a numpy slice copied).
- draw_bbox without a label (Pillow's font and OpenCV's Hershey fonts draw other text): four filled
  ``cv2.rectangle`` bands, the op's width inside the box: exact.
- draw_line: Pillow draws a wide line as a 4-vertex integer polygon (``ImagingDrawWideLine``); the same polygon
  through ``cv2.fillConvexPoly``: exact on the figure's diagonal, a few edge pixels off on other slopes (a plain
  ``cv2.line`` of the same thickness has round caps and a wider body: 40 % more pixels on the diagonal).
- rotate by 37 degrees, expanded canvas, black corners: ``cv2.warpAffine`` with Pillow's own inverse matrix, moved
  to OpenCV's pixel centres. Nearest: a few pixels differ (OpenCV's fixed-point coordinates round ties otherwise);
  bicubic: another kernel (Pillow's affine bicubic is the a = -1 cubic, OpenCV's a = -0.75): no OpenCV flag gives
  Pillow's pixels.
- zoom_in (a 256 px box upscaled to 448 px, bicubic): ``cv2.resize``, whose bicubic is a = -0.75 (Pillow's resize:
  a = -0.5).

Each OpenCV op is timed twice: on numpy arrays (the op alone), and behind the op's interface, a PIL image in and out
(``np.asarray`` and ``Image.fromarray`` around it: what using OpenCV inside ``ops`` would cost). OpenCV runs on one
thread: the time is CPU time (the work; a worker runs many trajectories at once). OpenCV is imported only here, in
the timing process; without it the comparison is skipped with a line saying so.

``python -m verl_mm_tools.bench.opencv_ops REPEATS`` prints ``{"seconds": {"NAME/pil": [...], "NAME/opencv": [...],
"NAME/opencv_via_pil": [...]}, "pixels": {NAME: {"max_abs_difference", "mean_abs_difference",
"differing_share"}}}`` as JSON, or ``{"missing": WHY}``.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from verl_mm_tools import ops
from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.bench.ops import OP_SIDE, UNCAPPED, calls_per_sample, input_image

SIDES = ("pil", "opencv", "opencv_via_pil")
BOX_WIDTH, LINE_WIDTH, RED = 3, 4, (255, 0, 0)


def missing_opencv() -> str | None:
    """None when OpenCV imports, else why not (a line for the reader)."""
    try:
        import cv2  # noqa: F401
    except ImportError as error:
        return f"OpenCV (cv2, from opencv-python-headless; vLLM installs it) is not importable: {error}"
    return None


def pil_rotate_matrix(width: int, height: int, degrees: float) -> tuple[tuple[float, ...], tuple[int, int]]:
    """Pillow's ``Image.rotate(degrees, expand=True)``: the affine map from output to input coordinates (pixel
    centres at i + 0.5) and the expanded size, computed as Pillow computes them."""
    angle = -math.radians(degrees)
    a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
    d, e = -b, a
    c, f = -a * width / 2 - b * height / 2 + width / 2, -d * width / 2 - e * height / 2 + height / 2
    corners = [(a * x + b * y + c, d * x + e * y + f) for x, y in ((0, 0), (width, 0), (width, height), (0, height))]
    xs, ys = [x for x, _ in corners], [y for _, y in corners]
    out_width = math.ceil(max(xs)) - math.floor(min(xs))
    out_height = math.ceil(max(ys)) - math.floor(min(ys))
    shift_x, shift_y = -(out_width - width) / 2, -(out_height - height) / 2
    return (a, b, a * shift_x + b * shift_y + c, d, e, d * shift_x + e * shift_y + f), (out_width, out_height)


def opencv_rotate(array: np.ndarray, degrees: float, interpolation: int) -> np.ndarray:
    """``array`` rotated as ``ops.rotate`` does, by ``cv2.warpAffine``: Pillow's matrix with OpenCV's pixel centres
    (at i, not i + 0.5: the offset moves by half a pixel on both sides)."""
    import cv2

    (a, b, c, d, e, f), size = pil_rotate_matrix(array.shape[1], array.shape[0], degrees)
    matrix = np.array([[a, b, c + (a + b - 1) / 2], [d, e, f + (d + e - 1) / 2]])
    return cv2.warpAffine(array, matrix, size, flags=interpolation | cv2.WARP_INVERSE_MAP, borderValue=(0, 0, 0))


def opencv_box(array: np.ndarray, box: tuple[int, int, int, int], width: int = BOX_WIDTH) -> np.ndarray:
    """A copy of ``array`` with ``ops.draw_bbox``'s outline: ``width`` px bands inside the box, as four filled
    rectangles (OpenCV's own outline is centred on the path)."""
    import cv2

    out = array.copy()
    left, top, right, bottom = box[0], box[1], box[2] - 1, box[3] - 1
    for band in (
        (left, top, right, top + width - 1),
        (left, bottom - width + 1, right, bottom),
        (left, top, left + width - 1, bottom),
        (right - width + 1, top, right, bottom),
    ):
        cv2.rectangle(out, band[:2], band[2:], RED, thickness=-1)
    return out


def wide_line_polygon(x0: float, y0: float, x1: float, y1: float, width: int) -> list[tuple[int, int]]:
    """The four vertices of Pillow's wide line (``ImagingDrawWideLine`` in its ``Draw.c``, with its rounding)."""
    x0, y0, x1, y1 = int(x0), int(y0), int(x1), int(y1)
    dx, dy = x1 - x0, y1 - y0
    length, half = math.hypot(dx, dy), (width - 1) / 2
    most, least = _round_up(half) / length, _round_down(half) / length
    dx_min, dx_max = _round_down(least * dy), _round_down(most * dy)
    dy_min, dy_max = _round_down(least * dx), _round_down(most * dx)
    return [
        (x0 - dx_min, y0 + dy_max),
        (x1 - dx_min, y1 + dy_max),
        (x1 + dx_max, y1 - dy_min),
        (x0 + dx_max, y0 - dy_min),
    ]


def _round_up(value: float) -> int:
    return int(math.floor(value + 0.5)) if value >= 0 else -int(math.floor(abs(value) + 0.5))


def _round_down(value: float) -> int:
    return int(math.ceil(value - 0.5)) if value >= 0 else -int(math.ceil(abs(value) - 0.5))


def opencv_line(array: np.ndarray, line: tuple[float, float, float, float], width: int = LINE_WIDTH) -> np.ndarray:
    """A copy of ``array`` with ``ops.draw_line``'s segment: Pillow's polygon filled by OpenCV (width 1: a line)."""
    import cv2

    out = array.copy()
    if width == 1:
        cv2.line(out, (int(line[0]), int(line[1])), (int(line[2]), int(line[3])), RED, 1, cv2.LINE_8)
    else:
        cv2.fillConvexPoly(out, np.array(wide_line_polygon(*line, width), np.int32), RED, cv2.LINE_8)
    return out


def op_pairs(image: Image.Image) -> dict[str, tuple[Callable[[], Image.Image], Callable[[np.ndarray], np.ndarray]]]:
    """Each op as (Pillow on ``image``, OpenCV on an array of it), uncapped: figure 3's inputs."""
    import cv2

    side = image.width
    box = (side // 10, side // 10, side // 10 + side // 2, side // 10 + side // 2)
    diagonal = (0.0, 0.0, side - 1.0, side - 1.0)
    return {
        "rotate90": (
            lambda: ops.rotate(image, 90, max_pixels=UNCAPPED),
            lambda array: cv2.rotate(array, cv2.ROTATE_90_COUNTERCLOCKWISE),
        ),
        "rotate37": (
            lambda: ops.rotate(image, 37, max_pixels=UNCAPPED),
            lambda array: opencv_rotate(array, 37, cv2.INTER_CUBIC),
        ),
        "rotate37_nearest": (
            lambda: ops.rotate(image, 37, max_pixels=UNCAPPED, resample="nearest"),
            lambda array: opencv_rotate(array, 37, cv2.INTER_NEAREST),
        ),
        "flip": (lambda: ops.flip(image, "horizontal", max_pixels=UNCAPPED), lambda array: cv2.flip(array, 1)),
        "crop": (
            lambda: ops.crop(image, box, max_pixels=UNCAPPED),
            lambda array: array[box[1] : box[3], box[0] : box[2]].copy(),
        ),
        "zoom_in": (
            lambda: ops.zoom_in(image, box, max_pixels=UNCAPPED),
            lambda array: cv2.resize(
                array[box[1] : box[3], box[0] : box[2]], (ops.DEFAULT_ZOOM_SIDE,) * 2, interpolation=cv2.INTER_CUBIC
            ),
        ),
        "draw_bbox": (
            lambda: ops.draw_bbox(image, box, width=BOX_WIDTH, max_pixels=UNCAPPED),
            lambda array: opencv_box(array, box),
        ),
        "draw_line": (
            lambda: ops.draw_line(image, diagonal, width=LINE_WIDTH, max_pixels=UNCAPPED),
            lambda array: opencv_line(array, diagonal),
        ),
    }


def timed_functions(image: Image.Image) -> dict[str, Callable[[], object]]:
    """``NAME/pil``, ``NAME/opencv`` (on an array made once) and ``NAME/opencv_via_pil`` (a PIL image in and out)."""
    array = np.asarray(image)
    functions: dict[str, Callable[[], object]] = {}
    for name, (pil, opencv) in op_pairs(image).items():
        functions[f"{name}/pil"] = pil
        functions[f"{name}/opencv"] = functools.partial(opencv, array)
        functions[f"{name}/opencv_via_pil"] = functools.partial(_via_pil, opencv, image)
    return functions


def _via_pil(opencv: Callable[[np.ndarray], np.ndarray], image: Image.Image) -> Image.Image:
    return Image.fromarray(opencv(np.asarray(image)))


def interleaved_cpu_seconds(repeats: int) -> dict[str, list[float]]:
    """CPU seconds per call of each of ``timed_functions``, ``repeats`` rounds taken in turns, each round on a new
    input kept alive (as ``bench.ops.interleaved_cpu_seconds``)."""
    inputs = [input_image(OP_SIDE)]
    calls = {name: calls_per_sample(function) for name, function in timed_functions(inputs[0]).items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        inputs.append(input_image(OP_SIDE))
        for name, function in timed_functions(inputs[-1]).items():
            started = time.process_time()
            for _ in range(calls[name]):
                function()
            samples[name].append((time.process_time() - started) / calls[name])
    return samples


def noisy_image(side: int = OP_SIDE) -> Image.Image:
    """Gradients and a block of noise (seeded): interpolation differences show here, not on flat colour."""
    y, x = np.mgrid[0:side, 0:side]
    pixels = np.stack([(x // 2) % 256, (y // 2) % 256, ((x + y) // 4) % 256], axis=2).astype(np.uint8)
    pixels[side // 5 : side * 3 // 5, side // 4 : side * 4 // 5] = np.random.default_rng(0).integers(
        0, 256, (side * 3 // 5 - side // 5, side * 4 // 5 - side // 4, 3), dtype=np.uint8
    )
    return Image.fromarray(pixels)


def pixel_differences(image: Image.Image) -> dict[str, dict[str, float]]:
    """For each op: the largest and the mean channel difference between Pillow's and OpenCV's result, and the share
    of pixels that differ at all (a different size: share 1)."""
    array, found = np.asarray(image), {}
    for name, (pil, opencv) in op_pairs(image).items():
        ours, theirs = np.asarray(pil()).astype(np.int16), opencv(array).astype(np.int16)
        if ours.shape != theirs.shape:
            found[name] = {"max_abs_difference": 255.0, "mean_abs_difference": 255.0, "differing_share": 1.0}
            continue
        difference = np.abs(ours - theirs)
        found[name] = {
            "max_abs_difference": float(difference.max()),
            "mean_abs_difference": float(difference.mean()),
            "differing_share": float((difference.max(axis=2) > 0).mean()),
        }
    return found


def opencv_figures(repeats: int, processes: int, say: Callable[[str], object] = lambda line: None) -> list[Figure]:
    """Pillow over OpenCV per op, paired samples pooled over ``processes`` fresh processes of ``ceil(repeats /
    processes)`` rounds: on arrays (``ops/opencv/NAME/pil_over_opencv``) and behind the op's interface
    (``.../pil_over_opencv_via_pil``), and the share of pixels that differ (counted, on ``noisy_image``). None,
    with a line saying why, without OpenCV."""
    runs = [_in_fresh_process(math.ceil(repeats / processes)) for _ in range(processes)]
    if "missing" in runs[0]:
        say(f"bench: figure 3's comparison with OpenCV is skipped: {runs[0]['missing']}")
        return []
    figures = []
    for name, pixels in runs[0]["pixels"].items():
        for side in SIDES[1:]:
            ratios = [
                pil / other
                for run in runs
                for pil, other in zip(run["seconds"][f"{name}/pil"], run["seconds"][f"{name}/{side}"])
            ]
            figures.append(figure(f"ops/opencv/{name}/pil_over_{side}", ratios))
        figures.append(figure(f"ops/opencv/{name}/differing_pixels_share", [pixels["differing_share"]]))
    return figures


def _in_fresh_process(repeats: int) -> dict:
    command = [sys.executable, "-m", "verl_mm_tools.bench.opencv_ops", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the OpenCV timing process failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout)


def main(argv: list[str]) -> None:
    if len(argv) != 1 or not argv[0].isdigit() or int(argv[0]) < 1:
        raise SystemExit(f"usage: python -m verl_mm_tools.bench.opencv_ops REPEATS (a positive integer), got {argv}")
    why = missing_opencv()
    if why is not None:
        json.dump({"missing": why}, sys.stdout)
        return
    import cv2

    cv2.setNumThreads(1)
    result = {"seconds": interleaved_cpu_seconds(int(argv[0])), "pixels": pixel_differences(noisy_image())}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
