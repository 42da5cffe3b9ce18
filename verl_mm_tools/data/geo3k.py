"""Geometry3K (``hiyouga/geometry3k`` on the Hugging Face hub) to verl parquet for the mm_tool loop.

Input: the dataset as published (columns ``images`` — a list of ``{"bytes", "path"}`` —, ``problem`` with an
``<image>`` placeholder, ``answer``), either a directory holding ``<split>.parquet`` or ``data/<split>-*.parquet``
files (a ``huggingface-cli download`` or ``save_to_disk`` of parquet), or a single parquet file per split.

Output rows (one parquet per split) follow verl's own geo3k preprocessing (same data_source, instruction, ground
truth) plus what the mm_tool loop reads: ``agent_name``, the image tools' per-trajectory arguments, and an
``answer_feedback`` environment in ``extra_info.env`` that checks each answer with ``geo3k_reward`` and lets the
model retry (pair it with the ``mm_turn_discount`` reward manager for a per-attempt discount).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from verl_mm_tools.data.common import write_parquet
from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

DATA_SOURCE = "hiyouga/geometry3k"
SPLITS = ("train", "validation", "test")
INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}. "
    "You may call the image tools to zoom into or mark up the figure; every image has an id (Image 1 is the figure)."
)


def find_split_files(source: str | Path, split: str) -> list[Path]:
    source = Path(source)
    if source.is_file():
        return [source]
    candidates = sorted(source.glob(f"{split}.parquet")) + sorted(source.glob(f"data/{split}-*.parquet"))
    return candidates + sorted(source.glob(f"{split}-*.parquet"))


def _read_split(files: list[Path]) -> pd.DataFrame:
    import pandas as pd

    frame = pd.concat([pd.read_parquet(path) for path in files], ignore_index=True)
    missing = {"images", "problem", "answer"} - set(frame.columns)
    if missing:
        raise ConfigError(
            f"{files[0]} is not in the Geometry3K layout: columns {sorted(missing)} are missing "
            f"(found {sorted(frame.columns)}); expected images, problem, answer as on the hub"
        )
    return frame


def geo3k_rows(frame: pd.DataFrame, split: str, *, max_attempts: int, agent_name: str) -> Iterator[dict]:
    for index, record in enumerate(frame.to_dict("records")):
        images = [{"bytes": image["bytes"]} for image in record["images"]]
        if record["problem"].count("<image>") != len(images):
            raise ConfigError(
                f"geo3k {split} row {index}: the problem holds {record['problem'].count('<image>')} <image> "
                f"placeholders for {len(images)} images; they must match"
            )
        answer = str(record["answer"])
        yield {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{record['problem']} {INSTRUCTION}"}],
            "images": images,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {
                "split": split,
                "index": index,
                "answer": answer,
                "question": record["problem"],
                "env": {"name": "answer_feedback", "reward_fn": "geo3k_reward", "max_attempts": max_attempts},
            },
            "agent_name": agent_name,
        }


def convert_geo3k(
    source: str | Path, out_dir: str | Path, *, max_attempts: int = 3, agent_name: str = "mm_tool"
) -> dict[str, Path]:
    """Convert every split found under ``source``; returns {split: parquet path}."""
    written = {}
    for split in SPLITS:
        files = find_split_files(source, split)
        if not files:
            continue
        frame = _read_split(files)
        rows = geo3k_rows(frame, split, max_attempts=max_attempts, agent_name=agent_name)
        written[split] = write_parquet(rows, Path(out_dir) / f"{split}.parquet")
    if not written:
        raise ConfigError(
            f"no Geometry3K split found under {source}: expected {{train,validation,test}}.parquet or "
            "data/<split>-*.parquet (download hiyouga/geometry3k from the hub on a machine with network)"
        )
    return written
