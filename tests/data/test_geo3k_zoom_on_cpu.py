"""geo3k conversion (on a locally built sample with the hub's schema) and the zoom task: parquet that verl's own
RLHFDataset loads, whose images go through the tiny model's processor, and that the mm_tool loop runs."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest
from PIL import Image

from verl_mm_tools.data.common import png_bytes
from verl_mm_tools.data.geo3k import DATA_SOURCE as GEO3K
from verl_mm_tools.data.geo3k import convert_geo3k
from verl_mm_tools.data.zoom import write_zoom_dataset
from verl_mm_tools.errors import ConfigError


def hub_layout_geo3k(root, rows=3):
    """What `huggingface-cli download hiyouga/geometry3k` leaves: data/<split>-00000-of-00001.parquet."""
    (root / "data").mkdir(parents=True)
    for split in ("train", "test"):
        records = [
            {
                "images": [{"bytes": png_bytes(Image.new("RGB", (120, 90), (index * 40, 80, 200))), "path": None}],
                "problem": f"<image>Find x in triangle {index}.",
                "answer": str(3 + index),
            }
            for index in range(rows)
        ]
        pd.DataFrame(records).to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def rlhf_dataset(path, tokenizer, processor):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "image_key": "images",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "cache_dir": str(path.parent / "cache"),
        }
    )
    return RLHFDataset(str(path), tokenizer, config, processor)


def images_of(row, processor):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    images, _ = asyncio.run(RLHFDataset.process_vision_info(row["raw_prompt"], image_patch_size=14, config=None))
    return images


def test_geo3k_converts_the_hub_layout_and_loads_in_verls_dataset(tmp_path, tiny_tokenizer, tiny_processor):
    written = convert_geo3k(hub_layout_geo3k(tmp_path / "hub"), tmp_path / "out", max_attempts=2)
    assert sorted(written) == ["test", "train"]
    frame = pd.read_parquet(written["train"])
    first = frame.iloc[1]
    assert first["data_source"] == GEO3K and first["reward_model"]["ground_truth"] == "4"
    assert first["prompt"][0]["content"].startswith("<image>Find x in triangle 1. You FIRST think")
    assert dict(first["extra_info"]["env"]) == {
        "name": "answer_feedback",
        "reward_fn": "geo3k_reward",
        "max_attempts": 2,
    }
    dataset = rlhf_dataset(written["train"], tiny_tokenizer, tiny_processor)
    assert len(dataset) == 3
    row = dataset[1]
    assert row["agent_name"] == "mm_tool"
    [image] = images_of(row, tiny_processor)
    features = tiny_processor.image_processor(images=[image], return_tensors="pt")
    assert features["image_grid_thw"].tolist() == [[1, 6, 8]]  # 120x90 -> 112x84 (28 px multiples)


def test_geo3k_refuses_a_foreign_layout(tmp_path):
    pd.DataFrame([{"question": "q", "solution": "s"}]).to_parquet(tmp_path / "train.parquet")
    with pytest.raises(ConfigError, match=r"not in the Geometry3K layout: columns \['answer', 'images', 'problem'\]"):
        convert_geo3k(tmp_path, tmp_path / "out")
    with pytest.raises(ConfigError, match="no Geometry3K split found"):
        convert_geo3k(tmp_path / "empty", tmp_path / "out")


def test_zoom_dataset_has_a_small_target_and_loads_in_verls_dataset(tmp_path, tiny_tokenizer, tiny_processor):
    train, val = write_zoom_dataset(tmp_path, train_size=4, val_size=2, seed=3, side=512, target=16)
    frame = pd.read_parquet(train)
    row = frame.iloc[0]
    x1, y1, x2, y2 = row["extra_info"]["target_box"]
    assert (x2 - x1, y2 - y1) == (16, 16)
    assert row["reward_model"]["ground_truth"] in list("0123456789")
    assert row["extra_info"]["reward_fn"] == "exact_answer_reward"
    assert "it is 512x512 px" in row["prompt"][0]["content"]
    val_images = {bytes(r["images"][0]["bytes"]) for r in pd.read_parquet(val).to_dict("records")}
    assert not val_images & {bytes(r["images"][0]["bytes"]) for r in frame.to_dict("records")}
    dataset = rlhf_dataset(train, tiny_tokenizer, tiny_processor)
    [image] = images_of(dataset[0], tiny_processor)
    assert image.size == (504, 504)  # fetch_image rounds 512 to 28 px multiples; the processor then caps it
    features = tiny_processor.image_processor(images=[image], return_tensors="pt")
    assert features["image_grid_thw"].tolist() == [[1, 16, 16]]  # 64 tokens: the digit box is ~1 token wide


def test_zoom_sizes_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="zoom target must be between 8 and side/4=128 px, got 200"):
        write_zoom_dataset(tmp_path, side=512, target=200)


def test_make_data_cli_writes_the_splits(tmp_path, capsys):
    from verl_mm_tools.cli import main

    assert (
        main(
            [
                "make-data",
                "zoom",
                "--out",
                str(tmp_path / "z"),
                "--train-size",
                "2",
                "--val-size",
                "1",
                "--side",
                "256",
                "--target",
                "16",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "make-data",
                "geo3k",
                "--source",
                str(hub_layout_geo3k(tmp_path / "hub", rows=2)),
                "--out",
                str(tmp_path / "g"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.split()
    assert printed == [
        str(tmp_path / "z" / "train.parquet"),
        str(tmp_path / "z" / "val.parquet"),
        str(tmp_path / "g" / "train.parquet"),
        str(tmp_path / "g" / "test.parquet"),
    ]
    assert len(pd.read_parquet(tmp_path / "g" / "test.parquet")) == 2


def test_uniform_rotation_pictures_of_text_and_shapes(tmp_path, tiny_tokenizer, tiny_processor):
    from verl_mm_tools.cli import main

    assert (
        main(
            [
                "make-data",
                "rotation",
                "--out",
                str(tmp_path),
                "--angles",
                "uniform",
                "--side",
                "112",
                "--train-size",
                "12",
                "--val-size",
                "3",
                "--seed",
                "5",
            ]
        )
        == 0
    )
    frame = pd.read_parquet(tmp_path / "train.parquet")
    angles = [int(row["reward_model"]["ground_truth"]) for row in frame.to_dict("records")]
    assert len(set(angles)) > 4 and all(0 <= angle < 360 for angle in angles)
    assert any(angle % 90 for angle in angles)  # not only quarter turns
    assert "between 0 and 359 degrees" in frame.iloc[0]["prompt"][0]["content"]
    val = pd.read_parquet(tmp_path / "val.parquet")
    assert not set(val["extra_info"].map(lambda info: info["image_sha256"])) & set(
        frame["extra_info"].map(lambda info: info["image_sha256"])
    )
    [image] = images_of(rlhf_dataset(tmp_path / "train.parquet", tiny_tokenizer, tiny_processor)[0], tiny_processor)
    assert image.mode == "RGB" and min(image.size) >= 112


def test_make_data_out_on_a_file_is_a_usage_error(tmp_path, capsys):
    from verl_mm_tools.cli import main

    (tmp_path / "file").write_text("mine")
    assert main(["make-data", "rotation", "--out", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == (
        f"verl-mm-tools make-data: error: --out {tmp_path / 'file'} is a file, not a folder; pass a folder (new or "
        "existing) to write the parquet into\n"
    )
    assert (tmp_path / "file").read_text() == "mine"
