"""A V*-like zoom-in task: a large image with one small digit in a coloured box, too small to read at the resolution
the model sees the whole image in; the zoom_in (or crop) tool makes it readable.

Each row's ground truth is the digit; ``extra_info`` holds the target box (absolute pixels), so an analysis can
check whether the model zoomed where the digit is. Answers are scored with ``exact_answer_reward``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.errors import ConfigError

DATA_SOURCE = "verl_mm_tools/zoom"
COLORS = {"red": (220, 30, 30), "green": (20, 160, 60), "blue": (30, 60, 220), "orange": (240, 140, 0)}
PROMPT = (
    "<image>Somewhere in this picture a small {color} box holds one digit. Which digit is it? Use the zoom_in tool "
    "with a box in pixels of the image (it is {width}x{height} px) to look closer. Answer as <answer>7</answer>."
)


@dataclass(frozen=True)
class ZoomSample:
    image: Image.Image
    digit: int
    color: str
    box: tuple[int, int, int, int]


def zoom_sample(rng: random.Random, side: int, target: int) -> ZoomSample:
    """A textured ``side`` x ``side`` picture with a ``target``-pixel box holding a digit at a random place."""
    image = Image.new("RGB", (side, side), tuple(rng.randrange(150, 230) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(side // 8):  # clutter, so the box is not trivially the only feature
        x, y, r = rng.randrange(side), rng.randrange(side), rng.randrange(2, side // 40 + 3)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(rng.randrange(90, 256) for _ in range(3)))
    color = rng.choice(sorted(COLORS))
    x, y = rng.randrange(0, side - target), rng.randrange(0, side - target)
    box = (x, y, x + target, y + target)
    draw.rectangle(box, fill=(255, 255, 255), outline=COLORS[color], width=max(1, target // 10))
    digit = rng.randrange(10)
    font = ImageFont.load_default(size=max(8, int(target * 0.7)))
    draw.text((x + target / 2, y + target / 2), str(digit), fill=(0, 0, 0), font=font, anchor="mm")
    return ZoomSample(image, digit, color, box)


def _rows(samples: list[ZoomSample], split: str, agent_name: str) -> Iterator[dict]:
    for index, sample in enumerate(samples):
        width, height = sample.image.size
        prompt = PROMPT.format(color=sample.color, width=width, height=height)
        extra_info = {
            "split": split,
            "index": index,
            "target_box": list(sample.box),
            "color": sample.color,
            "reward_fn": "exact_answer_reward",
        }
        yield image_row(DATA_SOURCE, prompt, sample.image, str(sample.digit), extra_info, agent_name)


def write_zoom_dataset(
    out_dir: str | Path,
    *,
    train_size: int = 64,
    val_size: int = 16,
    seed: int = 0,
    side: int = 1024,
    target: int = 24,
    agent_name: str = "mm_tool",
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (disjoint seeds, so no image is shared)."""
    if train_size < 1 or val_size < 1:
        raise ConfigError(f"zoom dataset sizes must be >= 1, got train_size={train_size}, val_size={val_size}")
    if not 8 <= target <= side // 4:
        raise ConfigError(f"zoom target must be between 8 and side/4={side // 4} px, got {target}")
    paths = []
    for split, count, split_seed in (("train", train_size, seed), ("val", val_size, seed + 1_000_003)):
        rng = random.Random(split_seed)
        samples = [zoom_sample(rng, side, target) for _ in range(count)]
        paths.append(write_parquet(_rows(samples, split, agent_name), Path(out_dir) / f"{split}.parquet"))
    return paths[0], paths[1]
