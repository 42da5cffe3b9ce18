"""The synthetic rotation task: seeded, disjoint train/val pictures, labels that are the true rotation, and rows that
verl's own RLHFDataset turns into an image-bearing raw prompt."""

from __future__ import annotations

import hashlib
import io

import pandas as pd
import pytest
from PIL import Image

from verl_mm_tools.data.rotation import ANGLES, DATA_SOURCE, QUESTION, rotation_samples, write_rotation_dataset
from verl_mm_tools.errors import ConfigError


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("rotation")
    train, val = write_rotation_dataset(out, train_size=24, val_size=12, seed=3)
    return out, pd.read_parquet(train), pd.read_parquet(val)


def picture(row) -> Image.Image:
    return Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")


def test_the_label_is_the_rotation_that_was_applied(written):
    _, train, val = written
    for frame in (train, val):
        for _, row in frame.iterrows():
            angle = int(row["reward_model"]["ground_truth"])
            assert angle == row["extra_info"]["angle"] and angle in ANGLES
            upright = picture(row).rotate(-angle, expand=True)  # multiples of 90 degrees are exact permutations
            assert hashlib.sha256(upright.tobytes()).hexdigest() == row["extra_info"]["image_sha256"]


def test_validation_holds_no_training_picture(written):
    _, train, val = written
    train_digests = {info["image_sha256"] for info in train["extra_info"]}
    val_digests = {info["image_sha256"] for info in val["extra_info"]}
    assert len(train_digests) == 24 and len(val_digests) == 12
    assert not train_digests & val_digests


def test_same_seed_same_bytes_other_seed_other_pictures(written, tmp_path):
    out, train, _ = written
    again, _ = write_rotation_dataset(tmp_path / "again", train_size=24, val_size=12, seed=3)
    assert again.read_bytes() == (out / "train.parquet").read_bytes()
    other = rotation_samples(24, seed=4)
    assert not {sample.digest for sample in other} & {info["image_sha256"] for info in train["extra_info"]}


def test_rows_have_the_columns_verl_and_the_rewards_read(written):
    _, train, _ = written
    row = train.iloc[0]
    assert row["data_source"] == DATA_SOURCE and row["agent_name"] == "mm_tool"
    assert list(row["prompt"]) == [{"role": "user", "content": "<image>" + QUESTION}]
    assert picture(row).size == (56, 56)
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0


def test_verls_dataset_builds_an_image_prompt_from_a_row(written, tiny_tokenizer, tiny_processor):
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
    dataset = RLHFDataset(str(out / "val.parquet"), tiny_tokenizer, config, tiny_processor)
    item = dataset[0]
    content = item["raw_prompt"][0]["content"]
    assert [part["type"] for part in content] == ["image", "text"]
    assert content[1]["text"] == QUESTION
    assert item["agent_name"] == "mm_tool"


def test_sizes_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="sizes must be >= 1, got train_size=0"):
        write_rotation_dataset(tmp_path, train_size=0, val_size=4)
