"""Shared pieces of the dataset builders: image bytes, verl RL parquet rows, and two-split datasets of distinct
pictures whose answers alternate."""

from __future__ import annotations

import hashlib
import io
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from verl_mm_tools.errors import ConfigError

logger = logging.getLogger(__name__)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_row(
    data_source: str, prompt: str, image: Image.Image, ground_truth: str, extra_info: dict, agent_name: str
) -> dict:
    """One row in verl's RL layout: a user prompt holding ``<image>``, the image as PNG bytes, a rule reward."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "images": [{"bytes": png_bytes(image)}],
        "ability": "vision",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
        "agent_name": agent_name,
    }


def write_parquet(rows: Iterable[dict], path: str | Path) -> Path:
    """Write rows as a parquet file verl's ``RLHFDataset`` reads (images as ``[{"bytes": ...}]``)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(list(rows))
    frame.to_parquet(path)
    logger.info("wrote %d rows to %s", len(frame), path)
    return path


@dataclass(frozen=True)
class LabelledPicture:
    image: Image.Image
    label: str  # the answer
    digest: str  # sha256 of the pixels: equal digests mean the same picture


def alternating_pictures(
    count: int,
    seed: int,
    labels: Sequence[str],
    draw: Callable[[random.Random, str], Image.Image],
    *,
    exclude: frozenset[str] = frozenset(),
) -> list[LabelledPicture]:
    """``count`` distinct pictures drawn by ``draw(rng, label)``, none in ``exclude``, labels alternating in order
    (every batch of an even size holds each of two labels equally often)."""
    rng = random.Random(seed)
    pictures: list[LabelledPicture] = []
    seen = set(exclude)
    for _ in range(count * 100):
        if len(pictures) == count:
            return pictures
        label = labels[len(pictures) % len(labels)]
        picture = draw(rng, label)
        digest = hashlib.sha256(picture.tobytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            pictures.append(LabelledPicture(picture, label, digest))
    raise ConfigError(f"could not draw {count} distinct pictures (seed {seed}); ask for fewer samples")


def write_two_splits(
    out_dir: str | Path,
    name: str,
    pictures: Callable[..., list],
    row: Callable[[Any, str, int], dict],
    *,
    train_size: int,
    val_size: int,
    seed: int,
    val_seed_offset: int,
) -> tuple[Path, Path]:
    """``train.parquet`` and ``val.parquet`` under ``out_dir`` for the ``name`` dataset, from ``pictures(count, seed,
    exclude=...)`` (samples with a pixel ``digest``): the validation split draws from its own seed stream and holds no
    training picture. ``row(sample, split, index)`` is a sample's parquet row."""
    if train_size < 1 or val_size < 1:
        raise ConfigError(f"{name} dataset sizes must be >= 1, got train_size={train_size}, val_size={val_size}")
    train = pictures(train_size, seed)
    val = pictures(val_size, seed + val_seed_offset, exclude=frozenset(picture.digest for picture in train))
    train_path, val_path = (
        write_parquet(
            (row(picture, split, index) for index, picture in enumerate(split_pictures)),
            Path(out_dir) / f"{split}.parquet",
        )
        for split, split_pictures in (("train", train), ("val", val))
    )
    return train_path, val_path
