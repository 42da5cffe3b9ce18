"""The learn_zoom task's pictures: the centre's checkerboard is the answer, the tiny model's processor averages it away
in the prompt picture, and the zoom_in tool (the task's tool YAML, through the real tool class) shows them."""

from __future__ import annotations

import io
import random

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from verl_mm_tools.data.zoom_color import (
    ANSWER_TILES,
    BOX,
    BOX_ARGUMENTS,
    DATA_SOURCE,
    PATTERNS,
    QUESTION,
    SIDE,
    write_zoom_color_dataset,
    zoom_color_picture,
)
from verl_mm_tools.errors import ConfigError

pytestmark = pytest.mark.integration  # a whole demo dataset


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoom_color")
    train, val = write_zoom_color_dataset(out, train_size=8, val_size=4, seed=3)
    return out, pd.read_parquet(train), pd.read_parquet(val)


def picture(row) -> Image.Image:
    return Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")


def test_the_centre_box_is_the_answers_checkerboard(written):
    _, train, val = written
    for frame in (train, val):
        labels = [row["ground_truth"] for row in frame["reward_model"]]
        assert labels == [("red", "blue")[index % 2] for index in range(len(frame))]  # balanced batches
        for (_, row), label in zip(frame.iterrows(), labels, strict=True):
            assert row["data_source"] == DATA_SOURCE and list(row["extra_info"]["target_box"]) == list(BOX)
            image = picture(row)
            assert image.size == (SIDE, SIDE)
            square, partner = PATTERNS[label]
            tiles = image.crop(ANSWER_TILES)
            assert sorted(tiles.getcolors()) == sorted([(512, square), (512, partner)])  # 32 x 32 px, half each
            box = image.crop(BOX)  # the centre 16 px of those tiles, in phase
            assert sorted(box.getcolors()) == sorted([(128, square), (128, partner)])
            assert box.getpixel((0, 0)) == box.getpixel((1, 1)) == square and box.getpixel((1, 0)) == partner


def test_validation_holds_no_training_picture_and_seeds_repeat(written, tmp_path):
    out, train, val = written
    train_digests = {info["image_sha256"] for info in train["extra_info"]}
    val_digests = {info["image_sha256"] for info in val["extra_info"]}
    assert len(train_digests) == 8 and len(val_digests) == 4 and not train_digests & val_digests
    again, _ = write_zoom_color_dataset(tmp_path, train_size=8, val_size=4, seed=3)
    assert again.read_bytes() == (out / "train.parquet").read_bytes()


def pixels(processor, image: Image.Image) -> tuple[np.ndarray, list]:
    inputs = processor.image_processor(images=[image], return_tensors="pt")
    return inputs["pixel_values"].numpy(), inputs["image_grid_thw"].tolist()


def test_the_processor_shows_the_same_prompt_picture_for_either_answer(tiny_processor):
    """The same picture with either checkerboard in the box (the surroundings drawn from one seed): after the 4x
    downscale to 224 px the model's inputs differ by at most one level of 255 (rounding at the box's corners), against
    the whole scale between the zoomed images."""
    for seed in range(4):
        red, red_grid = pixels(tiny_processor, zoom_color_picture(random.Random(seed), "red"))
        blue, blue_grid = pixels(tiny_processor, zoom_color_picture(random.Random(seed), "blue"))
        assert red_grid == blue_grid == [[1, 16, 16]]  # 224 px: 64 image tokens
        levels = np.abs(red - blue) * np.asarray(tiny_processor.image_processor.image_std).max() * 255
        assert levels.max() < 1.5


def test_zoom_in_on_the_box_shows_the_checkerboard_at_224_px(tiny_processor, tmp_path):
    """The task's zoom_in (its tool YAML, loaded by verl's tool registry) on the box: 14x, 224 px, which the processor
    keeps as it is; each 1 px square becomes one 14 px patch of the vision tower, of its square's colour (within the
    bicubic blur at its edges: 55 levels, against the 180 between the two colours of a pattern)."""
    from verl.tools.tool_registry import initialize_tools_from_config

    from verl_mm_tools.tools.tool_yaml import ZOOM_TOOLS_YAML

    path = tmp_path / "tools.yaml"
    path.write_text(ZOOM_TOOLS_YAML)
    [tool] = initialize_tools_from_config(str(path))
    zoomed = {}
    for color in PATTERNS:
        image, text = tool.apply(zoom_color_picture(random.Random(0), color), **BOX_ARGUMENTS)
        assert image.size == (224, 224) and text == "zoomed in on box (440, 440, 456, 456)"
        patches = np.asarray(image, dtype=float).reshape(16, 14, 16, 14, 3).mean(axis=(1, 3))
        expected = np.array([[PATTERNS[color][(row + column) % 2] for column in range(16)] for row in range(16)])
        assert np.abs(patches - expected).max() < 60
        zoomed[color], grid = pixels(tiny_processor, image)
        assert grid == [[1, 16, 16]]
    std = np.asarray(tiny_processor.image_processor.image_std).min()
    assert np.abs(zoomed["red"] - zoomed["blue"]).max() * std * 255 > 150


def test_verls_dataset_reads_the_rows_with_the_question(written, tiny_tokenizer, tiny_processor):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    out, _, _ = written
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "image_key": "images",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "cache_dir": str(out / "cache"),
        }
    )
    dataset = RLHFDataset(str(out / "train.parquet"), tiny_tokenizer, config, tiny_processor)
    content = dataset[0]["raw_prompt"][0]["content"]
    assert [part["type"] for part in content] == ["image", "text"] and content[1]["text"] == QUESTION


def test_sizes_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="sizes must be >= 1, got train_size=0"):
        write_zoom_color_dataset(tmp_path, train_size=0)
