"""rotate, flip, crop, zoom_in: identities, exact pixel positions, size bounds (Hypothesis)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from verl_mm_tools import ops
from verl_mm_tools.errors import ToolInputError

RED = (255, 0, 0)
W, H = 64, 48
SQUARE = (8, 4, 24, 20)  # x1, y1, x2, y2 of the red square


def square_image(size=(W, H), box=SQUARE, mode="RGB") -> Image.Image:
    image = Image.new("RGB", size)
    image.paste(RED, box)
    return image.convert(mode)


def gradient_image(size=(W, H)) -> Image.Image:
    image = Image.new("RGB", size)
    image.putdata([(4 * x % 256, 5 * y % 256, (x * y) % 256) for y in range(size[1]) for x in range(size[0])])
    return image


def red_bbox(image: Image.Image) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) of the exactly red pixels, half-open."""
    ys, xs = np.nonzero((np.asarray(image) == RED).all(-1))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def same(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b))


# ---- identities -------------------------------------------------------------------------------------------------


def test_four_quarter_turns_are_identity():
    image = gradient_image()
    turned = image
    for _ in range(4):
        turned = ops.rotate(turned, 90)
    assert same(turned, image)


@pytest.mark.parametrize("degrees", [0, 360, -360, 0.0])
def test_full_turns_are_identity(degrees):
    assert same(ops.rotate(gradient_image(), degrees), gradient_image())


def test_quarter_turn_and_back_is_identity():
    assert same(ops.rotate(ops.rotate(gradient_image(), 90), -90), gradient_image())
    assert same(ops.rotate(ops.rotate(gradient_image(), 180), 180), gradient_image())


@pytest.mark.parametrize("direction", ["horizontal", "vertical"])
def test_flip_twice_is_identity(direction):
    assert same(ops.flip(ops.flip(gradient_image(), direction), direction), gradient_image())


def test_crop_of_full_box_is_identity():
    assert same(ops.crop(gradient_image(), (0, 0, W, H)), gradient_image())
    assert same(ops.crop(gradient_image(), (-5, -5, W + 5, H + 5)), gradient_image())  # clipped to the full box


def test_zoom_of_full_box_at_native_size_is_identity():
    assert same(ops.zoom_in(gradient_image(), (0, 0, W, H), target_side=W), gradient_image())


# ---- exact pixel positions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("degrees", "size", "square"),
    [
        (90, (H, W), (4, 40, 20, 56)),  # counter-clockwise: (x, y) -> (y, W-1-x)
        (-90, (H, W), (28, 8, 44, 24)),  # clockwise: (x, y) -> (H-1-y, x)
        (270, (H, W), (28, 8, 44, 24)),
        (180, (W, H), (40, 28, 56, 44)),  # (x, y) -> (W-1-x, H-1-y)
        (-180, (W, H), (40, 28, 56, 44)),
    ],
)
def test_rotate_moves_square_exactly(degrees, size, square):
    rotated = ops.rotate(square_image(), degrees)
    assert rotated.size == size
    assert red_bbox(rotated) == square
    assert int((np.asarray(rotated) == RED).all(-1).sum()) == 16 * 16


def test_rotate_45_expands_canvas_and_fills_corners_black():
    rotated = ops.rotate(square_image(), 45)
    assert rotated.size == (80, 80)  # (64 + 48) / sqrt(2) = 79.2, rounded up by PIL
    pixels = np.asarray(rotated)
    # the square's centre (16, 12) is (-16, -12) from the centre; turned 45 degrees CCW it is (-19.8, 2.8)
    assert tuple(pixels[42, 20]) == RED
    assert tuple(pixels[0, 0]) == tuple(pixels[79, 79]) == tuple(pixels[0, 79]) == (0, 0, 0)


def test_rotate_accepts_any_mode_and_returns_rgb():
    for mode in ("L", "RGBA", "P", "1"):
        assert ops.rotate(square_image(mode=mode), 30).mode == "RGB"


def test_rotate_resampling_trades_blended_edges_for_speed():
    """nearest copies pixels (no new colors), bicubic blends the square's edges; right angles never interpolate."""
    colors = {
        name: {tuple(c) for c in np.asarray(ops.rotate(square_image(), 30, resample=name)).reshape(-1, 3)}
        for name in ops.ROTATE_RESAMPLING
    }
    assert colors["nearest"] == {RED, (0, 0, 0)}  # the square and the black background and corners
    assert len(colors["bilinear"]) > 3 and len(colors["bicubic"]) > 3
    assert ops.rotate(square_image(), 90, resample="nearest").tobytes() == ops.rotate(square_image(), 90).tobytes()
    with pytest.raises(
        ToolInputError,
        match=r"resample must be one of \['bicubic', 'bilinear', 'nearest'\], "
        r"got 'cubic'. Did you mean 'bicubic'\?",
    ):
        ops.rotate(square_image(), 30, resample="cubic")


def test_flip_moves_square_exactly():
    assert red_bbox(ops.flip(square_image(), "horizontal")) == (W - 24, 4, W - 8, 20)
    assert red_bbox(ops.flip(square_image(), "vertical")) == (8, H - 20, 24, H - 4)


def test_crop_keeps_pixels_exactly():
    image = square_image(box=(10, 10, 50, 40))
    cropped = ops.crop(image, (5, 5, 55, 45))
    assert cropped.size == (50, 40)
    assert red_bbox(cropped) == (5, 5, 45, 35)
    assert same(cropped, image.crop((5, 5, 55, 45)))


def test_crop_upscales_small_boxes_to_the_minimum_side():
    cropped = ops.crop(square_image(), (8, 4, 22, 11))  # 14x7 inside the red square
    assert cropped.size == (56, 28)  # x4: the shorter side reaches MIN_SIDE = 28
    assert (np.asarray(cropped) == RED).all()


def test_zoom_in_scales_the_box_to_the_target_side():
    zoomed = ops.zoom_in(square_image(), (0, 0, 32, 24), target_side=448)  # x14
    assert zoomed.size == (448, 336)
    pixels = np.asarray(zoomed)
    # the square (8, 4, 24, 20) lands on (112, 56, 336, 280); bicubic blurs one source pixel (14 px) at its edges
    assert (pixels[56 + 14 : 280 - 14, 112 + 14 : 336 - 14] == RED).all()
    outside = np.ones(pixels.shape[:2], bool)
    outside[56 - 14 : 280 + 14, 112 - 14 : 336 + 14] = False
    assert (pixels[outside] == 0).all()


def test_zoom_in_of_uniform_region_is_exact():
    assert (np.asarray(ops.zoom_in(square_image(), SQUARE, target_side=448)) == RED).all()


def test_zoom_in_never_shrinks_a_large_box():
    assert ops.zoom_in(gradient_image((600, 400)), (0, 0, 600, 400), target_side=448).size == (600, 400)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ops.rotate(square_image(), 361), "degrees must be between -360 and 360, got 361"),
        (lambda: ops.rotate(square_image(), "90"), "degrees must be a number, got '90' (a string)"),
        (lambda: ops.flip(square_image(), "horizontally"), "got 'horizontally'. Did you mean 'horizontal'?"),
        (lambda: ops.flip(square_image(), None), "direction must be one of ['horizontal', 'vertical'], got None."),
        (lambda: ops.crop(square_image(), (0, 0, 60, 1)), "the box is 60x1 px; its sides may differ by at most 50x"),
        (lambda: ops.zoom_in(square_image(), (0, 0, 8, 8), target_side=0), "target_side must be between 1 and"),
    ],
)
def test_refusals(call, message):
    with pytest.raises(ToolInputError) as error:
        call()
    assert message in str(error.value)


def test_ops_do_not_modify_their_input():
    image = gradient_image()
    before = np.asarray(image).copy()
    ops.rotate(image, 33)
    ops.flip(image, "vertical")
    ops.crop(image, (1, 1, 40, 40))
    ops.zoom_in(image, (1, 1, 40, 40))
    assert np.array_equal(np.asarray(image), before)


# ---- size bounds (Hypothesis) ---------------------------------------------------------------------------------------

sizes = st.tuples(st.integers(1, 160), st.integers(1, 160))
budgets = st.integers(ops.MIN_MAX_PIXELS, 4 * ops.MIN_MAX_PIXELS)
coordinates = st.one_of(st.floats(-200, 400), st.integers(-200, 400))


@settings(max_examples=60, deadline=None)
@given(size=sizes, degrees=st.floats(-360, 360), max_pixels=budgets)
def test_rotate_any_angle_stays_within_budget(size, degrees, max_pixels):
    rotated = ops.rotate(Image.new("RGB", size, "white"), degrees, max_pixels=max_pixels)
    radians = math.radians(degrees)
    cos, sin = abs(math.cos(radians)), abs(math.sin(radians))
    width, height = size[0] * cos + size[1] * sin, size[0] * sin + size[1] * cos
    assert rotated.width * rotated.height <= max_pixels
    if width * height <= max_pixels * 0.9:  # uncapped: PIL's expanded canvas, within a pixel of the exact size
        assert abs(rotated.width - width) <= 2 and abs(rotated.height - height) <= 2


@settings(max_examples=60, deadline=None)
@given(
    size=sizes,
    box=st.tuples(coordinates, coordinates, coordinates, coordinates),
    target_side=st.integers(1, 2048),
    max_pixels=budgets,
)
def test_crop_and_zoom_answer_or_refuse_within_budget(size, box, target_side, max_pixels):
    image = Image.new("RGB", size, "white")
    for result in (
        lambda: ops.crop(image, box, max_pixels=max_pixels),
        lambda: ops.zoom_in(image, box, target_side=target_side, max_pixels=max_pixels),
    ):
        try:
            out = result()
        except ToolInputError:
            continue
        assert out.width * out.height <= max_pixels
        assert min(out.size) >= ops.MIN_SIDE
        assert (np.asarray(out) == 255).all()


def test_hostile_zoom_is_bounded_before_allocation():
    zoomed = ops.zoom_in(Image.new("RGB", (4000, 3000)), (0, 0, 1, 1), target_side=8192, max_pixels=ops.MIN_MAX_PIXELS)
    assert zoomed.size == (197, 197)  # floor(sqrt(39200)): the 1x1 box is never upscaled to 8192x8192 first


def test_distinct_images_are_found_by_content_with_their_raw_bytes():
    from verl_mm_tools.ops.transform import distinct_image_bytes

    red, other_red = Image.new("RGB", (4, 3), (255, 0, 0)), Image.new("RGB", (4, 3), (255, 0, 0))
    turned = red.rotate(90, expand=True)  # 3 x 4: the same bytes as a 4 x 3 red image, another image
    grey = Image.new("L", (4, 3), 76)
    found = distinct_image_bytes([red, other_red, turned, grey])
    assert len(found) == 3 and sorted(found.values()) == [36, 36, 36]
    assert distinct_image_bytes([]) == {}
