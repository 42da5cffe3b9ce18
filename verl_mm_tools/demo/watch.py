"""The trainer process of a demo run, watched to its end: a line per step from verl's file logger, the peak memory
of its processes, and a stop as soon as the task has ``learned`` (``supervise`` starts and stops it)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from verl_mm_tools.demo.metrics import format_step, read_new_steps, step_metrics
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.demo.tasks import LEARNED_WINDOW, DemoTask
from verl_mm_tools.supervise import (
    end_leftovers,
    processes_with_environ,
    stop_gracefully,
    supervised,
    terminate_raises,
    tree_memory_bytes,
)

LEARNING_FAILED = 3  # the demo's exit status when a task with a reward target did not reach it
# How often the peak memory is sampled. Summing the PSS of the trainer's processes reads each one's smaps_rollup:
# ~0.25 s of CPU for the ~30 processes of a CPU run, which at every 1 s poll took 15-30 % of a core from the run it
# watches (issue #49: a 2-core machine).
MEMORY_EVERY_S = 5.0


@dataclass
class RunResult:
    returncode: int
    steps: list[dict]  # verl's metrics of each logged step, with "step" added
    seconds: float
    first_step_after_s: float | None
    peak_memory_bytes: int
    learned: bool = False  # ``learned`` held when the run ended (the demo stops the trainer as soon as it does)


@dataclass
class StepWatch:
    """What the demo has seen of a running trainer: its steps (each said as it comes), its peak memory and when its
    first step came."""

    task: DemoTask
    total_steps: int
    metrics_path: Path
    say: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    steps: list[dict] = field(default_factory=list)
    offset: int = 0  # how far into verl's metrics file the complete lines have been read
    peak_memory_bytes: int = 0
    first_step_after_s: float | None = None

    def read_steps(self) -> None:
        records, self.offset = read_new_steps(self.metrics_path, self.offset)
        for record in records:
            if record["step"] > 0:
                self.first_step_after_s = self.first_step_after_s or time.monotonic() - self.started
            self.steps.append({**step_metrics(record["data"]), "step": record["step"]})
            self.say(format_step(record["step"], self.total_steps, record["data"], self.task.validation_metric))


def run_trainer(
    command: list[str],
    env: dict[str, str],
    paths: DemoPaths,
    task: DemoTask,
    total_steps: int,
    say: Callable[[str], None],
    poll_s: float = 1.0,
    cluster_pids: Callable[[], set[int]] = set,
) -> RunResult:
    """Run the trainer subprocess to its end (or until the model has ``learned``), printing a line per step;
    SIGTERM it if we are interrupted. ``cluster_pids``: the processes of a Ray cluster the run joined, which outlive
    the trainer and are its starter's to stop (not leftovers to wait for)."""
    watch = StepWatch(task, total_steps, paths.metrics, say)
    with terminate_raises(), supervised(command, env, paths.trainer_log, stop=stop_gracefully) as process:
        stopped = watch_until_done(process, watch, poll_s)
    returncode = 0 if stopped else process.returncode
    end_leftovers(lambda: _leftovers(paths.metrics, cluster_pids()))
    seconds = time.monotonic() - watch.started
    return RunResult(
        returncode, watch.steps, seconds, watch.first_step_after_s, watch.peak_memory_bytes, task.learned(watch.steps)
    )


def _leftovers(metrics: Path, cluster_pids: set[int]) -> list[psutil.Process]:
    return [process for process in run_processes(metrics) if process.pid not in cluster_pids]


def watch_until_done(
    process: subprocess.Popen, watch: StepWatch, poll_s: float, memory_every_s: float = MEMORY_EVERY_S
) -> bool:
    """Read the trainer's steps until it exits, and its peak memory every ``memory_every_s``; returns True when it
    was stopped because the model learned."""
    memory_at: float | None = None
    while True:
        finished = process.poll() is not None
        watch.read_steps()
        if memory_at is None or time.monotonic() - memory_at >= memory_every_s:
            watch.peak_memory_bytes = max(watch.peak_memory_bytes, tree_memory_bytes(process.pid))
            memory_at = time.monotonic()
        if not finished and watch.task.learned(watch.steps):
            watch.say(
                f"learned: reward >= {watch.task.stop_at_reward} (mean of the last {LEARNED_WINDOW} steps and "
                "validation); stopping the trainer"
            )
            stop_gracefully(process)
            return True
        if finished:
            return False
        time.sleep(poll_s)


def run_processes(metrics_path: Path) -> list[psutil.Process]:
    """The processes of one run: every one carries its VERL_FILE_LOGGER_PATH (Ray workers inherit the driver's)."""
    return processes_with_environ("VERL_FILE_LOGGER_PATH", str(metrics_path))
