"""A trainer subprocess under watch: started in its own session (so its process group holds everything it starts:
torchrun's workers, a Ray cluster), its output in a log file, and stopped with its whole group when the caller is
interrupted, times out or decides to stop it. The demo (``demo.watch``) and verl's SFT trainer (``cpu.sft``) run
their trainers through it, and write their command down with ``write_trainer_script`` to rerun or edit.

Light: the standard library and psutil only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType

import psutil

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60  # how long a trainer gets to shut its Ray cluster down after SIGTERM


@contextlib.contextmanager
def supervised(
    command: list[str], env: dict[str, str], log_path: Path, stop: Callable[[subprocess.Popen], None]
) -> Iterator[subprocess.Popen]:
    """``command`` running in its own session with its stdout and stderr in ``log_path``; ``stop(process)`` when the
    block raises (an interruption or a timeout included), then the error goes on."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            yield process
        except BaseException:
            stop(process)
            raise


def write_trainer_script(
    path: Path, command: list[str], env: dict[str, str], env_names: Iterable[str], comment: str
) -> Path:
    """Write ``command`` as an executable bash script at ``path``: the variables of ``env`` named in ``env_names`` (the
    ones it sets) before it, ``# comment`` above it; extra arguments to the script go last (hydra overrides win)."""
    exports = " ".join(f"{name}={shlex.quote(env[name])}" for name in env_names if name in env)
    path.write_text(
        f"#!/usr/bin/env bash\n# {comment}\n{exports} \\\n  "
        + " \\\n  ".join(shlex.quote(part) for part in command)
        + ' "$@"\n'
    )
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """While the block runs, SIGTERM to us raises SystemExit(128 + SIGTERM), so that ``supervised`` stops the trainer
    (in its own session, our SIGTERM does not reach it) on the way out."""

    def exit_on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_gracefully(process: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the driver (verl's shuts its Ray cluster down; SIGINT does nothing), then kill its process group if
    it has not stopped within ``timeout_s``."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        logger.warning("the trainer did not stop within %ss of SIGTERM; killing its process group", timeout_s)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process's whole group at once (torchrun and the trainer it started), and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def processes_with_environ(name: str, *values: str) -> list[psutil.Process]:
    """The processes whose environment sets ``name`` to one of ``values`` (children inherit their parent's
    environment, so a variable set for one trainer marks every process it started, Ray's workers included)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(name) in values:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_leftovers(find: Callable[[], list[psutil.Process]], grace_s: float = 30.0) -> None:
    """After the driver exits, Ray's workers take a moment to go: wait for ``find()`` to come back empty, then kill
    what is left."""
    deadline = time.monotonic() + grace_s
    while (leftovers := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in leftovers:
        logger.warning("killing process %d (%s), left running by the trainer", process.pid, process.name())
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def tree_memory_bytes(pid: int) -> int:
    """Proportional set size (shared pages split between their users) of a process and its descendants (Ray's
    workers descend from the trainer's driver). Summed RSS would count Ray's shared object store once per process."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total
