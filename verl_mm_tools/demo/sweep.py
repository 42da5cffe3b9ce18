"""``verl-mm-tools demo --seeds 0,1,2 [--repeats R]``: the demo once per seed and repeat, then a table of what each
run did and how often the task learned. A repeat of a seed reuses its warm start and data (both are seeded), so the
repeats of one seed measure what varies between runs of the same trainer; the seeds measure the warm starts too.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.run import run_demo_result
from verl_mm_tools.demo.summary import learning_curve
from verl_mm_tools.demo.tasks import LEARNED_WINDOW, TRAINING_REWARD, DemoTask
from verl_mm_tools.demo.watch import LEARNING_FAILED, RunResult
from verl_mm_tools.errors import ColdStartError
from verl_mm_tools.step_metrics import CALL_RATE_COLLAPSED

# A run whose cold start ended without what RL needs (ColdStartError; the demo's exit status 2): the task's recipe
# failed on that seed, so it counts as a run that did not learn, and the sweep goes on to the next
COLD_START_FAILED = 2
HEADER = "seed  run  learned  steps  trainer s  reward first -> last  calls first -> last  validation  collapses"


@dataclass(frozen=True)
class SweepRun:
    seed: int
    repeat: int
    result: RunResult


def run_out(options: DemoOptions, seed: int, repeat: int, repeats: int) -> Path:
    """``OUT/seed_<n>`` (one run per seed) or ``OUT/seed_<n>/run_<r>``."""
    seed_dir = options.out / f"seed_{seed}"
    return seed_dir if repeats == 1 else seed_dir / f"run_{repeat}"


def run_sweep(options: DemoOptions, seeds: list[int], say: Callable[[str], None], repeats: int = 1) -> int:
    """The demo ``repeats`` times per seed, then ``sweep_table``; exit 0 when every run learned."""
    runs = []
    for seed in seeds:
        for repeat in range(repeats):
            say(f"== seed {seed}" + (f", run {repeat}" if repeats > 1 else ""))
            run_options = replace(options, seed=seed, out=run_out(options, seed, repeat, repeats))
            try:
                result, _ = run_demo_result(run_options, say)
            except ColdStartError as error:
                say(f"seed {seed}: {error}")
                result = RunResult(COLD_START_FAILED, [], 0.0, None, 0)
            runs.append(SweepRun(seed, repeat, result))
    for line in sweep_table(runs, options.spec):
        say(line)
    return 0 if all(run.result.learned for run in runs) else LEARNING_FAILED


def collapses(result: RunResult) -> list[int]:
    """The training steps the step hook flagged as a tool-use collapse."""
    return [step["step"] for step in result.steps if step.get(CALL_RATE_COLLAPSED) == 1.0]


def failed(result: RunResult) -> bool:
    """The trainer itself failed (killed, crashed): the run says nothing about learning."""
    return result.returncode not in (0, LEARNING_FAILED, COLD_START_FAILED)


def outcome(result: RunResult) -> str:
    if result.returncode == COLD_START_FAILED:
        return "no: cold start"
    if failed(result):
        return f"error {result.returncode}"
    return "yes" if result.learned else "no"


def window_mean(values: list[float], last: bool) -> float:
    window = values[-LEARNED_WINDOW:] if last else values[:LEARNED_WINDOW]
    return sum(window) / len(window) if window else float("nan")


def run_line(run: SweepRun, task: DemoTask) -> str:
    curve = learning_curve(run.result, task)
    rewards, rates = curve["reward"], curve["call_rate"]
    validations = list(curve["validation"].values()) or [float("nan")]
    flagged = collapses(run.result)
    return (
        f"{run.seed:>4}  {run.repeat:>3}  {outcome(run.result):>7}  {len(rewards):>5}  "
        f"{curve['trainer_seconds']:>9.0f}  {window_mean(rewards, False):>8.2f} -> {window_mean(rewards, True):.2f}  "
        f"{window_mean(rates, False):>7.2f} -> {window_mean(rates, True):.2f}  {validations[-1]:>10.2f}  "
        + (" ".join(str(step) for step in flagged) or "-")
    )


def sweep_table(runs: list[SweepRun], task: DemoTask) -> list[str]:
    """One line per run (first and last ``LEARNED_WINDOW`` steps' means; the steps flagged as a tool-use collapse),
    then the runs that learned out of those whose trainer did not fail (a failed cold start counts, as not
    learned), the steps and trainer seconds they took (median and max), the failed runs, and the runs with a
    collapse."""
    lines = [HEADER, *(run_line(run, task) for run in runs)]
    judged = [run for run in runs if not failed(run.result)]
    learned = [run.result for run in judged if run.result.learned]
    trained = [sum(TRAINING_REWARD in step for step in result.steps) for result in learned]
    seconds = [result.seconds for result in learned]
    summary = f"learned: {len(learned)}/{len(judged)} runs"
    if learned:
        summary += (
            f"; steps to learn median {statistics.median(trained):g}, max {max(trained)}; trainer seconds median "
            f"{statistics.median(seconds):.0f}, max {max(seconds):.0f}"
        )
    cold = sum(run.result.returncode == COLD_START_FAILED for run in runs)
    if cold:
        summary += f"; {cold} of them stopped at a failed cold start"
    if len(judged) < len(runs):
        summary += f"; {len(runs) - len(judged)} more whose trainer failed (not counted: see their trainer.log)"
    collapsed = sum(bool(collapses(run.result)) for run in judged)
    lines += [summary, f"runs with a tool-use collapse (the step hook's flag): {collapsed}/{len(judged)}"]
    return lines
