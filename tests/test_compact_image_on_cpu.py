"""The compact image form (issue #59) on every family's real processor: the resized pixels rebuild the processor's
output tensor for tensor (``torch.equal``, same keys and dtypes), alone and in a batch of other sizes, for RGB, RGBA,
grey, tiny (upscaled) and large (downscaled) images, at 1 byte per resized byte against the float output's 4 to 8."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from PIL import Image

from verl_mm_tools.compact_image import CompactImage, NotCompactable, compact_image, expanded
from verl_mm_tools.families.catalog import FAMILIES
from verl_mm_tools.tiny import tiny_model_path


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
