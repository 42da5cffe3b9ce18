"""Figure 3 against OpenCV (``bench/opencv_ops.py``): each OpenCV stand-in does what the Pillow op does, exactly where
the libraries can agree, within measured bounds where their kernels differ; and the figures' shape. No timings are
asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from verl_mm_tools import ops
from verl_mm_tools.bench import opencv_ops
from verl_mm_tools.bench.ops import OP_SIDE, UNCAPPED

cv2 = pytest.importorskip("cv2", reason="OpenCV (opencv-python-headless) is installed with vLLM")

OPS = ["rotate90", "rotate37", "rotate37_nearest", "flip", "crop", "zoom_in", "draw_bbox", "draw_line"]


@pytest.fixture(scope="module")
def differences():
    return opencv_ops.pixel_differences(opencv_ops.noisy_image())


@pytest.mark.parametrize("name", ["rotate90", "flip", "crop", "draw_bbox", "draw_line"])
def test_where_the_libraries_can_agree_opencv_gives_the_same_pixels(differences, name):
    assert differences[name] == {"max_abs_difference": 0.0, "mean_abs_difference": 0.0, "differing_share": 0.0}


@pytest.mark.parametrize(
    "name, most_differing, largest_mean",
    [
        # OpenCV's fixed-point coordinates round a few ties to the neighbouring pixel (measured: 0.22 % of pixels)
        ("rotate37_nearest", 0.005, 0.1),
        # another bicubic kernel (Pillow's affine: a = -1; OpenCV: a = -0.75): most pixels of the noise off by a few
        # levels (measured: 47 % differ, mean 0.77 levels)
        ("rotate37", 0.6, 1.0),
        # resize kernels a = -0.5 (Pillow) and -0.75 (OpenCV): measured 59 % differ, mean 2.24 levels
        ("zoom_in", 0.7, 2.5),
    ],
)
def test_where_the_kernels_differ_the_pixels_stay_close(differences, name, most_differing, largest_mean):
    found = differences[name]
    assert 0 < found["differing_share"] <= most_differing
    assert found["mean_abs_difference"] <= largest_mean


@pytest.mark.parametrize("degrees", [1, 37, 45, 90.5, 133, -20, 271])
@pytest.mark.parametrize("size", [(512, 512), (300, 17)])
def test_the_rotation_matrix_gives_pillows_expanded_canvas(degrees, size):
    image = Image.new("RGB", size)
    _, expanded = opencv_ops.pil_rotate_matrix(*size, degrees)
    assert expanded == image.rotate(degrees, expand=True).size
    assert opencv_ops.opencv_rotate(np.asarray(image), degrees, cv2.INTER_NEAREST).shape[1::-1] == expanded


@pytest.mark.parametrize("width", [1, 2, 3, 4, 7])
@pytest.mark.parametrize(
    "line, off_pixels",
    [((0, 0, 511, 511), 0), ((10, 100, 500, 100), 0), ((100, 5, 130, 500), 0), ((3, 500, 400, 17), 5)],
)
def test_pillows_wide_line_polygon_filled_by_opencv_is_its_line(line, off_pixels, width):
    image = opencv_ops.noisy_image()
    ours = np.asarray(ops.draw_line(image, line, width=width, max_pixels=UNCAPPED))
    theirs = opencv_ops.opencv_line(np.asarray(image), line, width)
    differing = int((np.abs(ours.astype(int) - theirs.astype(int)).max(axis=2) > 0).sum())
    assert differing <= (off_pixels if width > 1 else 0)  # measured: at most 5 on that slope, of ~2,700 line pixels


def test_the_comparison_pairs_every_op_and_counts_what_differs():
    figures = {each.name: each for each in opencv_ops.opencv_figures(repeats=1, processes=1)}
    assert sorted(figures) == sorted(
        f"ops/opencv/{name}/{figure}"
        for name in OPS
        for figure in ("pil_over_opencv", "pil_over_opencv_via_pil", "differing_pixels_share")
    )
    assert {len(each.samples) for each in figures.values()} == {1}
    assert all(each.target is None for each in figures.values())  # informational: switching is decided elsewhere
    assert figures["ops/opencv/flip/differing_pixels_share"].value == 0
    assert figures["ops/opencv/rotate37/differing_pixels_share"].value > 0


def test_without_opencv_the_comparison_is_skipped_with_a_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 raises ImportError
    why = opencv_ops.missing_opencv()
    assert why.startswith("OpenCV (cv2, from opencv-python-headless; vLLM installs it) is not importable: ")
    opencv_ops.main(["1"])
    assert json.loads(capsys.readouterr().out) == {"missing": why}
    monkeypatch.setattr(opencv_ops, "_in_fresh_process", lambda repeats: {"missing": why})
    said: list[str] = []
    assert opencv_ops.opencv_figures(repeats=3, processes=3, say=said.append) == []
    assert said == [f"bench: figure 3's comparison with OpenCV is skipped: {why}"]


def test_the_timing_process_refuses_a_bad_repeat_count():
    done = subprocess.run([sys.executable, "-m", "verl_mm_tools.bench.opencv_ops", "0"], capture_output=True, text=True)
    assert done.returncode == 1
    assert (
        done.stderr.strip() == "usage: python -m verl_mm_tools.bench.opencv_ops REPEATS (a positive integer), got ['0']"
    )


def test_the_figure_inputs_are_figure_3s():
    image = Image.new("RGB", (OP_SIDE, OP_SIDE))
    pairs = opencv_ops.op_pairs(image)
    assert sorted(pairs) == sorted(OPS)
    zoomed = pairs["zoom_in"][0]()
    assert zoomed.size == (ops.DEFAULT_ZOOM_SIDE,) * 2  # a real upscale of the half-side box, as in figure 3
    assert math.isclose(zoomed.width / (OP_SIDE // 2), 1.75)
