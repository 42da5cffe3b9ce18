"""What a demo run says at its end: its learning curve (``learning_curve.json`` and its picture), what changed from
the first steps to the last, and where its checkpoint, logs and dumps are."""

from __future__ import annotations

import re
from pathlib import Path

from verl_mm_tools.demo.examples import before_and_after
from verl_mm_tools.demo.metrics import TOOL_CALLS_METRIC, metric
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.demo.tasks import CALL_RATE, LEARNED_WINDOW, TASKS, TRAINING_REWARD, DemoTask
from verl_mm_tools.demo.watch import LEARNING_FAILED, RunResult
from verl_mm_tools.viewer.curve import CURVE_PICTURE


def learning_curve(result: RunResult, task: DemoTask) -> dict:
    """The training reward and tool-call rate by step, the validation reward, and whether the run learned."""
    trained = [step for step in result.steps if TRAINING_REWARD in step]
    return {
        "task": task.name,
        "target": task.stop_at_reward,
        "chance": task.chance_reward,
        "learned": result.learned,
        "trainer_seconds": round(result.seconds, 1),
        "steps": [step["step"] for step in trained],
        "reward": [round(step[TRAINING_REWARD], 4) for step in trained],
        "call_rate": [round(step.get(CALL_RATE, 0.0), 4) for step in trained],
        "validation": {
            step["step"]: round(step[task.validation_metric], 4)
            for step in result.steps
            if task.validation_metric in step
        },
    }


def what_was_learned(result: RunResult, task: DemoTask, paths: DemoPaths) -> list[str]:
    """One line on what changed (reward and tool calls, first steps against last steps) and one on what to run next."""
    trained = [step for step in result.steps if TRAINING_REWARD in step]
    if not trained:
        return []
    window = min(LEARNED_WINDOW, len(trained))
    first, last = trained[:window], trained[-window:]

    def mean(steps: list[dict], key: str) -> float:
        return sum(metric(step, key) or 0.0 for step in steps) / len(steps)

    others = " | ".join(sorted(set(TASKS) - {task.name}))
    return [
        f"summary: mean reward {mean(first, TRAINING_REWARD):.2f} -> {mean(last, TRAINING_REWARD):.2f} and tool calls "
        f"per trajectory {mean(first, TOOL_CALLS_METRIC):.2f} -> {mean(last, TOOL_CALLS_METRIC):.2f} (first {window} "
        f"steps -> last {window}; answering without looking scores {task.chance_reward:.2f})",
        f"next: verl-mm-tools view {paths.trajectories}  (what the model saw and did, turn by turn); another task: "
        f"--task {others}",
    ]


def summarize(result: RunResult, paths: DemoPaths, task: DemoTask, total_s: float) -> list[str]:
    """The lines the demo ends with: how the run ended, its curve, what it learned and where its files are."""
    trained = sum(TRAINING_REWARD in step for step in result.steps)
    lines = how_it_ended(result, paths, task, trained)
    if task.stop_at_reward is not None:
        curve = learning_curve(result, task)
        lines.append("reward by step: " + " ".join(f"{reward:.2f}" for reward in curve["reward"]))
        lines.append(
            "validation by step: " + " ".join(f"{step}:{value:.2f}" for step, value in curve["validation"].items())
        )
    validation = [step[task.validation_metric] for step in result.steps if task.validation_metric in step]
    if validation:
        lines.append(f"validation reward {validation[-1]:.3f} (greedy, on pictures the training split does not hold)")
    lines += before_and_after(paths.trajectories)
    lines += what_was_learned(result, task, paths)
    return lines + where_things_are(result, paths, task, total_s, trained)


def how_it_ended(result: RunResult, paths: DemoPaths, task: DemoTask, trained: int) -> list[str]:
    """Nothing for a run that ended well; what it missed, or the end of the trainer's log when it failed."""
    if result.returncode == LEARNING_FAILED:
        what = "the reward" if task.stop_at_call_rate is None else "the reward and the tool-call rate"
        return [
            f"did not learn: {what} did not reach {task.stop_at_reward} (validation {task.validation_target}) within "
            f"{trained} steps "
            f"(see {paths.out / 'learning_curve.json'})"
        ]
    if result.returncode != 0:
        log = log_lines(paths.trainer_log)
        error = trainer_error(log)
        return [
            f"the trainer failed (exit status {result.returncode})" + (f": {error}" if error else ""),
            f"the end of {paths.trainer_log}:",
            *("  " + line for line in log[-LOG_TAIL_LINES:]),
        ]
    return []


def where_things_are(result: RunResult, paths: DemoPaths, task: DemoTask, total_s: float, trained: int) -> list[str]:
    """How long the run took and its peak memory, then where its checkpoint, logs, dumps and command are."""
    startup = f"{result.first_step_after_s:.0f}s to the first step, " if result.first_step_after_s else ""
    lines = [
        f"done in {total_s:.0f}s ({startup}{trained} steps, trainer {result.seconds:.0f}s); peak memory of the "
        f"trainer's processes {result.peak_memory_bytes / 2**30:.1f} GiB (PSS, summed)",
        f"checkpoint:   {paths.checkpoints}",
        f"logs:         {paths.trainer_log}",
        f"metrics:      {paths.metrics}",
        f"rollouts:     {paths.rollouts}",
        f"trajectories: {paths.trajectories}  (verl-mm-tools view {paths.trajectories})",
        f"command:      {paths.config / 'command.sh'}",
    ]
    if task.stop_at_reward is not None:
        lines.append(f"curve:        {paths.out / CURVE_PICTURE}  (reward, tool-call rate, validation per step)")
    return lines


# The exception that ended verl's driver ("ray.exceptions.ActorDiedError: The actor died ...") and Ray's reason for
# an actor's death, which follows it ("The actor died because its node has died. Node Id: ..."): what the user needs,
# where the log's last lines are often other processes' output.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+")
DEATH_REASON = re.compile(r"^\s*The actor died because .+")


LOG_TAIL_LINES = 25


def trainer_error(text: list[str]) -> str | None:
    """The last exception line of the trainer's log, with Ray's reason where an actor died; None when there is none."""
    found = [index for index, line in enumerate(text) if EXCEPTION_LINE.match(line)]
    if not found:
        return None
    error = text[found[-1]].strip()
    reason = next((line.strip() for line in text[found[-1] + 1 : found[-1] + 12] if DEATH_REASON.match(line)), None)
    return f"{error} ({reason})" if reason else error


def log_lines(path: Path) -> list[str]:
    """The trainer's log, read once for the summary of a failed run (none where the run wrote no log)."""
    return path.read_text(errors="replace").splitlines() if path.exists() else []
