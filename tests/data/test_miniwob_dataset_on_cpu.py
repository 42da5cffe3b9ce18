"""MiniWoB++ rows (``make-data miniwob``): seeded episodes per task, splits that share no episode, and rows read back
from the parquet that the real loop runs and the oracle solves on real Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from verl_mm_tools.cli import main
from verl_mm_tools.data.miniwob import PROMPT, VAL_SEED_OFFSET
from verl_mm_tools.runtime.miniwob_oracle import oracle_script
from verl_mm_tools.runtime.rollout import LocalRollout

GUI_TOOLS_YAML = Path(__file__).parents[2] / "examples" / "tools" / "gui_tools.yaml"


def test_make_data_miniwob_writes_seeded_episodes_per_task(tmp_path, capsys):
    argv = ["make-data", "miniwob", "--out", str(tmp_path), "--tasks", "click-test,enter-text", "--episodes", "3"]
    assert main([*argv, "--val-episodes", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "train.parquet"), str(tmp_path / "val.parquet")]
    train, val = (pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "val"))
    assert list(train["data_source"]) == ["miniwob/click-test", "miniwob/enter-text"] * 3
    assert [(info["task"], info["seed"]) for info in train["extra_info"]] == [
        (task, seed) for seed in range(3) for task in ("click-test", "enter-text")
    ]
    assert [info["seed"] for info in val["extra_info"]] == [VAL_SEED_OFFSET] * 2 + [VAL_SEED_OFFSET + 1] * 2
    first = train["extra_info"][0]
    assert first["env"] == {"name": "miniwob", "task": "click-test"} and first["reward_fn"] == "environment_reward"
    assert train["prompt"][0][0]["content"] == PROMPT and "images" not in train.columns


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "click-buton"], "unknown task 'click-buton'.*Did you mean 'click-button'"),
        (["--tasks", "click-test,click-test"], "a task is named twice"),
        (["--tasks", " , "], "needs at least one task"),
    ],
)
def test_bad_task_lists_are_refused(tmp_path, argv, message, capsys):
    assert main(["make-data", "miniwob", "--out", str(tmp_path), *argv]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.integration  # the tiny model's processor, verl's worker and Chromium
def test_rows_read_back_from_the_parquet_run_and_are_solved(tmp_path, tiny_model_dir):
    main(["make-data", "miniwob", "--out", str(tmp_path), "--episodes", "1", "--val-episodes", "1"])
    rows = pd.read_parquet(tmp_path / "val.parquet")
    columns = {name: list(rows[name]) for name in ("data_source", "reward_model", "extra_info")}
    prompts = [list(prompt) for prompt in rows["prompt"]]
    output, _, _ = LocalRollout(tiny_model_dir, GUI_TOOLS_YAML, tmp_path).run(
        oracle_script,
        prompts,
        columns=columns,
        score=True,
        extra=["reward.reward_manager.name=mm_turn_discount", "+reward.reward_kwargs.gamma=1.0"],
        max_turns=6,
        prompt_length=2048,
    )
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0] * 6
