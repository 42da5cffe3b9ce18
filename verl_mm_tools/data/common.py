"""Shared pieces of the dataset builders: image bytes and verl RL parquet rows."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from pathlib import Path

from PIL import Image

logger = logging.getLogger(__name__)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_row(data_source: str, prompt: str, image: Image.Image, ground_truth: str, extra_info: dict,
              agent_name: str) -> dict:
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
