"""MiniWoB++ rows: one row per episode, seeded, for the ``miniwob`` environment and the GUI tools.

A row holds no image: the environment's reset shows the task's instruction and the page's screenshot. Its
``extra_info`` selects the environment (``env: {name: miniwob, task: ...}``), the episode's ``seed``, and the
``environment_reward`` reward function (MiniWoB's own reward). Training seeds are 0, 1, ...; validation seeds start at
``VAL_SEED_OFFSET``, so no episode is in both splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from verl_mm_tools.data.common import write_parquet
from verl_mm_tools.envs.gui.tasks import check_task
from verl_mm_tools.errors import ConfigError

DATA_SOURCE_PREFIX = "miniwob/"
PROMPT = "Do the task on the web page with the tools."  # short: the task's own instruction comes with the page
VAL_SEED_OFFSET = 1_000_003


def miniwob_row(task: str, seed: int, split: str, index: int, agent_name: str = "mm_tool") -> dict:
    """The row of one episode of ``task``."""
    return {
        "data_source": DATA_SOURCE_PREFIX + task,
        "prompt": [{"role": "user", "content": PROMPT}],
        "ability": "gui",
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {
            "split": split,
            "index": index,
            "seed": seed,
            "task": task,
            "env": {"name": "miniwob", "task": task},
            "reward_fn": "environment_reward",
        },
        "agent_name": agent_name,
    }


def write_miniwob_dataset(
    out_dir: str | Path,
    *,
    tasks: Sequence[str],
    episodes: int = 64,
    val_episodes: int = 16,
    agent_name: str = "mm_tool",
) -> tuple[Path, Path]:
    """``train.parquet`` (``episodes`` per task) and ``val.parquet`` (``val_episodes`` per task) under ``out_dir``,
    tasks interleaved; returns their paths."""
    if not tasks:
        raise ConfigError("make-data miniwob needs at least one task (--tasks click-test,click-button,...)")
    if episodes < 1 or val_episodes < 1:
        raise ConfigError(f"episodes per task must be >= 1, got episodes={episodes}, val_episodes={val_episodes}")
    checked = [check_task(task) for task in tasks]
    if len(set(checked)) != len(checked):
        raise ConfigError(f"make-data miniwob: a task is named twice in {list(tasks)}")

    def rows(split: str, count: int, first_seed: int) -> list[dict]:
        pairs = [(task, first_seed + episode) for episode in range(count) for task in checked]
        return [miniwob_row(task, seed, split, index, agent_name) for index, (task, seed) in enumerate(pairs)]

    out = Path(out_dir)
    return (
        write_parquet(rows("train", episodes, 0), out / "train.parquet"),
        write_parquet(rows("val", val_episodes, VAL_SEED_OFFSET), out / "val.parquet"),
    )
