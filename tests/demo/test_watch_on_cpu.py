"""The demo's watch over a running trainer (``demo.watch``)."""

from __future__ import annotations

import subprocess

import psutil

from verl_mm_tools.demo import watch as watch_module
from verl_mm_tools.demo.tasks import get_task
from verl_mm_tools.demo.watch import NodeWatch, OomWatch, RunEnd, StepWatch, watch_until_done


class _Trainer:
    """A trainer process that runs for ``polls`` polls, then exits."""

    pid = 12345
    returncode = 0

    def __init__(self, polls: int):
        self.polls = polls

    def poll(self):
        self.polls -= 1
        return 0 if self.polls < 0 else None


def test_the_peak_memory_is_sampled_every_memory_every_s_not_at_every_poll(tmp_path, monkeypatch):
    clock = iter(float(second) for second in range(1000))  # one second per call
    monkeypatch.setattr(watch_module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(watch_module.time, "sleep", lambda seconds: None)
    samples = []
    monkeypatch.setattr(watch_module, "tree_memory_bytes", lambda pid: samples.append(pid) or 100 * len(samples))
    watch = StepWatch(get_task("rotation"), 1, tmp_path / "metrics.jsonl", lambda line: None)

    assert watch_until_done(_Trainer(polls=20), watch, poll_s=1.0, memory_every_s=5.0) is RunEnd.EXITED

    # 21 polls on a clock that moves 1 s per read: a sample at the first poll, then one whenever 5 s have passed
    assert len(samples) == 5
    assert watch.peak_memory_bytes == 100 * len(samples)


def test_a_trainer_still_running_after_losing_a_node_is_stopped_once_the_grace_has_passed(tmp_path):
    """A driver waiting on an object of a lost node can wait forever: the watch names the node as soon as its raylet
    is gone and stops the trainer once the grace has passed; a node still up is not named."""
    trainer = subprocess.Popen(["sleep", "600"], start_new_session=True)
    raylets = {name: subprocess.Popen(["sleep", "600"]) for name in ("node_a", "node_b")}
    said: list[str] = []
    nodes = NodeWatch({name: psutil.Process(p.pid) for name, p in raylets.items()}, {"node_a": "aa", "node_b": "bb"})
    raylets["node_b"].kill()
    raylets["node_b"].wait()
    watch = StepWatch(get_task("rotation"), 1, tmp_path / "metrics.jsonl", said.append)
    try:
        end = watch_until_done(trainer, watch, poll_s=0.1, nodes=nodes, node_lost_grace_s=0.5)
    finally:
        trainer.kill()
        raylets["node_a"].kill()
    assert end is RunEnd.NODE_LOST
    assert trainer.wait(timeout=10) == -15  # SIGTERM first, as for any stop
    assert said == [
        "Ray node node_b died during the run (Node Id bb)",
        "the trainer was still running 0.5 s after it lost a Ray node; stopping it",
    ]
    assert list(nodes.lost) == ["node_b"]


RAYLET_OOM_LINE = (
    "\x1b[33m(raylet)\x1b[0m [2026-12-03 07:47:23,861 E 12198 12198] (raylet) node_manager.cc:3517: 3 Workers (tasks / "
    "actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 7836, IP: "
    "192.0.2.2) over the last time period.\n"
)  # as a run's trainer log held it (session 39: 128 browsers beside the trainer)


def test_a_trainer_that_steps_no_more_after_ray_killed_workers_for_memory_is_stopped_once_the_grace_has_passed(
    tmp_path,
):
    """verl's trainer waits forever on a rollout a killed agent-loop worker held: the watch reads the raylet's
    report from the trainer's log, says it, and stops the trainer when no step came in the grace after it."""
    log = tmp_path / "trainer.log"
    log.write_text("starting\n" + RAYLET_OOM_LINE + "(raylet) half a line")
    trainer = subprocess.Popen(["sleep", "600"], start_new_session=True)
    said: list[str] = []
    watch = StepWatch(get_task("rotation"), 1, tmp_path / "metrics.jsonl", said.append)
    kills = OomWatch(log)
    try:
        end = watch_until_done(trainer, watch, poll_s=0.1, kills=kills, oom_grace_s=0.5)
    finally:
        trainer.kill()
    assert end is RunEnd.OOM_KILLED
    assert trainer.wait(timeout=10) == -15
    assert said == [
        "Ray's memory monitor killed 3 of the run's workers (memory pressure; 3 so far): fewer trajectories at once "
        "or a larger machine avoid it",
        "no step came in the 0.5 s after Ray killed workers for memory: verl's trainer waits forever on a rollout a "
        "killed worker held; stopping it",
    ]
    assert kills.killed == 3
    assert kills.offset == len(("starting\n" + RAYLET_OOM_LINE).encode())  # the half line is read once it ends


def test_a_trainer_that_steps_on_after_ray_killed_workers_is_left_to_run(tmp_path):
    """A killed task that Ray retried lets the run go on: a step after the kill ends the stall."""
    log, metrics = tmp_path / "trainer.log", tmp_path / "metrics.jsonl"
    log.write_text(RAYLET_OOM_LINE)
    metrics.write_text('{"step": 1, "data": {"timing_s/step": 4.0}}\n')
    kills = OomWatch(log)
    assert kills.read_kills(steps=0) == 3
    assert kills.stalled(grace_s=0.0)
    watch = StepWatch(get_task("rotation"), 5, metrics, lambda line: None)
    assert watch_until_done(_Trainer(polls=3), watch, poll_s=0.0, kills=kills, oom_grace_s=0.0) is RunEnd.EXITED
    assert [step["step"] for step in watch.steps] == [1]
    assert not kills.stalled(grace_s=0.0)
