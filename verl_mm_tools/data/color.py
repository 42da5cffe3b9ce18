"""The learning-proof task of the CPU demo: "what color is this picture?", red or blue, with the rotate tool offered.

The answer depends on the image alone (the question is the same for every row), so a rising reward means the model
learned to look. What makes it learnable by the ~290k-parameter tiny VLM through RL within minutes:

* pictures are 224x224, the tiny processor's largest image (8x8 = 64 image tokens): with 56 px pictures (4 tokens
  among ~500) the policy settled on one answer before it learned to look, in most seeds (in-process stand-in of the
  GRPO update, 150 steps);
* the whole picture carries the color (a gray square or circle on it varies the pictures);
* rows alternate between the colors, so every batch of an even size holds each color equally often (the demo turns
  the dataloader's shuffling off).

The validation split holds no picture of the training split.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from verl_mm_tools.data.common import LabelledPicture, alternating_pictures, image_row, write_two_splits

DATA_SOURCE = "verl_mm_tools/color"
COLORS = {"red": (215, 45, 40), "blue": (40, 70, 215)}  # one token each in the tiny tokenizer
JITTER = 30  # each channel of a picture's color is drawn within +-JITTER of its color's value
IMAGE_SIDE = 224
QUESTION = (
    "What color is this picture? You may call the rotate tool to turn it and look again. Answer red or blue, "
    "as <answer>red</answer>."
)
PROMPT = "<image>" + QUESTION
VAL_SEED_OFFSET = 1_000_003


def color_picture(rng: random.Random, color: str, side: int = IMAGE_SIDE) -> Image.Image:
    """A picture filled with ``color`` (jittered) with a gray square or circle on it."""
    fill = tuple(min(255, max(0, value + rng.randint(-JITTER, JITTER))) for value in COLORS[color])
    image = Image.new("RGB", (side, side), fill)
    gray = rng.randrange(100, 180)
    radius = rng.randrange(side // 8, side // 4)
    x, y = rng.randrange(radius, side - radius), rng.randrange(radius, side - radius)
    shape = rng.choice(("rectangle", "ellipse"))
    getattr(ImageDraw.Draw(image), shape)([x - radius, y - radius, x + radius, y + radius], fill=(gray,) * 3)
    return image


def color_samples(count: int, seed: int, *, exclude: frozenset[str] = frozenset()) -> list[LabelledPicture]:
    """``count`` distinct pictures, none in ``exclude``, colors alternating in the order of ``COLORS``."""
    return alternating_pictures(count, seed, list(COLORS), color_picture, exclude=exclude)


def _row(picture: LabelledPicture, split: str, index: int, agent_name: str) -> dict:
    extra_info = {"split": split, "index": index, "color": picture.label, "image_sha256": picture.digest}
    return image_row(DATA_SOURCE, PROMPT, picture.image, picture.label, extra_info, agent_name)


def write_color_dataset(
    out_dir: str | Path, *, train_size: int = 64, val_size: int = 16, seed: int = 0, agent_name: str = "mm_tool"
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; returns their paths."""
    return write_two_splits(
        out_dir,
        "color",
        color_samples,
        lambda picture, split, index: _row(picture, split, index, agent_name),
        train_size=train_size,
        val_size=val_size,
        seed=seed,
        val_seed_offset=VAL_SEED_OFFSET,
    )
