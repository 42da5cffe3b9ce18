"""The demo's watch over a running trainer (``demo.watch``)."""

from __future__ import annotations

from verl_mm_tools.demo import watch as watch_module
from verl_mm_tools.demo.tasks import get_task
from verl_mm_tools.demo.watch import StepWatch, watch_until_done


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

    assert watch_until_done(_Trainer(polls=20), watch, poll_s=1.0, memory_every_s=5.0) is False

    # 21 polls on a clock that moves 1 s per read: a sample at the first poll, then one whenever 5 s have passed
    assert len(samples) == 5
    assert watch.peak_memory_bytes == 100 * len(samples)
