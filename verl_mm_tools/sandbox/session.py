"""``KernelProcess``: the host's side of one sandboxed kernel (one trajectory's Python session).

Blocking and thread-safe (one call at a time per kernel): the tool runs it on a worker thread. Everything read from
the kernel is untrusted (the model's code runs in that process and can write replies of its own): sizes are checked
before bytes are read, every read has a deadline, a reply's header is checked field by field (types, sizes, counts,
modes, the call it answers) before any image is decoded, and the images' sizes are checked against the limits before
their pixels are read, so a call never holds more than ``max_total_pixels`` decoded pixels. A kernel that breaks the
wire format in any way, exits or runs past ``timeout_s`` is killed with its whole process group and PID namespace
(``KernelLost``, answered as text); the next call starts a fresh one.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import select
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from PIL import Image

from verl_mm_tools.ops.geometry import MAX_ASPECT_RATIO
from verl_mm_tools.sandbox import kernel as wire
from verl_mm_tools.sandbox.bwrap import (
    ENV,
    KERNEL_SCRIPT,
    SITE,
    WORKDIR,
    Bind,
    check_bwrap,
    default_packages,
    kernel_program,
    package_binds,
    sandbox_command,
)
from verl_mm_tools.sandbox.limits import SandboxLimits
from verl_mm_tools.sandbox.seccomp import seccomp_filter

logger = logging.getLogger(__name__)

BWRAP, NONE = "bwrap", "none"
SANDBOX_MODES = (BWRAP, NONE)
MAX_HEADER_BYTES = 1 << 20  # the JSON header of a reply, output text included
MAX_NOTE_CHARS, MAX_ORIGIN_CHARS = 300, 100  # of a note, and of where an image came from, as the kernel says them
_LIVE: weakref.WeakSet[KernelProcess] = weakref.WeakSet()


class KernelLost(RuntimeError):
    """The kernel died, timed out or broke the wire format; it was killed. The message is for the model."""


@dataclass
class RunResult:
    """What one call produced: printed text (with the traceback when ``failed``) and how many characters of it were
    cut, images with where they came from, notes on refused images (at most ``wire.MAX_NOTES``, the rest counted in
    ``more_refused``); ``lost``: the session was lost (time-out, crash, a broken reply), so the next call starts
    afresh."""

    output: str = ""
    cut: int = 0
    failed: bool = False
    images: list[tuple[Image.Image, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    more_refused: int = 0
    lost: str | None = None

    def refuse(self, note: str) -> None:
        """Note a refused image: a few notes, then a count."""
        if len(self.refused) < wire.MAX_NOTES:
            self.refused.append(note[:MAX_NOTE_CHARS])
        else:
            self.more_refused += 1


class KernelProcess:
    """One kernel: started by ``start`` (or the first ``run``), ended by ``close``. ``sandbox``: "bwrap" or "none"."""

    def __init__(
        self,
        limits: SandboxLimits,
        sandbox: str = BWRAP,
        packages: tuple[str, ...] | None = None,
        bwrap: str = "bwrap",
    ):
        self.limits, self.sandbox = limits, sandbox
        self.wire_limits: dict[str, Any] = {**limits.as_dict(), "max_aspect_ratio": MAX_ASPECT_RATIO}
        self.bwrap = check_bwrap(bwrap) if sandbox == BWRAP else bwrap
        self.binds = package_binds(default_packages() if packages is None else packages)
        self.process: subprocess.Popen[bytes] | None = None
        self.held_images: list[Image.Image] = []  # the trajectory's images the kernel holds, by identity
        self.lock = threading.Lock()
        self.started_s = 0.0  # how long the last start took
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._errors: IO[bytes] | None = None
        self._info: int | None = None  # the read end of bubblewrap's --info-fd
        self._info_fd = -1
        self._seccomp_fd: int | None = None  # the read end of the pipe bubblewrap reads the seccomp filter from
        self.sandbox_pid: int | None = None
        self._launched_at = 0.0
        self.ready = False
        _LIVE.add(self)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ----- start and stop -------------------------------------------------------------------------------------

    def _command(self) -> tuple[list[str], str]:
        """The command and the work directory of a new kernel."""
        settings = {"limits": self.wire_limits, "own_pid_namespace": self.sandbox == BWRAP}
        if self.sandbox == BWRAP:
            settings.update(workdir=WORKDIR, site=[SITE])
            binds = [Bind(wire.__file__, KERNEL_SCRIPT), *self.binds]
            program = kernel_program(json.dumps(settings))
            command = sandbox_command(
                self.bwrap, binds, self.limits.workdir_mb, program, self._info_fd, self._seccomp_fd
            )
            return command, "/"
        self._scratch = tempfile.TemporaryDirectory(prefix="verl-mm-python-")
        sites = sorted({str(Path(bind.source).parent) for bind in self.binds})
        settings.update(workdir=self._scratch.name, site=sites)
        program = kernel_program(json.dumps(settings))
        return [program[0], "-I", "-S", "-B", wire.__file__, program[-1]], self._scratch.name

    def launch(self) -> None:
        """Start a kernel process (ending the one running) without waiting for it. Call it from a long-lived thread
        (the event loop's): bubblewrap's --die-with-parent ends the sandbox when the thread that started it ends."""
        with self.lock:
            self._launch()

    def _launch(self) -> None:
        self.close()
        if self.sandbox == NONE:
            logger.warning(
                "python tool: starting a kernel WITHOUT a sandbox (sandbox: none): model-written code runs with this "
                "process's user, files and network; only resource limits apply"
            )
        info_read, self._info_fd = os.pipe()
        self._seccomp_fd = self._filter_pipe() if self.sandbox == BWRAP else None
        try:
            command, cwd = self._command()
            self._launched_at = time.perf_counter()
            self._errors = tempfile.TemporaryFile()
            self.process = self._popen(command, cwd)
        finally:
            os.close(self._info_fd)
            if self._seccomp_fd is not None:
                os.close(self._seccomp_fd)
        self._info = info_read
        self.ready, self.held_images = False, []

    def _popen(self, command: list[str], cwd: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            cwd=cwd,
            env=dict(ENV) if self.sandbox == NONE else {"PATH": ENV["PATH"]},
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(fd for fd in (self._info_fd, self._seccomp_fd) if fd is not None),
        )

    @staticmethod
    def _filter_pipe() -> int | None:
        """A pipe holding the seccomp filter (it fits the pipe's buffer), its read end; None where none is built."""
        program = seccomp_filter()
        if program is None:
            logger.warning(
                "python tool: no seccomp filter for this architecture: the sandbox's code reaches every system call "
                "(namespaces, ptrace, bpf) as an unprivileged user"
            )
            return None
        read, write = os.pipe()
        os.write(write, program)
        os.close(write)
        return read

    def start(self) -> float:
        """Start a kernel (ending the one running) and wait until it is ready; the seconds that took."""
        with self.lock:
            self._launch()
            return self._await_ready()

    def _await_ready(self) -> float:
        assert self.process is not None and self._errors is not None
        try:
            header, blobs = self._read_header(self._launched_at + self.limits.startup_timeout_s, "start")
        except KernelLost as error:
            self._errors.seek(0)
            detail = self._errors.read(2000).decode(errors="replace").strip()
            raise KernelLost(f"{error}{'; it said: ' + detail if detail else ''}") from None
        finally:
            self._errors.close()
        if header.get("ready") is not True or blobs:
            raise KernelLost(f"the kernel answered {str(header)[:200]} instead of ready")
        self.sandbox_pid = self._sandbox_pid()
        self.ready, self.started_s = True, time.perf_counter() - self._launched_at
        logger.debug("python tool: kernel pid %s started in %.3f s", self.process.pid, self.started_s)
        return self.started_s

    def _sandbox_pid(self) -> int | None:
        """The host pid of the sandbox's init (bubblewrap's --info-fd; None without bubblewrap)."""
        if self._info is None:
            return None
        os.set_blocking(self._info, False)
        try:
            info = json.loads(os.read(self._info, 4096) or b"{}")
        except (OSError, ValueError):
            info = {}
        pid = info.get("child-pid") if isinstance(info, dict) else None
        return pid if isinstance(pid, int) and pid > 1 else None

    def close(self) -> None:
        """Kill the kernel: the sandbox's init first (its PID namespace dies with it: the kernel and every process
        it started, before the init is gone), then bubblewrap's process group; returns when they are gone."""
        process, self.process = self.process, None
        if self._info is not None:
            os.close(self._info)
            self._info = None
        sandbox_pid, self.sandbox_pid = self.sandbox_pid, None
        if sandbox_pid is not None:
            _kill_and_wait(sandbox_pid)
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
            process.wait(timeout=10)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
        self.held_images, self.ready = [], False

    # ----- a call ---------------------------------------------------------------------------------------------

    def run(self, code: str, images: list[Image.Image]) -> RunResult:
        """Run ``code`` with the trajectory's ``images`` (1-based ids, in order) readable; a lost kernel (dead,
        timed out, broken messages) is killed and reported in ``lost``, never raised."""
        with self.lock:
            try:
                if not self.alive:
                    self._launch()
                if not self.ready:
                    self._await_ready()
                return self._run(code, images)
            except KernelLost as error:
                self.close()
                return RunResult(lost=str(error))
            except Exception as error:  # whatever else a reply broke (logged): the session is out of step
                logger.warning("python tool: a kernel's reply broke the host's reading of it", exc_info=True)
                self.close()
                return RunResult(lost=f"the kernel's reply could not be read ({type(error).__name__})")

    def _run(self, code: str, images: list[Image.Image]) -> RunResult:
        keep = 0
        for held, current in zip(self.held_images, images):
            if held is not current:
                break
            keep += 1
        entries, blobs = [], []
        for image_id, image in enumerate(images[keep:], start=keep + 1):
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            entries.append({"id": image_id, "mode": "RGB", "size": [rgb.width, rgb.height]})
            blobs.append(rgb.tobytes())
        deadline, call = time.perf_counter() + self.limits.timeout_s, secrets.token_hex(8)
        self._write({"call": call, "code": code, "keep": keep, "images": entries}, blobs, deadline)
        self.held_images = list(images)
        header, sizes = self._read_header(deadline, "call")
        result, returned_pixels = _checked_reply(header, call, sizes, self.limits.max_output_chars), 0
        for entry, size in zip(header["images"], sizes):
            returned_pixels += self._read_image(entry, size, result, returned_pixels, deadline)
        return result

    def _read_image(self, entry: dict, size: int, result: RunResult, returned_pixels: int, deadline: float) -> int:
        """The next blob: decoded into ``result`` when the limits admit its image (after ``returned_pixels`` pixels
        of this call's images), else read past with a note; the pixels it added."""
        (width, height), origin = entry["size"], entry["origin"][:MAX_ORIGIN_CHARS]
        reason = wire.refusal(width, height, len(result.images), returned_pixels, self.wire_limits)
        if reason is not None:
            self._read_exact(size, deadline, "call", keep=False)
            result.refuse(f"an image {origin} was not returned: {reason}")
            return 0
        image = Image.frombytes(entry["mode"], (width, height), self._read_exact(size, deadline, "call"))
        result.images.append((image, origin))
        return width * height

    # ----- the pipes ------------------------------------------------------------------------------------------

    def _write(self, header: dict, blobs: list[bytes], deadline: float) -> None:
        assert self.process is not None and self.process.stdin is not None
        header = {**header, "blobs": [len(blob) for blob in blobs]}
        data = json.dumps(header).encode()
        chunks = [wire.FRAME.pack(len(data), sum(map(len, blobs))), data, *blobs]
        fd = self.process.stdin.fileno()
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                self._wait(fd, select.POLLOUT, deadline, "call")
                try:
                    view = view[os.write(fd, view[: 1 << 16]) :]
                except (BrokenPipeError, ConnectionResetError):
                    raise KernelLost(self._death("call")) from None

    def _read_header(self, deadline: float, what: str) -> tuple[dict, list[int]]:
        """A reply's header and its blobs' sizes; the blobs are left in the pipe, to be read one by one."""
        frame = self._read_exact(wire.FRAME.size, deadline, what)
        header_size, blob_size = wire.FRAME.unpack(frame)
        most_blobs = self.limits.max_images * min(self.limits.max_image_pixels, 1 << 26) * 4
        if header_size > MAX_HEADER_BYTES + 4 * self.limits.max_output_chars or blob_size > most_blobs:
            raise KernelLost(f"the kernel sent a reply over the size limits ({header_size} + {blob_size} bytes)")
        try:
            return wire.parse_header(self._read_exact(header_size, deadline, what), blob_size)
        except wire.ProtocolError as error:
            raise KernelLost(f"the kernel's reply was malformed: {error}") from None

    def _read_exact(self, size: int, deadline: float, what: str, keep: bool = True) -> bytes:
        """``size`` bytes of the reply pipe (``keep=False``: read past them, keeping none)."""
        assert self.process is not None and self.process.stdout is not None
        fd, parts, missing = self.process.stdout.fileno(), [], size
        while missing:
            self._wait(fd, select.POLLIN, deadline, what)
            chunk = os.read(fd, min(missing, 1 << 20))
            if not chunk:
                raise KernelLost(self._death(what))
            if keep:
                parts.append(chunk)
            missing -= len(chunk)
        return b"".join(parts)

    def _wait(self, fd: int, event: int, deadline: float, what: str) -> None:
        poller = select.poll()
        poller.register(fd, event)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                seconds = self.limits.timeout_s if what == "call" else self.limits.startup_timeout_s
                raise KernelLost(f"the {what} ran longer than {seconds:g} s and was stopped")
            if poller.poll(left * 1000):
                return

    def _death(self, what: str) -> str:
        try:
            code = self.process.wait(timeout=2) if self.process is not None else None
        except subprocess.TimeoutExpired:
            return f"the kernel closed its pipe during the {what}"
        if code is not None and code < 0:
            return f"the kernel was killed by signal {signal.Signals(-code).name} during the {what}"
        return f"the kernel exited (status {code}) during the {what}"


def _checked_reply(header: dict, call: str, sizes: list[int], max_output_chars: int) -> RunResult:
    """The text part of a call's reply, every field checked (types, counts, modes, sizes against the blobs) before
    any of it is used; KernelLost naming the first field that is wrong."""
    _expect(set(header) == wire.REPLY_KEYS, f"its fields are {sorted(map(str, header))[:10]}")
    _expect(header["call"] == call, "it answers another call (a reply written by the code in an earlier call?)")
    output, cut, failed = header["output"], header["cut"], header["failed"]
    _expect(type(output) is str and _count(cut) and type(failed) is bool, "output, cut or failed has the wrong type")
    entries, notes, more = header["images"], header["refused"], header["more_refused"]
    _expect(type(entries) is list and len(entries) == len(sizes), "its images do not match its blobs")
    _expect(type(notes) is list and all(type(note) is str for note in notes) and _count(more), "bad refusal notes")
    for entry, size in zip(entries, sizes):
        _expect(_valid_entry(entry, size), f"an image entry {str(entry)[:100]} does not match its {size} bytes")
    kept = output[:max_output_chars]
    result = RunResult(output=kept, cut=cut + len(output) - len(kept), failed=failed)
    for note in notes:
        result.refuse(note)
    result.more_refused += more
    return result


def _valid_entry(entry: object, size: int) -> bool:
    if type(entry) is not dict or set(entry) != {"mode", "size", "origin"} or type(entry["origin"]) is not str:
        return False
    mode, dimensions = entry["mode"], entry["size"]
    if type(mode) is not str or mode not in wire.MODES or type(dimensions) is not list or len(dimensions) != 2:
        return False
    return all(_count(value) for value in dimensions) and dimensions[0] * dimensions[1] * wire.MODES[mode] == size


def _count(value: object) -> bool:
    """A size or count as the wire carries them: a non-negative 32-bit int."""
    return type(value) is int and 0 <= value < 1 << 31


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise KernelLost(f"the kernel's reply was malformed: {what}")


def _kill_and_wait(pid: int, seconds: float = 5.0) -> None:
    """SIGKILL ``pid`` and wait until it has exited (gone, or a zombie: a namespace's init becomes one only after
    every other process of its namespace has exited)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.002)
    logger.warning("python tool: the sandbox init %s did not exit %g s after SIGKILL", pid, seconds)


@atexit.register
def _close_all() -> None:
    for kernel in list(_LIVE):
        kernel.close()
