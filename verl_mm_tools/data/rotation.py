"""A synthetic rotation task as verl RL parquet: each prompt shows a picture turned by a seeded angle and asks for
the angle; the rotate tool lets the model turn the picture and look again.

Two kinds (``angles``): ``quarter`` — a small arrow turned by 0, 90, 180 or 270 degrees (the CPU demo's task);
``uniform`` — a scene of text and shapes turned by any whole angle in [0, 360) (the GPU recipes' task; the text
makes "upright" well defined).

Rows carry what verl's ``RLHFDataset`` and our reward functions read: ``prompt`` (chat messages whose user text
holds one ``<image>`` placeholder), ``images`` (``[{"bytes": PNG}]``), ``data_source``, ``ability``,
``reward_model.ground_truth`` (the angle as a string), ``extra_info`` (split, index, angle, image digest) and
``agent_name``. Generation is seeded; the validation split holds no image of the training split.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from verl_mm_tools.data.common import image_row, write_two_splits
from verl_mm_tools.errors import ConfigError

logger = logging.getLogger(__name__)

DATA_SOURCE = "verl_mm_tools/rotation"
ANGLES = (0, 90, 180, 270)
VAL_SEED_OFFSET = 1_000_003  # the validation split draws from its own seed stream (and excludes train pictures)
IMAGE_SIDE = 56  # 2 x 2 merged image tokens for Qwen2/2.5-VL (28 px per token side)
QUESTION = (
    "This picture of an arrow was turned counter-clockwise by 0, 90, 180 or 270 degrees. You may call the "
    "rotate tool to turn it and look again. Answer with the angle it was turned by, as <answer>90</answer>."
)
PROMPT = "<image>" + QUESTION  # verl's dataset replaces <image> with the row's image
UNIFORM_PROMPT = (
    "<image>This picture was turned counter-clockwise by some angle between 0 and 359 degrees. You may call the "
    "rotate tool to turn it and look again. Answer with the angle it was turned by, as <answer>123</answer>."
)
ANGLE_KINDS = ("quarter", "uniform")
WORDS = ("NORTH", "HELLO", "VERL", "TOOLS", "IMAGE", "UPRIGHT", "LOOK", "TEXT", "RIVER", "PLANT")


@dataclass(frozen=True)
class RotationSample:
    image: Image.Image  # the turned picture the model sees
    angle: int  # degrees counter-clockwise the upright picture was turned by
    digest: str  # sha256 of the upright picture's pixels: equal digests mean the same picture


def upright_picture(rng: random.Random, side: int = IMAGE_SIDE) -> Image.Image:
    """An arrow pointing up on a plain background, with random colours, size and offset."""
    background = tuple(rng.randrange(0, 256) for _ in range(3))
    ink = tuple((channel + rng.randrange(96, 160)) % 256 for channel in background)
    image = Image.new("RGB", (side, side), background)
    draw = ImageDraw.Draw(image)
    half = rng.randrange(side // 5, side // 3)
    x, y = side // 2 + rng.randrange(-4, 5), side // 2 + rng.randrange(-4, 5)
    draw.polygon([(x, y - half), (x - half, y), (x + half, y)], fill=ink)  # the head
    draw.rectangle([x - half // 3, y, x + half // 3, y + half], fill=ink)  # the shaft
    return image


def scene_picture(rng: random.Random, side: int = 448) -> Image.Image:
    """A word written across the top over a few random shapes, on a plain background: upright is unambiguous."""
    background = tuple(rng.randrange(150, 256) for _ in range(3))
    image = Image.new("RGB", (side, side), background)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randrange(2, 5)):
        x, y = rng.randrange(side // 8, side * 7 // 8), rng.randrange(side // 3, side * 7 // 8)
        r = rng.randrange(side // 16, side // 6)
        color = tuple(rng.randrange(0, 140) for _ in range(3))
        shape = rng.choice(("rectangle", "ellipse", "triangle"))
        if shape == "triangle":
            draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=color)
        else:
            getattr(draw, shape)([x - r, y - r, x + r, y + r], fill=color)
    font = ImageFont.load_default(size=max(10, side // 8))
    draw.text((side // 2, side // 6), rng.choice(WORDS), fill=(0, 0, 0), font=font, anchor="mm")
    return image


def _digest(image: Image.Image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


def rotation_samples(
    count: int,
    seed: int,
    *,
    exclude: frozenset[str] = frozenset(),
    angles: tuple[int, ...] = ANGLES,
    kind: str = "quarter",
    side: int | None = None,
) -> list[RotationSample]:
    """``count`` samples with distinct pictures, none of whose digests is in ``exclude``."""
    rng = random.Random(seed)
    samples: list[RotationSample] = []
    seen = set(exclude)
    for _ in range(count * 100):
        if len(samples) == count:
            return samples
        if kind == "uniform":
            picture = scene_picture(rng, side or 448)
        else:
            picture = upright_picture(rng, side or IMAGE_SIDE)
        digest = _digest(picture)
        if digest in seen:
            continue
        seen.add(digest)
        angle = rng.randrange(360) if kind == "uniform" else rng.choice(angles)
        samples.append(RotationSample(picture.rotate(angle, expand=True), angle, digest))
    raise ConfigError(f"could not draw {count} distinct rotation pictures (seed {seed}); ask for fewer samples")


def _row(sample: RotationSample, split: str, index: int, agent_name: str, prompt: str) -> dict:
    extra_info = {"split": split, "index": index, "angle": sample.angle, "image_sha256": sample.digest}
    return image_row(DATA_SOURCE, prompt, sample.image, str(sample.angle), extra_info, agent_name)


def write_rotation_dataset(
    out_dir: str | Path,
    *,
    train_size: int = 64,
    val_size: int = 16,
    seed: int = 0,
    agent_name: str = "mm_tool",
    angles: str = "quarter",
    side: int | None = None,
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; returns their paths."""
    if angles not in ANGLE_KINDS:
        raise ConfigError(f"rotation angles must be one of {ANGLE_KINDS}, got {angles!r}")
    if side is not None and not 28 <= side <= 4096:
        raise ConfigError(f"rotation picture side must be between 28 and 4096 px, got {side}")
    prompt = UNIFORM_PROMPT if angles == "uniform" else PROMPT
    return write_two_splits(
        out_dir,
        "rotation",
        functools.partial(rotation_samples, kind=angles, side=side),
        lambda sample, split, index: _row(sample, split, index, agent_name, prompt),
        train_size=train_size,
        val_size=val_size,
        seed=seed,
        val_seed_offset=VAL_SEED_OFFSET,
    )
