"""``eval`` on MiniWoB++ rows (``make-data miniwob``): success per task, through verl's dataset, the real loop and
real Chromium; the oracle as the model, then a model that answers without acting."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_mm_tools.cli import main
from verl_mm_tools.evaluate.run import EvalOptions, evaluate
from verl_mm_tools.runtime.miniwob_oracle import oracle_script
from verl_mm_tools.runtime.scripted_client import ScriptedClient

pytestmark = pytest.mark.integration  # verl's dataset and worker, the tiny model's processor, Chromium

GUI_TOOLS_YAML = Path(__file__).parents[2] / "examples" / "tools" / "gui_tools.yaml"
TASKS = ("click-test", "click-button", "click-link", "click-dialog", "enter-text", "focus-text")


@pytest.fixture(scope="module")
def miniwob_val(tmp_path_factory):
    out = tmp_path_factory.mktemp("miniwob")
    main(["make-data", "miniwob", "--out", str(out), "--episodes", "1", "--val-episodes", "1"])
    return out / "val.parquet"


def run_eval(data: Path, out: Path, model_path: str, script, loop_config: Path | None = None) -> dict:
    options = EvalOptions(
        data=data,
        out=out,
        model_path=model_path,
        tools_yaml=GUI_TOOLS_YAML,
        max_turns=5,
        prompt_length=2048,
        loop_config=loop_config,
    )
    return evaluate(options, lambda tokenizer: ScriptedClient(tokenizer, script))["modes"]["tools"]


def test_eval_reports_success_per_task(miniwob_val, tiny_model_dir, tmp_path):
    report = run_eval(miniwob_val, tmp_path / "oracle", str(tiny_model_dir), oracle_script)
    assert sorted(report) == sorted(f"miniwob/{task}" for task in TASKS)
    assert {source: (figures["rows"], figures["success_rate"]) for source, figures in report.items()} == {
        f"miniwob/{task}": (1, 1.0) for task in TASKS
    }
    assert report["miniwob/enter-text"]["tool_calls_per_trajectory"] == 3.0
    assert all(figures["stop_reasons"]["episode_done"] == 1 for figures in report.values())

    idle = run_eval(miniwob_val, tmp_path / "idle", str(tiny_model_dir), lambda *_: "Done.<|im_end|>")
    assert {source: (figures["success_rate"], figures["reward_mean"]) for source, figures in idle.items()} == {
        f"miniwob/{task}": (0.0, -1.0) for task in TASKS
    }


def test_eval_with_keep_last_images_scores_each_episodes_final_sample(miniwob_val, tiny_model_dir, tmp_path):
    """The training run's keep_last_images=1: each turn a sample of its own, seeing one screenshot; the report reads
    each trajectory's final sample, one row per episode, and the oracle still solves every task."""
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text("- {name: mm_tool, _target_: verl_mm_tools.agent_loop.MMToolAgentLoop, keep_last_images: 1}\n")
    report = run_eval(miniwob_val, tmp_path / "windowed", str(tiny_model_dir), oracle_script, loops)
    assert {source: (figures["rows"], figures["success_rate"]) for source, figures in report.items()} == {
        f"miniwob/{task}": (1, 1.0) for task in TASKS
    }
    assert report["miniwob/enter-text"]["tool_calls_per_trajectory"] == 3.0
