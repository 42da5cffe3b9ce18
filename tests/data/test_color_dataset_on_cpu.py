"""The learning-proof task: red or blue pictures whose label is their color, alternating rows, disjoint train/val
pictures, and rows that verl's own RLHFDataset turns into a 64-image-token prompt."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from PIL import Image

from verl_mm_tools.data.color import COLORS, DATA_SOURCE, IMAGE_SIDE, JITTER, QUESTION, write_color_dataset
from verl_mm_tools.errors import ConfigError


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("color")
    train, val = write_color_dataset(out, train_size=12, val_size=6, seed=2)
    return out, pd.read_parquet(train), pd.read_parquet(val)


def picture(row) -> Image.Image:
    return Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")


def test_the_label_is_the_color_most_of_the_picture_has(written):
    _, train, val = written
    for frame in (train, val):
        for _, row in frame.iterrows():
            label = row["reward_model"]["ground_truth"]
            assert label == row["extra_info"]["color"] and label in COLORS
            image = picture(row)
            assert image.size == (IMAGE_SIDE, IMAGE_SIDE)
            (count, dominant), (_, shape) = sorted(image.getcolors(IMAGE_SIDE**2), reverse=True)  # exactly two
            # the gray shape fits in a square of side < IMAGE_SIDE / 2: the color covers more than 3/4
            assert count > IMAGE_SIDE**2 * 3 / 4 and shape[0] == shape[1] == shape[2]
            assert all(abs(value - target) <= JITTER for value, target in zip(dominant, COLORS[label], strict=True))


def test_rows_alternate_colors_so_every_even_batch_is_balanced(written):
    _, train, val = written
    for frame in (train, val):
        labels = [row["ground_truth"] for row in frame["reward_model"]]
        assert labels == [("red", "blue")[index % 2] for index in range(len(frame))]


def test_validation_holds_no_training_picture_and_seeds_repeat(written, tmp_path):
    out, train, val = written
    train_digests = {info["image_sha256"] for info in train["extra_info"]}
    val_digests = {info["image_sha256"] for info in val["extra_info"]}
    assert len(train_digests) == 12 and len(val_digests) == 6 and not train_digests & val_digests
    again, _ = write_color_dataset(tmp_path, train_size=12, val_size=6, seed=2)
    assert again.read_bytes() == (out / "train.parquet").read_bytes()


def test_verls_dataset_builds_a_64_token_image_prompt(written, tiny_tokenizer, tiny_processor):
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
    item = RLHFDataset(str(out / "train.parquet"), tiny_tokenizer, config, tiny_processor)[0]
    content = item["raw_prompt"][0]["content"]
    assert [part["type"] for part in content] == ["image", "text"] and content[1]["text"] == QUESTION
    assert written[1].iloc[0]["data_source"] == DATA_SOURCE
    inputs = tiny_processor(
        text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[picture(written[1].iloc[0])], return_tensors="pt"
    )
    assert inputs["image_grid_thw"].tolist() == [[1, 16, 16]]  # 16x16 patches of 14 px = 8x8 merged tokens
    assert int((inputs["input_ids"] == tiny_tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()) == 64


def test_sizes_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="sizes must be >= 1, got train_size=0"):
        write_color_dataset(tmp_path, train_size=0)
