"""draw_bbox and draw_line: exact pixels, colors, labels, clipping, refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from verl_mm_tools import ops
from verl_mm_tools.errors import ToolInputError

W, H = 64, 48


def blank(size=(W, H)) -> Image.Image:
    return Image.new("RGB", size)


def mask_of(image: Image.Image, rgb) -> np.ndarray:
    return (np.asarray(image) == rgb).all(-1)


def outline_mask(box, thickness, size=(W, H)) -> np.ndarray:
    """The pixels of a ``thickness`` px outline along the inside of the half-open box."""
    x1, y1, x2, y2 = box
    mask = np.zeros((size[1], size[0]), bool)
    mask[y1:y2, x1:x2] = True
    mask[y1 + thickness : y2 - thickness, x1 + thickness : x2 - thickness] = False
    return mask


@pytest.mark.parametrize("thickness", [1, 2, 3, 5])
def test_bbox_outline_pixels_are_exactly_the_box_edge(thickness):
    drawn = ops.draw_bbox(blank(), (10, 10, 30, 20), width=thickness)
    red = mask_of(drawn, ops.PALETTE["red"])
    assert np.array_equal(red, outline_mask((10, 10, 30, 20), thickness))
    assert int(red.sum()) == 20 * 10 - (20 - 2 * thickness) * (10 - 2 * thickness)
    assert int(mask_of(drawn, (0, 0, 0)).sum()) == W * H - int(red.sum())


def test_bbox_of_one_pixel_width_has_perimeter_pixels():
    assert int(mask_of(ops.draw_bbox(blank(), (10, 10, 30, 20), width=1), (255, 0, 0)).sum()) == 2 * 20 + 2 * 10 - 4


def test_bbox_is_clipped_to_the_image():
    drawn = ops.draw_bbox(blank(), (-10, -10, 20, 20), width=1)
    assert np.array_equal(mask_of(drawn, (255, 0, 0)), outline_mask((0, 0, 20, 20), 1))


def test_bbox_thicker_than_the_box_fills_it():
    drawn = ops.draw_bbox(blank(), (10, 10, 14, 14), width=32)
    assert np.array_equal(mask_of(drawn, (255, 0, 0)), outline_mask((10, 10, 14, 14), 2))


@pytest.mark.parametrize("name", ops.COLOR_NAMES)
def test_every_palette_color_is_drawn_exactly(name):
    drawn = ops.draw_bbox(Image.new("RGB", (W, H), (1, 2, 3)), (10, 10, 30, 20), color=name, width=1)
    assert int(mask_of(drawn, ops.PALETTE[name]).sum()) == 56


def test_bbox_accepts_rgb_tuples():
    drawn = ops.draw_bbox(blank(), (10, 10, 30, 20), color=(1, 2, 3), width=1)
    assert int(mask_of(drawn, (1, 2, 3)).sum()) == 56


def test_label_is_drawn_on_a_tag_above_the_box():
    plain = ops.draw_bbox(blank(), (10, 30, 40, 46), width=1, color="green")
    labeled = ops.draw_bbox(blank(), (10, 30, 40, 46), width=1, color="green", label="cat")
    changed = (np.asarray(plain) != np.asarray(labeled)).any(-1)
    ys, xs = np.nonzero(changed)
    assert ys.max() < 30  # the tag sits above the box
    assert xs.min() == 10
    assert int(mask_of(labeled, (0, 0, 0)).sum()) < int(mask_of(plain, (0, 0, 0)).sum())
    # black text on the light green tag
    tag = np.asarray(labeled)[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    assert (tag[..., 1] < 128).any()


def test_label_goes_inside_the_box_when_there_is_no_room_above():
    plain = ops.draw_bbox(blank(), (10, 0, 60, 40), width=1)
    labeled = ops.draw_bbox(blank(), (10, 0, 60, 40), width=1, label="dog")
    ys, _ = np.nonzero((np.asarray(plain) != np.asarray(labeled)).any(-1))
    assert ys.min() <= 1 and ys.max() < 40  # row 0 is the red outline, under the red tag


@pytest.mark.parametrize("label", ["", "   ", "狗", "a\nb\tc\x00", "~" * ops.MAX_LABEL_LENGTH])
def test_any_text_label_is_drawn_without_error(label):
    assert ops.draw_bbox(blank(), (10, 20, 30, 40), label=label).size == (W, H)


def test_clean_label():
    assert ops.draw.clean_label("  a\nb狗 ") == "a?b?"


def test_line_pixels_are_exact():
    horizontal = mask_of(ops.draw_line(blank(), (5, 10, 20, 10), width=1), (255, 0, 0))
    expected = np.zeros((H, W), bool)
    expected[10, 5:21] = True  # both end points included
    assert np.array_equal(horizontal, expected)
    wide = mask_of(ops.draw_line(blank(), (5, 10, 20, 10), width=3), (255, 0, 0))
    expected[9:12, 5:21] = True
    assert np.array_equal(wide, expected)


def test_line_is_clipped_to_the_image():
    diagonal = mask_of(ops.draw_line(blank(), (-100, -100, 200, 200), width=1), (255, 0, 0))
    assert int(diagonal.sum()) == 48
    assert all(diagonal[i, i] for i in range(48))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ops.draw_bbox(blank(), (0, 0, 10, 10), width=0), "width must be between 1 and 32, got 0"),
        (lambda: ops.draw_bbox(blank(), (0, 0, 10, 10), width=33), "width must be between 1 and 32, got 33"),
        (lambda: ops.draw_bbox(blank(), (0, 0, 10, 10), color="rde"), "got 'rde'. Did you mean 'red'?"),
        (lambda: ops.draw_bbox(blank(), (0, 0, 10, 10), color=(1, 2, 300)), "color channel must be between 0 and 255"),
        (lambda: ops.draw_bbox(blank(), (0, 0, 10, 10), label=5), "label must be a string, got 5 (an integer)"),
        (lambda: ops.draw_bbox(blank(), (0, 0, 10, 10), label="x" * 65), "at most 64 characters, got 65"),
        (lambda: ops.draw_bbox(blank(), (70, 0, 80, 10)), "lies outside the image, which is 64x48 px"),
        (lambda: ops.draw_line(blank(), (1, 1, 1, 1)), "two different end points"),
        (lambda: ops.draw_line(blank(), (0, 0, 10, 10), width=2.5), "width must be a whole number, got 2.5"),
        (lambda: ops.draw_line(blank(), (0, -5, 63, -1)), "lies outside the image"),
    ],
)
def test_refusals(call, message):
    with pytest.raises(ToolInputError) as error:
        call()
    assert message in str(error.value)


def test_drawing_returns_a_new_rgb_image():
    image = Image.new("L", (W, H))
    drawn = ops.draw_bbox(image, (1, 1, 20, 20))
    assert drawn.mode == "RGB" and drawn is not image
    assert not np.asarray(image).any()


def test_drawing_respects_max_pixels():
    drawn = ops.draw_line(blank((400, 300)), (0, 0, 399, 299), max_pixels=ops.MIN_MAX_PIXELS)
    assert drawn.width * drawn.height <= ops.MIN_MAX_PIXELS


@settings(max_examples=60, deadline=None)
@given(
    box=st.tuples(*[st.one_of(st.integers(-100, 200), st.floats(-100, 200)) for _ in range(4)]),
    width=st.integers(1, 32),
    label=st.one_of(st.none(), st.text(max_size=64)),
)
def test_draw_answers_or_refuses(box, width, label):
    for call in (
        lambda: ops.draw_bbox(blank(), box, width=width, label=label),
        lambda: ops.draw_line(blank(), box, width=width),
    ):
        try:
            assert call().size == (W, H)
        except ToolInputError:
            pass
