"""Hostile images in a dataset's prompts and in tool outputs, through verl's AgentLoopWorker: decompression bombs
(headers claiming 100 to 900 Mpx, a real zlib bomb), 1x1, 20000x20, CMYK/RGBA/P/I;16/I/F/LA/1 modes, truncated,
garbage and PostScript bytes. Each is normalized (RGB, sized by smart_resize) or refused: a prompt image with a
masked, counted sample whose error names it; a tool image with a note the model reads. Never a crash, never a
silent drop, and no bomb is ever decoded."""

from __future__ import annotations

import base64
import io
import json
import struct
import time
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from reliability_helpers import ScriptedTool, marked_prompt, run_batch, trajectory_violations
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as processor_resize
from verl.tools.schemas import ToolResponse

from verl_mm_tools.agent_loop.budget import ImageGeometry
from verl_mm_tools.files import MAX_DECODE_PIXELS, decode_image, to_rgb
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.step_metrics import aggregate_metrics

ANSWER = "<answer>1</answer><|im_end|>"


# ----- hostile image data ------------------------------------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A grayscale PNG whose header claims width x height; its pixel data stops after a few rows."""
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")


def zlib_bomb(side: int) -> bytes:
    """A complete, valid side x side grayscale PNG of zeros: ~80 KB that decode to side**2 bytes."""
    compressor, row = zlib.compressobj(9), b"\0" * (side + 1)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
        + _chunk(b"IDAT", data)
        + _chunk(b"IEND", b"")
    )


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def noise(size=(64, 48)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def lazily_opened(data: bytes) -> Image.Image:
    """As verl's dataset hands images over: ``Image.open`` on the row's bytes, not yet decoded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))


def sixteen_bit() -> Image.Image:
    """A 16-bit gradient from 0 to 60000: a plain convert("RGB") clips almost all of it to white."""
    return Image.fromarray(np.tile(np.linspace(0, 60000, 64).astype(np.uint16), (48, 1)))


def with_mode(mode: str) -> Image.Image:
    image = noise().convert(mode)
    if mode == "P":
        image.info["transparency"] = 0
    return image


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
BOMB = zlib_bomb(9000)  # 81 Mpx: over the 64 Mpx cap, under PIL's own 89 Mpx warning

# name: (image entry of the prompt, refusal error prefix or None when normalized)
PROMPT_CASES = {
    "bomb header 30000x30000": ({"bytes": png_claiming(30000, 30000)}, "refused as a decompression bomb"),
    "bomb header 10000x10000, opened": (
        {"image": lazily_opened(png_claiming(10000, 10000))},
        "10000x10000 px is outside",
    ),
    "zlib bomb 9000x9000": ({"bytes": BOMB}, "9000x9000 px is outside"),
    "zlib bomb as data URI": (
        {"image": "data:image/png;base64," + base64.b64encode(BOMB).decode()},
        "9000x9000 px is outside",
    ),
    "truncated PNG": ({"bytes": encoded(noise())[:300]}, "cannot be decoded"),
    "truncated JPEG, opened": ({"image": lazily_opened(half(encoded(noise(), "JPEG")))}, "cannot be decoded"),
    "garbage bytes": ({"bytes": b"\x00\x01not an image" * 20}, "cannot be decoded"),
    "PostScript": ({"bytes": EPS}, "cannot be decoded"),
    "bad data URI": ({"image": "data:image/png;base64,@@@"}, "the data: URI is not valid base64"),
    "20000x20": ({"image": Image.new("RGB", (20000, 20))}, "20000x20 px is more elongated than the 200:1"),
    "no image at all": ({"image": None}, "expected an image, a path or bytes, got NoneType"),
    "1x1": ({"image": Image.new("RGB", (1, 1), "red")}, None),
    "20x3000": ({"image": Image.new("RGB", (20, 3000), "red")}, None),
    "I;16": ({"image": sixteen_bit()}, None),
    **{mode: ({"image": with_mode(mode)}, None) for mode in ["CMYK", "RGBA", "P", "I", "F", "LA", "1", "PA"]},
    "RGBA as PNG bytes": ({"bytes": encoded(noise().convert("RGBA"))}, None),
}


# ----- prompt images -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt_batch(tiny_model_dir, tmp_path_factory):
    names = list(PROMPT_CASES)
    prompts = []
    for index, name in enumerate(names):
        entry = {"type": "image", **PROMPT_CASES[name][0]}
        prompts.append([{"role": "user", "content": [entry, {"type": "text", "text": f"[sample {index}] {name}"}]}])
    started = time.perf_counter()
    batch = run_batch(
        tiny_model_dir,
        tmp_path_factory.mktemp("hostile"),
        tools=[],
        prompts=prompts,
        script=lambda sample, turn, images: ANSWER,
    )
    return names, batch, time.perf_counter() - started


def test_hostile_prompt_images_are_refused_naming_the_sample_or_normalized(prompt_batch):
    names, batch, seconds = prompt_batch
    assert len(batch.output) == len(names)  # nothing dropped
    for index, name in enumerate(names):
        refusal, error = PROMPT_CASES[name][1], batch.field("mm_tool/error")[index]
        assert batch.field("mm_tool/masked")[index] == int(refusal is not None), (name, error)
        if refusal is not None:
            assert error.startswith(f"ImageInputError: sample {index}, prompt image 1: "), (name, error)
            assert refusal in error, (name, error)
        assert trajectory_violations(batch, index) == [], name
    refused = sum(PROMPT_CASES[name][1] is not None for name in names)
    assert aggregate_metrics(SampleFields.every_row(batch.output.non_tensor_batch))["mm_tool/masked/count"] == float(
        refused
    )
    assert seconds < 30  # no bomb was decoded


def test_normalized_prompt_images_reach_the_model_in_rgb_sized_by_smart_resize(prompt_batch):
    names, batch, _ = prompt_batch
    for index, name in enumerate(names):
        if PROMPT_CASES[name][1] is None:
            [image] = batch.server.generations[index][0].images
            assert image.mode == "RGB" and image.width % 28 == 0 and image.height % 28 == 0, name
    sixteen = batch.server.generations[names.index("I;16")][0].images[0]
    assert np.asarray(sixteen).std() > 50  # a gradient, not the white a plain conversion makes
    transparent = batch.server.generations[names.index("RGBA")][0].images[0]
    assert transparent.getpixel((0, 0)) == to_rgb(with_mode("RGBA")).resize(transparent.size).getpixel((0, 0))


# ----- tool outputs -------------------------------------------------------------------------------------------------

TOOL_CASES = {
    "zlib bomb": (
        lambda: lazily_opened(BOMB),
        f"more than the {MAX_DECODE_PIXELS} px any image may have; it was not decoded",
    ),
    "bomb header": (lambda: lazily_opened(png_claiming(10000, 10000)), "more than the"),
    "truncated PNG": (
        lambda: lazily_opened(encoded(noise())[:300]),
        "the tool produced an image that cannot be decoded",
    ),
    "20000x20": (lambda: Image.new("RGB", (20000, 20)), "absolute aspect ratio must be smaller than 200"),
    "1x1": (lambda: Image.new("RGB", (1, 1)), None),
    "I;16": (sixteen_bit, None),
    **{mode: (lambda mode=mode: with_mode(mode), None) for mode in ["CMYK", "RGBA", "P", "I", "F", "LA", "1"]},
}


async def hostile_image(parameters):
    kind = list(TOOL_CASES)[parameters["x"]]
    return ToolResponse(image=[TOOL_CASES[kind][0]()], text=f"a {kind} image"), 0.0, {}


@pytest.fixture(scope="module")
def tool_batch(tiny_model_dir, tmp_path_factory):
    names = list(TOOL_CASES)

    def call(index):
        return f"<tool_call>\n{json.dumps({'name': 'hostile', 'arguments': {'x': index}})}\n</tool_call><|im_end|>"

    prompts = [marked_prompt(index, name, [noise()]) for index, name in enumerate(names)]
    batch = run_batch(
        tiny_model_dir,
        tmp_path_factory.mktemp("hostile_tools"),
        tools=[ScriptedTool("hostile", hostile_image)],
        prompts=prompts,
        script=lambda sample, turn, images: [call(sample), ANSWER][turn],
        prompt_length=1024,
    )
    return names, batch


def test_hostile_tool_images_are_refused_with_a_note_or_normalized(tool_batch):
    names, batch = tool_batch
    assert batch.field("mm_tool/masked") == [0] * len(names)
    for index, name in enumerate(names):
        refusal = TOOL_CASES[name][1]
        assert trajectory_violations(batch, index) == [], name
        shown = batch.server.generations[index][1].images
        response = batch.worker.tokenizer.decode(batch.output.batch["responses"][index])
        if refusal is None:
            assert len(shown) == 2 and shown[1].mode == "RGB" and shown[1].width % 28 == 0, name
        else:
            assert len(shown) == 1, name
            assert refusal in response, (name, response)
            assert batch.field("mm_tool/budget_refusals")[index] == 1
    sixteen = batch.server.generations[names.index("I;16")][1].images[1]
    assert np.asarray(sixteen).std() > 50


# ----- the decoder itself -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (png_claiming(30000, 30000), "refused as a decompression bomb"),
        (BOMB, f"9000x9000 px is outside 1..{MAX_DECODE_PIXELS} px"),
        (encoded(noise())[:300], "cannot be decoded (OSError: image file is truncated"),
        (EPS, "cannot be decoded (UnidentifiedImageError"),
        (b"", "cannot be decoded (UnidentifiedImageError"),
    ],
    ids=["bomb-header", "zlib-bomb", "truncated", "postscript", "empty"],
)
def test_decode_image_refuses_with_the_source_named(data, message):
    from verl_mm_tools.errors import ImageInputError

    with pytest.raises(ImageInputError) as raised:
        decode_image(data, source="row 7")
    assert str(raised.value).startswith("row 7: ") and message in str(raised.value)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "LA", "P", "PA", "CMYK", "L", "1", "I", "I;16", "F", "YCbCr", "HSV"])
def test_to_rgb_gives_rgb_of_the_same_size_for_every_mode(mode):
    image = sixteen_bit() if mode == "I;16" else with_mode(mode)
    converted = to_rgb(image)
    assert converted.mode == "RGB" and converted.size == image.size


def test_sixteen_bit_and_float_images_are_stretched_not_clipped():
    assert np.asarray(to_rgb(sixteen_bit()))[0, :, 0].tolist() == np.rint(np.linspace(0, 255, 64)).astype(int).tolist()
    floats = Image.fromarray(np.tile(np.linspace(-1.0, 1.0, 64, dtype=np.float32), (4, 1)))
    assert np.asarray(to_rgb(floats))[0, [0, -1], 0].tolist() == [0, 255]


# ----- sizing: what the budget promises holds for any size ----------------------------------------------------------

TINY = ImageGeometry(patch_size=14, merge_size=2, min_pixels=784, max_pixels=50176)
sides = st.integers(1, 6000)


@settings(max_examples=400, deadline=None)
@given(width=sides, height=sides, low=st.integers(784, 8000), span=st.integers(0, 50000))
def test_a_sized_tool_image_lies_within_its_bounds_and_the_processor_keeps_it(width, height, low, span):
    high = min(low + span, TINY.max_pixels)
    low = min(low, high)
    try:
        new_width, new_height = TINY.resized(width, height, low, high)
    except ValueError as error:  # refused, with a reason the model reads
        assert "aspect ratio" in str(error)
        return
    assert low <= new_width * new_height <= high
    assert processor_resize(new_height, new_width, 28, TINY.min_pixels, TINY.max_pixels) == (new_height, new_width)


@settings(max_examples=400, deadline=None)
@given(columns=st.integers(1, 600), rows=st.integers(1, 600))
def test_the_budget_charges_a_prompt_image_what_the_processor_charges(columns, rows):
    """Prompt images reach the budget sized by qwen_vl_utils (whole 28 px tokens); elongated ones over max_pixels
    were charged 0 tokens (its smart_resize floors the short side to 0 px, the processor's keeps one token)."""
    width, height = 28 * columns, 28 * rows
    if max(columns, rows) > 200 * min(columns, rows):
        return
    new_height, new_width = processor_resize(height, width, 28, TINY.min_pixels, TINY.max_pixels)
    assert TINY.tokens(width, height) == (new_width // 28) * (new_height // 28)
