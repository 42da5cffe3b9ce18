"""The trainer supervisor (``verl_mm_tools.supervise``) on plain subprocesses: a process group stopped whole when the
watching block raises, SIGTERM to us raised as SystemExit, a SIGTERM-deaf trainer killed after its grace, and a
run's stray processes found by their environment; a trainer's command written down as a script that reruns it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from verl_mm_tools.supervise import (
    end_leftovers,
    kill_group,
    processes_with_environ,
    stop_gracefully,
    supervised,
    terminate_raises,
    tree_memory_bytes,
    write_trainer_script,
)

# A parent that starts a child in its own process group (as torchrun and Ray's driver do) and prints its pid.
PARENT_WITH_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)
DEAF_TO_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)


def wait_for_line(path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return text.strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} got no line within {timeout_s} s")


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stop", [kill_group, stop_gracefully], ids=["kill_group", "stop_gracefully"])
def test_a_raising_block_stops_the_whole_process_group(tmp_path, stop):
    log = tmp_path / "trainer.log"
    with pytest.raises(RuntimeError, match="interrupted"):
        with supervised([sys.executable, "-c", PARENT_WITH_CHILD], dict(os.environ), log, stop=stop) as process:
            child = int(wait_for_line(log))
            raise RuntimeError("interrupted")
    if stop is kill_group:  # SIGKILL to the whole group: the child goes too
        assert process.returncode == -signal.SIGKILL
        assert gone(child)
    else:  # SIGTERM to the driver, which (verl's) shuts its own workers down; this one leaves its child
        assert process.returncode == -signal.SIGTERM
        psutil.Process(child).kill()


def test_the_log_holds_the_process_output_and_a_clean_exit_stops_nothing(tmp_path):
    log = tmp_path / "out.log"
    command = [sys.executable, "-c", "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"]
    stops = []
    with supervised(command, dict(os.environ), log, stop=stops.append) as process:
        assert process.wait(30) == 0
    assert stops == []
    assert sorted(log.read_text().split("\n")) == ["", "to stderr", "to stdout"]


def test_sigterm_to_us_raises_system_exit_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as raised, terminate_raises():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert raised.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_trainer_deaf_to_sigterm_is_killed_after_its_grace(tmp_path, caplog):
    log = tmp_path / "deaf.log"
    with supervised([sys.executable, "-c", DEAF_TO_SIGTERM], dict(os.environ), log, stop=kill_group) as process:
        wait_for_line(log)
        with caplog.at_level(logging.WARNING, logger="verl_mm_tools.supervise"):
            stop_gracefully(process, timeout_s=0.5)
    assert process.returncode == -signal.SIGKILL
    assert "the trainer did not stop within 0.5s of SIGTERM; killing its process group" in caplog.text


def test_a_run_s_processes_are_found_by_their_environment_and_leftovers_killed(tmp_path, caplog):
    marker = str(tmp_path / "metrics.jsonl")
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": marker}
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while not processes_with_environ("VERL_FILE_LOGGER_PATH", marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [found.pid for found in processes_with_environ("VERL_FILE_LOGGER_PATH", marker)] == [stray.pid]
        assert tree_memory_bytes(stray.pid) > 0
        with caplog.at_level(logging.WARNING, logger="verl_mm_tools.supervise"):
            end_leftovers(lambda: processes_with_environ("VERL_FILE_LOGGER_PATH", marker), grace_s=0.2)
        assert stray.wait(10) == -signal.SIGKILL
        assert f"killing process {stray.pid}" in caplog.text
    finally:
        stray.kill()
        stray.wait()


def test_the_trainer_script_reruns_the_command_with_its_named_environment_and_extra_arguments(tmp_path):
    command = [
        sys.executable,
        "-c",
        "import os, sys; print(os.environ.get('SET'), os.environ.get('LEFT'), sys.argv[1:])",
    ]
    env = {"SET": "a value with 'quotes'", "LEFT": "not written"}
    script = write_trainer_script(tmp_path / "command.sh", command, env, ("SET", "ABSENT"), "why this command")
    assert script.read_text().splitlines()[:2] == ["#!/usr/bin/env bash", "# why this command"]
    assert os.access(script, os.X_OK)
    result = subprocess.run(
        [str(script), "extra=1"], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    assert result.stdout.strip() == "a value with 'quotes' None ['extra=1']", result.stderr
