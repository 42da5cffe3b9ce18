"""The trainer process of a demo run, watched to its end: a line per step from verl's file logger, the peak memory
of its processes, and a stop as soon as the task has ``learned`` (``supervise`` starts and stops it)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import psutil

from verl_mm_tools.demo.metrics import format_step, read_new_lines, read_new_steps, step_metrics
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
NODE_LOST = 4  # the demo's exit status when a Ray node of its cluster died and the trainer did not fail by itself
# How long a trainer that lost a Ray node gets to fail by itself (verl's driver raises ActorDiedError ~10 s after the
# node is declared dead when its next call goes to an actor there) before the demo stops it: a driver waiting on an
# object that was on the lost node can wait forever (seen in CI: still running 300 s after the kill).
NODE_LOST_GRACE_S = 60.0
OOM_KILLED = 5  # the demo's exit status when Ray's memory monitor killed workers and the trainer stopped stepping
# How long a trainer that lost workers to Ray's memory monitor gets to log its next step: a killed task is retried
# and the run goes on, but a killed agent-loop worker leaves verl's trainer waiting forever on the rollout it held
# (seen: "running: 16, finished: 0" for an hour). The longest step so far, three times over, where that is longer.
OOM_GRACE_S = 300.0
# The raylet's report, which Ray forwards to the driver's output (the trainer's log)
OOM_REPORT = re.compile(r"(\d+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\)")


class RunEnd(Enum):
    """Why the watch over a trainer ended."""

    EXITED = "exited"  # the trainer exited by itself
    LEARNED = "learned"  # the task learned: the demo stopped the trainer
    NODE_LOST = "node lost"  # a Ray node died and the trainer was still running NODE_LOST_GRACE_S later: stopped
    OOM_KILLED = "workers killed for memory"  # Ray's memory monitor killed workers and no step came after: stopped


@dataclass
class NodeWatch:
    """The raylets of the Ray cluster a run joined, by node name, as they were when the run started: a node whose
    raylet is gone has died (its machine lost, as Ray sees it)."""

    raylets: dict[str, psutil.Process]
    node_ids: dict[str, str]
    lost: dict[str, float] = field(default_factory=dict)  # node name -> when the watch saw it gone

    def newly_lost(self) -> list[str]:
        found = [name for name, raylet in self.raylets.items() if name not in self.lost and not _running(raylet)]
        for name in found:
            self.lost[name] = time.monotonic()
        return found

    def overdue(self, grace_s: float) -> bool:
        """A node has been lost for ``grace_s`` or more."""
        return any(time.monotonic() - when >= grace_s for when in self.lost.values())


@dataclass
class OomWatch:
    """The kills of Ray's memory monitor, read from the trainer's log as they come, and whether a step came after
    the last one."""

    log_path: Path
    offset: int = 0  # how far into the log the complete lines have been read
    killed: int = 0
    steps_at_kill: int | None = None  # the steps logged when the last kill was read; None: none since the last step
    killed_at: float = 0.0

    def read_kills(self, steps: int) -> int:
        """Read the log's new lines; the workers they report killed (``steps``: the steps logged so far)."""
        if self.steps_at_kill is not None and steps > self.steps_at_kill:
            self.steps_at_kill = None  # the trainer went on after the kill
        text, self.offset = read_new_lines(self.log_path, self.offset)
        killed = sum(int(match.group(1)) for match in OOM_REPORT.finditer(text))
        if killed:
            self.killed += killed
            self.steps_at_kill, self.killed_at = steps, time.monotonic()
        return killed

    def stalled(self, grace_s: float) -> bool:
        """Workers were killed ``grace_s`` or more ago and no step has come since."""
        return self.steps_at_kill is not None and time.monotonic() - self.killed_at >= grace_s


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
    nodes: NodeWatch | None = None,
) -> RunResult:
    """Run the trainer subprocess to its end (or until the model has ``learned``, or ``NODE_LOST_GRACE_S`` after a
    node of ``nodes`` died), printing a line per step; SIGTERM it if we are interrupted. ``cluster_pids``: the
    processes of a Ray cluster the run joined, which outlive the trainer and are its starter's to stop (not leftovers
    to wait for)."""
    watch = StepWatch(task, total_steps, paths.metrics, say)
    with terminate_raises(), supervised(command, env, paths.trainer_log, stop=stop_gracefully) as process:
        end = watch_until_done(process, watch, poll_s, nodes=nodes, kills=OomWatch(paths.trainer_log))
    stopped = {RunEnd.LEARNED: 0, RunEnd.NODE_LOST: NODE_LOST, RunEnd.OOM_KILLED: OOM_KILLED}
    returncode = stopped.get(end, process.returncode)
    end_leftovers(lambda: _leftovers(paths.metrics, cluster_pids()))
    seconds = time.monotonic() - watch.started
    return RunResult(
        returncode, watch.steps, seconds, watch.first_step_after_s, watch.peak_memory_bytes, task.learned(watch.steps)
    )


def _leftovers(metrics: Path, cluster_pids: set[int]) -> list[psutil.Process]:
    return [process for process in run_processes(metrics) if process.pid not in cluster_pids]


def watch_until_done(
    process: subprocess.Popen,
    watch: StepWatch,
    poll_s: float,
    memory_every_s: float = MEMORY_EVERY_S,
    nodes: NodeWatch | None = None,
    node_lost_grace_s: float = NODE_LOST_GRACE_S,
    kills: OomWatch | None = None,
    oom_grace_s: float = OOM_GRACE_S,
) -> RunEnd:
    """Read the trainer's steps until it exits, and its peak memory every ``memory_every_s``; stop it when the
    model has learned, when a node of ``nodes`` has been lost for ``node_lost_grace_s``, or when Ray's memory
    monitor killed workers (``kills``) and no step came in the grace after (``oom_grace_s``, or three times the
    longest step so far)."""
    memory_at: float | None = None
    while True:
        finished = process.poll() is not None
        watch.read_steps()
        if memory_at is None or time.monotonic() - memory_at >= memory_every_s:
            watch.peak_memory_bytes = max(watch.peak_memory_bytes, tree_memory_bytes(process.pid))
            memory_at = time.monotonic()
        if finished:
            return RunEnd.EXITED
        if watch.task.learned(watch.steps):
            watch.say(
                f"learned: reward >= {watch.task.stop_at_reward} (mean of the last {LEARNED_WINDOW} steps), "
                f"validation >= {watch.task.validation_target}; stopping the trainer"
            )
            stop_gracefully(process)
            return RunEnd.LEARNED
        if nodes is not None and _node_lost_too_long(nodes, watch.say, node_lost_grace_s):
            stop_gracefully(process)
            return RunEnd.NODE_LOST
        if kills is not None and _stalled_after_kills(kills, watch, oom_grace_s):
            stop_gracefully(process)
            return RunEnd.OOM_KILLED
        time.sleep(poll_s)


def _node_lost_too_long(nodes: NodeWatch, say: Callable[[str], None], grace_s: float) -> bool:
    for name in nodes.newly_lost():
        say(f"Ray node {name} died during the run (Node Id {nodes.node_ids[name]})")
    if not nodes.overdue(grace_s):
        return False
    say(f"the trainer was still running {grace_s:g} s after it lost a Ray node; stopping it")
    return True


def _stalled_after_kills(kills: OomWatch, watch: StepWatch, grace_s: float) -> bool:
    killed = kills.read_kills(len(watch.steps))
    if killed:
        watch.say(
            f"Ray's memory monitor killed {killed} of the run's workers (memory pressure; {kills.killed} so far): "
            "fewer trajectories at once or a larger machine avoid it"
        )
    longest = max((step["timing_s/step"] for step in watch.steps if "timing_s/step" in step), default=0.0)
    grace_s = max(grace_s, 3 * longest)
    if not kills.stalled(grace_s):
        return False
    watch.say(
        f"no step came in the {grace_s:g} s after Ray killed workers for memory: verl's trainer waits forever on "
        "a rollout a killed worker held; stopping it"
    )
    return True


def run_processes(metrics_path: Path) -> list[psutil.Process]:
    """The processes of one run: every one carries its VERL_FILE_LOGGER_PATH (Ray workers inherit the driver's)."""
    return processes_with_environ("VERL_FILE_LOGGER_PATH", str(metrics_path))
