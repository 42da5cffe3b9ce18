"""The demo's watch over a running trainer (``demo.watch``)."""

from __future__ import annotations

import subprocess

import psutil

from verl_mm_tools.demo import watch as watch_module
from verl_mm_tools.demo.tasks import get_task
from verl_mm_tools.demo.watch import NodeWatch, RunEnd, StepWatch, watch_until_done


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
