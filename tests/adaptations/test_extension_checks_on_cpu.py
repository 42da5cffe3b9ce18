"""The rows whose code subclasses or copies verl's (the mm_tool loop and its output model, the classic and v1 step
hooks, the in-process per-sample worker, the resume recording) are checked where that code is used, as every patch is
before it is applied: a changed target refuses to start, naming the adaptation's code, and
``VERL_MM_TOOLS_ADAPTATIONS=warn`` only logs it (once per process)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from verl_mm_tools.adaptations import guard
from verl_mm_tools.adaptations.record import Target
from verl_mm_tools.agent_loop import loop_output, mm_tool_loop, resumes
from verl_mm_tools.runtime import workers
from verl_mm_tools.step_hook import manager, replay_buffer

# each row declared where its code is
LOOP_COPIES, CLASSIC_MANAGER, V1_REPLAY_BUFFER = mm_tool_loop.ADAPTATION, manager.ADAPTATION, replay_buffer.ADAPTATION
PER_SAMPLE_WORKER = workers.ADAPTATION
EXTENSION_ROWS = (
    LOOP_COPIES,
    CLASSIC_MANAGER,
    V1_REPLAY_BUFFER,
    PER_SAMPLE_WORKER,
    loop_output.ADAPTATION,
    resumes.ADAPTATION,
)


def build_loop() -> None:
    from verl_mm_tools.agent_loop.mm_tool_loop import MMToolAgentLoop

    MMToolAgentLoop()


def build_classic_manager() -> None:
    from verl_mm_tools.step_hook.manager import MMToolAgentLoopManager

    MMToolAgentLoopManager(config=None, llm_client=None)


def build_replay_buffer() -> None:
    from verl_mm_tools.step_hook.replay_buffer import MMToolReplayBuffer

    MMToolReplayBuffer()


def build_per_sample_worker() -> None:
    from verl_mm_tools.runtime.workers import per_sample_worker_class

    per_sample_worker_class()


USES = [
    (LOOP_COPIES, build_loop),
    (CLASSIC_MANAGER, build_classic_manager),
    (V1_REPLAY_BUFFER, build_replay_buffer),
    (PER_SAMPLE_WORKER, build_per_sample_worker),
]


@pytest.fixture
def unconfirmed(monkeypatch):
    """No row checked yet in this process, and the refusing policy (the default)."""
    monkeypatch.setattr(guard, "_CONFIRMED", set())
    monkeypatch.delenv(guard.POLICY_ENV, raising=False)


@pytest.mark.parametrize("adaptation", EXTENSION_ROWS, ids=lambda adaptation: adaptation.locations()[0].name)
def test_each_extension_row_pins_verl_code_and_passes_against_the_installed_verl(adaptation, unconfirmed):
    assert adaptation.targets
    guard.confirm(adaptation)
    assert adaptation in guard._CONFIRMED


@pytest.mark.parametrize(("adaptation", "use"), USES, ids=[use.__name__ for _, use in USES])
def test_using_the_code_of_a_changed_row_refuses_to_start_naming_its_code(adaptation, use, unconfirmed, monkeypatch):
    monkeypatch.setattr(guard, "source_sha256", lambda code: "0" * 64)
    with pytest.raises(guard.VerlChangedError) as refused:
        use()
    message = str(refused.value)
    location = adaptation.locations()[0]
    for part in (
        f"{location.path}:{location.first_line}-{location.last_line} ({location.name})",
        "docs/verl_adaptations.md",
        adaptation.targets[0].qualname,
        "=warn to run it",
    ):
        assert part in message


def test_a_changed_row_downgraded_to_warn_is_logged_once_and_its_code_runs(unconfirmed, monkeypatch, caplog):
    monkeypatch.setattr(guard, "source_sha256", lambda code: "0" * 64)
    monkeypatch.setenv(guard.POLICY_ENV, guard.WARN)
    from verl_mm_tools.runtime.workers import per_sample_worker_class

    with caplog.at_level(logging.ERROR, logger=guard.__name__):
        assert isinstance(per_sample_worker_class(), type)
        assert isinstance(per_sample_worker_class(), type)
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1, [record.getMessage() for record in errors]
    assert "verl_mm_tools/runtime/workers.py:" in errors[0].getMessage()
    assert "(per_sample_worker_class)" in errors[0].getMessage()
    assert "runs this code, written against the old one, as it is" in errors[0].getMessage()


def test_a_refused_row_is_checked_again_and_a_confirmed_one_is_not(unconfirmed, monkeypatch):
    changed = dataclasses.replace(LOOP_COPIES, targets=(Target("json", "dumps", "0" * 64),))
    for _ in range(2):
        with pytest.raises(guard.VerlChangedError):
            guard.confirm(changed)
    guard.confirm(LOOP_COPIES)
    monkeypatch.setattr(guard, "source_sha256", lambda code: pytest.fail("a confirmed row was hashed again"))
    guard.confirm(LOOP_COPIES)
