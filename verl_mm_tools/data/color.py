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

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.errors import ConfigError

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


@dataclass(frozen=True)
class ColorSample:
    image: Image.Image
    color: str
    digest: str  # sha256 of the pixels: equal digests mean the same picture


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


def color_samples(count: int, seed: int, *, exclude: frozenset[str] = frozenset()) -> list[ColorSample]:
    """``count`` distinct pictures, none in ``exclude``, colors alternating in the order of ``COLORS``."""
    rng = random.Random(seed)
    samples, seen = [], set(exclude)
    colors = list(COLORS)
    for _ in range(count * 100):
        if len(samples) == count:
            return samples
        color = colors[len(samples) % len(colors)]
        picture = color_picture(rng, color)
        digest = hashlib.sha256(picture.tobytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            samples.append(ColorSample(picture, color, digest))
    raise ConfigError(f"could not draw {count} distinct color pictures (seed {seed}); ask for fewer samples")


def _rows(samples: list[ColorSample], split: str, agent_name: str) -> Iterator[dict]:
    for index, sample in enumerate(samples):
        extra_info = {"split": split, "index": index, "color": sample.color, "image_sha256": sample.digest}
        yield image_row(DATA_SOURCE, PROMPT, sample.image, sample.color, extra_info, agent_name)


def write_color_dataset(out_dir: str | Path, *, train_size: int = 64, val_size: int = 16, seed: int = 0,
                        agent_name: str = "mm_tool") -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; returns their paths."""
    if train_size < 1 or val_size < 1:
        raise ConfigError(f"color dataset sizes must be >= 1, got train_size={train_size}, val_size={val_size}")
    out = Path(out_dir)
    train = color_samples(train_size, seed)
    val = color_samples(val_size, seed + VAL_SEED_OFFSET, exclude=frozenset(sample.digest for sample in train))
    return (write_parquet(_rows(train, "train", agent_name), out / "train.parquet"),
            write_parquet(_rows(val, "val", agent_name), out / "val.parquet"))
