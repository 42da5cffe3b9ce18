"""The compact image form (issue #59) on every family's real processor: the resized pixels rebuild the processor's
output tensor for tensor (``torch.equal``, same keys and dtypes), alone and in a batch of other sizes, for RGB, RGBA,
grey, tiny (upscaled) and large (downscaled) images, at 1 byte per resized byte against the float output's 4 to 8."""

from __future__ import annotations

import functools
import io
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from verl_mm_tools.compact_form import CompactImageError, NotCompactable, ProcessorSpec, SharedPixels, content_key
from verl_mm_tools.compact_image import (
    IMAGE_KEY,
    PIXEL_PREFIX,
    REF_KEY,
    CompactHeader,
    CompactImage,
    CompactImages,
    ImageRef,
    compact_image,
    expanded,
    expanded_inputs,
)
from verl_mm_tools.families.catalog import FAMILIES
from verl_mm_tools.tiny import tiny_model_path

pytestmark = pytest.mark.integration  # every family's tiny model and processor


@functools.cache
def image_processor(family: str):
    from verl.utils import hf_processor

    return hf_processor(str(tiny_model_path(family=family))).image_processor


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA").convert(mode)


IMAGES = {
    "rgb": noise(517, 300),
    "rgba": noise(200, 333, "RGBA", seed=1),
    "grey": noise(120, 90, "L", seed=2),
    "tiny": noise(5, 7, seed=3),
    "large": noise(1500, 1100, seed=4),
}


def assert_same_output(got, want) -> None:
    assert sorted(got.keys()) == sorted(want.keys())
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", IMAGES)
def test_the_resized_pixels_rebuild_the_processors_output_exactly(family, name):
    processor = image_processor(family)
    compact, output = compact_image(processor, IMAGES[name], return_tensors="pt")
    assert_same_output(output, processor(images=[IMAGES[name]], return_tensors="pt"))
    assert compact.pixels.dtype == torch.uint8 and compact.pixels.ndim == 3 and compact.pixels.shape[0] == 3
    assert_same_output(expanded(processor, [compact]), output)
    float_bytes = output["pixel_values"].numel() * output["pixel_values"].element_size()
    assert compact.nbytes == compact.pixels[0].numel() * 3
    assert float_bytes >= 4 * compact.nbytes  # float32; Qwen-VL and GLM-V: two frames, so 8x


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_of_sizes_expands_to_the_processors_output_for_the_batch(family):
    processor = image_processor(family)
    images = list(IMAGES.values())
    compacts = [compact_image(processor, image, return_tensors="pt")[0] for image in images]
    assert_same_output(expanded(processor, compacts), processor(images=images, return_tensors="pt"))


def test_the_call_arguments_are_kept_and_used_again():
    processor = image_processor("qwen2_5_vl")
    arguments = {"return_tensors": "pt", "max_pixels": 112 * 112, "min_pixels": 28 * 28}
    compact, output = compact_image(processor, IMAGES["large"], **arguments)
    assert tuple(compact.pixels.shape) == (3, 84, 112)  # the call's own bounds, not the processor's
    assert dict(compact.arguments) == arguments
    assert_same_output(expanded(processor, [compact]), output)
    other = compact_image(processor, IMAGES["rgb"], return_tensors="pt")[0]
    with pytest.raises(ValueError, match="different processor arguments cannot be expanded together"):
        expanded(processor, [compact, other])


def test_a_processor_without_a_known_resize_step_is_refused_by_name():
    from transformers import CLIPImageProcessor

    with pytest.raises(NotCompactable, match="CLIPImageProcessor has no known resize step"):
        compact_image(CLIPImageProcessor(), IMAGES["rgb"])
    with pytest.raises(ValueError, match="needs at least one compact image"):
        expanded(image_processor("qwen2_vl"), [])
    assert CompactImage(torch.zeros(3, 2, 2, dtype=torch.uint8)).nbytes == 12


def sample_inputs(family: str, images: list[Image.Image], name: str = "row 7"):
    """A sample's multi_modal_inputs as the fixed worker sends them: the token keys of the processor's output and
    the compact images; and verl's own inputs for the same images."""
    processor = image_processor(family)
    made = [compact_image(processor, image, return_tensors="pt")[0] for image in images]
    own = processor(images=images, return_tensors="pt")
    tokens = {key: value for key, value in own.items() if not key.startswith(PIXEL_PREFIX)}
    header = CompactHeader(ProcessorSpec.of(processor), {"return_tensors": "pt"}, name)
    return {**tokens, **CompactImages(header, tuple(each.pixels for each in made)).inputs()}, dict(own)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_sample_expands_in_another_process_to_verls_own_inputs(family):
    """The header rebuilds the processor from its class and config: expanded in a fresh process (as in the
    trainer's worker), the sample's inputs equal the processor's own output, tensor for tensor."""
    inputs, own = sample_inputs(family, [IMAGES["rgb"], IMAGES["grey"]])
    buffer = io.BytesIO()
    torch.save(inputs, buffer)
    script = (
        "import io, sys, torch\n"
        "from verl_mm_tools.compact_image import expanded_inputs\n"
        "inputs = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)\n"
        "out = io.BytesIO(); torch.save(expanded_inputs(inputs), out); sys.stdout.buffer.write(out.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], input=buffer.getvalue(), capture_output=True, check=True)
    got = torch.load(io.BytesIO(done.stdout), weights_only=True)
    assert_same_output(got, own)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_expands_an_image_its_samples_share_once_to_verls_own_inputs(family):
    """Three samples of one batch (a trajectory's per-turn samples: 1, 2, then 3 images, the first shown by all):
    with the batch's expansions shared, each distinct image is expanded once (3 of the 6 the samples show), and each
    sample gets verl's own inputs for its images, tensor for tensor. Samples that share no tensor object still share
    the expansion: it is keyed by content, as TransferQueue gives every sample its own copy."""
    shown = [["rgb"], ["rgb", "grey"], ["rgb", "grey", "tiny"]]
    samples = [sample_inputs(family, [IMAGES[name] for name in names]) for names in shown]
    expansions: dict = {}
    for inputs, own in samples:
        assert_same_output(expanded_inputs(inputs, expansions), own)
    assert len(expansions) == 3
    assert {key[2] for key in expansions} == {
        content_key(compact_image(image_processor(family), IMAGES[name])[0].pixels) for name in ("rgb", "grey", "tiny")
    }


def test_a_sample_refers_to_an_image_another_carries_and_a_wrong_reference_stops_naming_it():
    """A reference in place of image 1 (``ImageRef``, as the v1 trainer's samples carry them): parsed back exactly,
    it carries no bytes, and with the referred pixels the sample expands to verl's own inputs. Without a reader, with
    another image, or malformed, it stops naming the sample."""
    inputs, own = sample_inputs("qwen2_5_vl", [IMAGES["rgb"], IMAGES["grey"]])
    first, grey = CompactImages.from_inputs(inputs).pixels
    ref = ImageRef("train", "g_0_0", 3, content_key(grey))
    referring = {key: value for key, value in inputs.items() if key != f"{IMAGE_KEY}1"}
    referring[f"{REF_KEY}1"] = ref.tensor
    parsed = CompactImages.from_inputs(referring)
    assert parsed.pixels == (first, ref) and parsed.nbytes == first.numel()
    assert_same_output(expanded_inputs(referring, resolve={ref: grey}.__getitem__), own)
    with pytest.raises(CompactImageError, match="sample row 7 refers to image 3 of the sample 'g_0_0' in .*'train'"):
        expanded_inputs(referring)
    with pytest.raises(CompactImageError, match="sample row 7 refers to .*, which holds another image"):
        expanded_inputs(referring, resolve=lambda _: first)
    for bad, problem in (
        (b'{"key": 1}', "holds {'key': 1}; expected the fields"),
        (b"\xff", "is not UTF-8 JSON"),
        (ref.tensor.tolist()[:-1], "is not UTF-8 JSON"),
    ):
        broken = {**referring, f"{REF_KEY}1": torch.tensor(list(bad), dtype=torch.uint8)}
        with pytest.raises(CompactImageError, match=f"sample row 7: {REF_KEY}1 {re.escape(problem)}"):
            CompactImages.from_inputs(broken)
    with pytest.raises(CompactImageError, match="sample row 7: its compact images cannot be expanded: its keys"):
        CompactImages.from_inputs({**inputs, f"{REF_KEY}1": ref.tensor})  # both the image and a reference


def test_identical_images_are_one_tensor_in_a_process_and_held_weakly():
    """``SharedPixels`` answers an image whose content it holds with the tensor it holds (the same object, so a
    pickle of the samples that show it carries it once), another content or shape with the caller's own tensor; it
    keeps no image alive."""
    import gc
    import pickle

    shared = SharedPixels()
    first = torch.arange(24, dtype=torch.uint8).reshape(3, 2, 4)
    assert shared.shared(first) is first
    assert shared.shared(first.clone()) is first and shared.hits == 1
    reshaped = first.clone().reshape(3, 4, 2)
    assert shared.shared(reshaped) is reshaped  # the same bytes in another shape: another image
    other = first.clone()
    other[0, 0, 0] = 99
    assert shared.shared(other) is other and shared.hits == 1
    samples = [{"vmt_compact_image_0": shared.shared(first.clone())} for _ in range(4)]
    received = pickle.loads(pickle.dumps(samples, protocol=5))
    assert len({id(sample["vmt_compact_image_0"]) for sample in received}) == 1
    del first, samples
    gc.collect()
    fresh = torch.arange(24, dtype=torch.uint8).reshape(3, 2, 4)
    assert shared.hits == 5
    assert shared.shared(fresh) is fresh and shared.hits == 5  # the first one is gone with its holders


def test_verls_function_cannot_read_compact_images():
    """The proof of the compact images' fix (``adaptations/fixes/compact_images.py``): verl's own
    extract_multi_modal_inputs joins a sample's compact images as if they were model inputs and gives no pixel values
    (the model would see no image); the fixed one gives what verl's own pass gives."""
    from verl.utils.model import extract_multi_modal_inputs

    inputs, own = sample_inputs("qwen2_5_vl", [IMAGES["rgb"]])
    verls = extract_multi_modal_inputs.__wrapped__([inputs])
    assert "pixel_values" not in verls and "vmt_compact_image_0" in verls
    assert_same_output(extract_multi_modal_inputs([None, inputs], indices=[1]), extract_multi_modal_inputs([own]))


def header_tensor(**fields) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(fields).encode()), dtype=torch.uint8)


def test_a_compact_form_that_cannot_be_expanded_exactly_stops_naming_the_sample():
    inputs, _ = sample_inputs("qwen2_5_vl", [IMAGES["rgb"], IMAGES["tiny"]], name="uid-42")
    first, second = inputs["vmt_compact_image_0"], inputs["vmt_compact_image_1"]
    header = json.loads(bytes(inputs["vmt_compact_header"].tolist()))
    cases = {
        "image 0 is torch.float32 (3, 168, 280), not a uint8 tensor": {**inputs, "vmt_compact_image_0": first.float()},
        "image 1 has shape (5, 28, 28)": {**inputs, "vmt_compact_image_1": torch.zeros(5, 28, 28, dtype=torch.uint8)},
        "expected vmt_compact_header and, for each image i from 0, vmt_compact_image_i or vmt_compact_ref_i": {
            key: value
            for key, value in {**inputs, "vmt_compact_image_2": second}.items()
            if key != "vmt_compact_image_1"
        },
        "expand to other ['image_grid_thw'] than its token ids": {
            **inputs,
            "vmt_compact_image_0": second,
            "vmt_compact_image_1": first,
        },
        "'CLIPImageProcessor', which this package cannot expand": {
            **inputs,
            "vmt_compact_header": header_tensor(**{**header, "processor": "CLIPImageProcessor"}),
        },
        "it carries both compact images and ['pixel_values']": {**inputs, "pixel_values": torch.zeros(1)},
    }
    for problem, sample in cases.items():
        with pytest.raises(CompactImageError) as raised:
            expanded_inputs(sample)
        assert "uid-42" in str(raised.value) and problem in str(raised.value), str(raised.value)
    unnamed = {
        "vmt_compact_header is not UTF-8 JSON": {
            **inputs,
            "vmt_compact_header": torch.tensor([255], dtype=torch.uint8),
        },
        "vmt_compact_header is not a 1-D uint8 tensor: torch.int64 (2,)": {
            **inputs,
            "vmt_compact_header": torch.tensor([1, 2]),
        },
        "expected the fields ['arguments', 'config', 'processor', 'sample']": {
            **inputs,
            "vmt_compact_header": header_tensor(processor="x"),
        },
        "compact images without their vmt_compact_header": {"vmt_compact_image_0": first},
    }
    for problem, sample in unnamed.items():
        with pytest.raises(CompactImageError, match=re.escape(problem)):
            expanded_inputs(sample)
    assert expanded_inputs({"image_grid_thw": 1}) == {"image_grid_thw": 1}  # no compact images: as it is
