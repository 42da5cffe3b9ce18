"""The sweep's table: one line per run and the repeat rate, from verl's step metrics."""

from __future__ import annotations

from pathlib import Path

from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.sweep import HEADER, SweepRun, collapses, run_out, sweep_table
from verl_mm_tools.demo.tasks import CALL_RATE, TASKS, TRAINING_REWARD
from verl_mm_tools.demo.watch import RunResult
from verl_mm_tools.step_metrics import CALL_RATE_COLLAPSED

ZOOM = TASKS["zoom"]


def steps(rewards: list[float], rates: list[float], validation: float, collapsed: tuple[int, ...] = ()) -> list[dict]:
    trained = [
        {"step": n, TRAINING_REWARD: reward, CALL_RATE: rate, CALL_RATE_COLLAPSED: float(n in collapsed)}
        for n, (reward, rate) in enumerate(zip(rewards, rates, strict=True), start=1)
    ]
    return [
        {"step": 0, ZOOM.validation_metric: 0.5},
        *trained[:-1],
        {**trained[-1], ZOOM.validation_metric: validation},
    ]


def test_the_table_gives_each_run_and_the_repeat_rate():
    learned_fast = RunResult(0, steps([0.75] * 5 + [1.0] * 4, [0.5] * 5 + [1.0] * 4, 1.0), 225.4, 116.0, 0, True)
    learned_slow = RunResult(0, steps([0.5] * 10 + [1.0] * 5, [0.5] * 10 + [1.0] * 5, 1.0), 400.0, 120.0, 0, True)
    collapsed = RunResult(
        3, steps([0.5, 0.75, 0.5, 0.5, 0.5, 0.5], [0.5, 0.75, 0.25, 0.0, 0.0, 0.0], 0.5, (3, 4)), 300.0, 110.0, 0
    )
    runs = [SweepRun(0, 0, learned_fast), SweepRun(0, 1, collapsed), SweepRun(1, 0, learned_slow)]
    assert collapses(collapsed) == [3, 4]
    assert sweep_table(runs, ZOOM) == [
        HEADER,
        "   0    0      yes      9        225      0.75 -> 0.95     0.50 -> 0.90        1.00  -",
        "   0    1       no      6        300      0.55 -> 0.55     0.30 -> 0.20        0.50  3 4",
        "   1    0      yes     15        400      0.50 -> 1.00     0.50 -> 1.00        1.00  -",
        "learned: 2/3 runs; steps to learn median 12, max 15; trainer seconds median 313, max 400",
        "runs with a tool-use collapse (the step hook's flag): 1/3",
    ]


def test_a_failed_trainer_is_shown_and_not_counted():
    result = RunResult(3, steps([0.5] * 5, [0.5] * 5, 0.5), 100.0, 90.0, 0)
    killed = RunResult(1, steps([0.75] * 2, [0.5] * 2, 0.5), 80.0, 60.0, 0)
    table = sweep_table([SweepRun(2, 0, result), SweepRun(2, 1, killed)], ZOOM)
    assert table[2].startswith("   2    1  error 1      2 ")
    assert table[-2:] == [
        "learned: 0/1 runs; 1 more whose trainer failed (not counted: see their trainer.log)",
        "runs with a tool-use collapse (the step hook's flag): 0/1",
    ]


def test_repeats_get_their_own_folders(tmp_path):
    options = DemoOptions(out=tmp_path, task="zoom", rollout="hf")
    assert run_out(options, 3, 0, 1) == tmp_path / "seed_3"
    assert run_out(options, 3, 1, 2) == Path(tmp_path / "seed_3" / "run_1")
