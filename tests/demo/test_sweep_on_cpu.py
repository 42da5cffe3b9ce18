"""The sweep's table: one line per run and the repeat rate, from verl's step metrics."""

from __future__ import annotations

from pathlib import Path

from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.sweep import COLD_START_FAILED, HEADER, SweepRun, collapses, run_out, sweep_table
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


def test_a_failed_cold_start_counts_as_a_run_that_did_not_learn():
    learned = RunResult(0, steps([0.75] * 5 + [1.0] * 4, [1.0] * 9, 1.0), 225.4, 116.0, 0, True)
    cold = RunResult(COLD_START_FAILED, [], 0.0, None, 0)
    table = sweep_table([SweepRun(0, 0, learned), SweepRun(3, 0, cold)], ZOOM)
    assert table[2] == "   3    0  no: cold start      0          0       nan -> nan      nan -> nan         nan  -"
    assert table[-2].startswith("learned: 1/2 runs; steps to learn median 9") and table[-2].endswith(
        "; 1 of them stopped at a failed cold start"
    )


def test_a_sweep_goes_on_past_a_seed_whose_cold_start_fails(tmp_path, monkeypatch):
    from verl_mm_tools.demo import sweep
    from verl_mm_tools.errors import ColdStartError

    def run_demo_result(options, say):
        if options.seed == 3:
            raise ColdStartError("click cold start: its true-point share on 32 held-out screenshots is 0.2403")
        return RunResult(0, steps([1.0] * 5, [1.0] * 5, 1.0), 100.0, 50.0, 0, True), None

    monkeypatch.setattr(sweep, "run_demo_result", run_demo_result)
    said: list[str] = []
    status = sweep.run_sweep(DemoOptions(out=tmp_path, task="zoom", rollout="hf"), [3, 4], said.append)
    assert status == 3  # not every run learned
    assert "seed 3: click cold start: its true-point share on 32 held-out screenshots is 0.2403" in said
    assert said[-2].startswith("learned: 1/2 runs")


def test_repeats_get_their_own_folders(tmp_path):
    options = DemoOptions(out=tmp_path, task="zoom", rollout="hf")
    assert run_out(options, 3, 0, 1) == tmp_path / "seed_3"
    assert run_out(options, 3, 1, 2) == Path(tmp_path / "seed_3" / "run_1")
