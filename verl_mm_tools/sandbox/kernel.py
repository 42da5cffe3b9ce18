"""The kernel: the process that runs model-written code inside the sandbox, one per trajectory, like a notebook kernel.

This file runs as a script inside bubblewrap (``python -I -S kernel.py SETTINGS_JSON``) where nothing of this package is
importable, so it uses the standard library only (PIL and matplotlib are imported when they are bound into the sandbox).
The host imports it too, for the wire format (``write_message`` / ``read_message``), which it is the one definition of.

At start the kernel keeps the protocol pipes on private descriptors, points fds 0-2 elsewhere (fd 1 and 2 to an unlinked
file read back after each call), sets its own resource limits, patches ``PIL.Image.Image.save`` and ``show`` to collect
every image the code saves or shows, and answers ``{"ready": true}``. Then it serves requests: the new images of the
trajectory (kept as ``images[id]`` and written as ``image_<id>.png``) and the code to run. Code shares one namespace
across calls. What it printed (capped), its traceback, and the images it saved, showed or left open as matplotlib
figures come back (a figure saved in the call only once). The kernel's own checks are a courtesy to the model: the code
runs in this process and can undo them, so the host checks everything it reads again.
"""

from __future__ import annotations

import ast
import io
import json
import math
import os
import resource
import signal
import struct
import sys
import time
import traceback
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # PIL is imported in the sandbox once its packages are bound (load_packages)
    from PIL import Image

# a message: 4-byte big-endian length of a JSON header, 4-byte length of the binary blobs, the header, the blobs
FRAME = struct.Struct(">II")
MODES = {"RGB": 3, "RGBA": 4, "L": 1}  # image modes on the wire, with their bytes per pixel
MAX_NOTES = 5  # notes on refused images per call; further refusals are counted in one more note
REPLY_KEYS = frozenset({"call", "output", "cut", "failed", "images", "refused", "more_refused", "blobs"})


class ProtocolError(Exception):
    """A message broke the wire format or its limits."""


class CPUTimeExceeded(BaseException):
    """The call used up its CPU seconds (SIGXCPU). A BaseException, so ``except Exception`` in the code does not
    swallow it."""


def write_message(stream: BinaryIO, header: dict[str, Any], blobs: list[bytes] = ()) -> None:  # type: ignore[assignment]
    header = {**header, "blobs": [len(blob) for blob in blobs]}
    data = json.dumps(header).encode()
    stream.write(FRAME.pack(len(data), sum(len(blob) for blob in blobs)) + data)
    for blob in blobs:
        stream.write(blob)
    stream.flush()


def parse_header(data: bytes, blob_size: int) -> tuple[dict[str, Any], list[int]]:
    """A message's JSON header and its blob sizes, checked against the frame's ``blob_size``."""
    try:
        header = json.loads(data)
    except ValueError as error:
        raise ProtocolError(f"the message header is not JSON ({error})") from None
    except RecursionError:
        raise ProtocolError("the message header nests too deeply to be decoded") from None
    sizes = header.get("blobs") if isinstance(header, dict) else None
    if not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes) or sum(sizes) != blob_size:
        raise ProtocolError(f"the message's blob sizes {str(sizes)[:100]} do not add up to {blob_size}")
    return header, sizes


def split_message(frame: bytes, payload: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """The header and blobs of a message whose JSON header and blob bytes were read (``payload``: header + blobs)."""
    header_size, blob_size = FRAME.unpack(frame)
    header, sizes = parse_header(payload[:header_size], blob_size)
    blobs, offset = [], header_size
    for size in sizes:
        blobs.append(payload[offset : offset + size])
        offset += size
    return header, blobs


def read_message(stream: BinaryIO) -> tuple[dict[str, Any], list[bytes]] | None:
    """The next message, or None at the end of the stream (the kernel's side: the host is trusted)."""
    frame = _read_exact(stream, FRAME.size)
    if frame is None:
        return None
    header_size, blob_size = FRAME.unpack(frame)
    payload = _read_exact(stream, header_size + blob_size)
    return None if payload is None else split_message(frame, payload)


def refusal(width: int, height: int, returned: int, returned_pixels: int, limits: dict[str, Any]) -> str | None:
    """Why an image of ``width`` x ``height`` px is not returned after ``returned`` images of ``returned_pixels``
    pixels in all in this call (None: it is returned). One rule for the kernel's courtesy check and the host's own."""
    ratio = limits["max_aspect_ratio"]
    if returned >= limits["max_images"]:
        return f"at most {limits['max_images']} per call"
    if width < 1 or height < 1:
        return f"it is {width}x{height} px and has no pixels"
    if width * height > limits["max_image_pixels"]:
        return f"{width}x{height} px is over the limit of {limits['max_image_pixels']} pixels; resize it first"
    if max(width, height) > ratio * min(width, height):
        return f"it is {width}x{height} px and its sides may differ by at most {ratio}x; crop or pad it first"
    if returned_pixels + width * height > limits["max_total_pixels"]:
        return (
            f"the images of one call may hold {limits['max_total_pixels']} pixels together; return fewer or "
            "smaller ones"
        )
    return None


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    """``size`` bytes (a pipe gives them in pieces), or None when the stream ends first."""
    parts, missing = [], size
    while missing:
        chunk = stream.read(missing)
        if not chunk:
            return None
        parts.append(chunk)
        missing -= len(chunk)
    return b"".join(parts)


# ----- inside the sandbox ---------------------------------------------------------------------------------------


class CappedText(io.TextIOBase):
    """stdout and stderr of the code: the first ``limit`` characters kept, the rest counted."""

    def __init__(self, limit: int):
        self.limit, self.kept, self.dropped = limit, 0, 0
        self.parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        text = str(text)
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def text(self) -> str:
        return "".join(self.parts)


class Kernel:
    """The kernel's state: settings, the namespace, the trajectory's images, what the current call produced."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings
        self.pid = os.getpid()
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.images: dict[int, Image.Image] = {}
        self.outputs: list[tuple[Image.Image, str]] = []
        self.returned_pixels = 0
        self.refused: list[str] = []
        self.more_refused = 0
        self.pil: Any = None
        self.original_save: Any = None
        self.output_fd = -1

    # ----- set-up ---------------------------------------------------------------------------------------------

    def isolate_descriptors(self) -> tuple[BinaryIO, BinaryIO]:
        """The protocol pipes on private descriptors; stdin /dev/null; stdout and stderr an unlinked file."""
        reader = os.fdopen(os.dup(0), "rb", buffering=0)
        writer = os.fdopen(os.dup(1), "wb")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        path = os.path.join(self.settings["workdir"], f".kernel-output-{self.pid}")
        self.output_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.unlink(path)
        os.dup2(self.output_fd, 1)
        os.dup2(self.output_fd, 2)
        sys.stdout = sys.stderr = CappedText(0)
        return reader, writer

    def set_limits(self) -> None:
        limits = self.settings["limits"]
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file size limit fails instead of killing
        signal.signal(signal.SIGXCPU, self._on_cpu_limit)
        mib = 1 << 20
        for which, value in (
            (resource.RLIMIT_AS, limits["memory_mb"] * mib),
            (resource.RLIMIT_FSIZE, limits["max_file_mb"] * mib),
            (resource.RLIMIT_NOFILE, limits["max_open_files"]),
            (resource.RLIMIT_NPROC, limits["max_processes"]),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(which, (value, value))
        session = int(limits["session_cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (session, session + 1))

    def _on_cpu_limit(self, signum: int, frame: FrameType | None) -> None:
        raise CPUTimeExceeded(f"the code used up its {self.settings['limits']['cpu_s']:g} CPU seconds")

    def load_packages(self) -> None:
        sys.path.extend(self.settings["site"])
        try:
            from PIL import Image
        except ImportError:
            return
        self.pil, self.original_save = Image, Image.Image.save
        kernel = self

        def save(image: Any, fp: Any, format: Any = None, **params: Any) -> Any:  # noqa: A002 - PIL's own name
            result = kernel.original_save(image, fp, format, **params)
            kernel.collect(image, f"saved to {fp}" if isinstance(fp, (str, os.PathLike)) else "saved")
            return result

        def show(image: Any, title: Any = None) -> None:
            kernel.collect(image, "shown")

        Image.Image.save = save  # type: ignore[method-assign,assignment]
        Image.Image.show = show  # type: ignore[method-assign,assignment]
        self.namespace["Image"] = Image
        self.namespace["images"] = self.images

    # ----- one call -------------------------------------------------------------------------------------------

    def collect(self, image: Image.Image, origin: str) -> None:
        width, height = image.width, image.height
        reason = refusal(width, height, len(self.outputs), self.returned_pixels, self.settings["limits"])
        if reason is None:
            self.outputs.append((image.copy(), origin))
            self.returned_pixels += width * height
        elif len(self.refused) < MAX_NOTES:
            self.refused.append(f"an image {origin} was not returned: {reason}")
        else:
            self.more_refused += 1

    def take_images(self, header: dict[str, Any], blobs: list[bytes]) -> None:
        for key in [key for key in self.images if key > header["keep"]]:
            del self.images[key]
        for entry, blob in zip(header["images"], blobs):
            image = self.pil.frombytes(entry["mode"], tuple(entry["size"]), blob)
            self.images[entry["id"]] = image
            path = os.path.join(self.settings["workdir"], f"image_{entry['id']}.png")
            self.original_save(image, path, compress_level=1)

    def run(self, code: str) -> tuple[str, bool, int]:
        """Run ``code`` in the namespace: (printed text with the traceback, whether it raised, characters cut)."""
        captured = CappedText(self.settings["limits"]["max_output_chars"])
        sys.stdout = sys.stderr = captured
        os.ftruncate(self.output_fd, 0)
        os.lseek(self.output_fd, 0, os.SEEK_SET)
        self._arm_cpu_limit()
        failed = False
        try:
            self._execute(code)
        except BaseException as error:  # noqa: BLE001 - the model's code may raise anything; it reads the traceback
            failed = True
            captured.write(self._traceback(error))
        finally:
            if os.getpid() != self.pid:  # a process the code forked must not go on as the kernel
                os._exit(0)
            sys.stdout = sys.stderr = CappedText(0)
        self._end_leftover_processes()
        self._collect_figures()
        text, unread = self._descriptor_output()
        captured.write(text)
        return captured.text(), failed, captured.dropped + unread

    def _arm_cpu_limit(self) -> None:
        """RLIMIT_CPU counts whole seconds of the process: the soft limit is the seconds spent so far rounded up, plus
        ``cpu_s``, so a call gets at least ``cpu_s`` and less than a second more (rounded down, after an earlier
        call's 1.9 s a call of ``cpu_s: 1`` had 0.1 s)."""
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = used.ru_utime + used.ru_stime
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        limit = math.ceil(spent) + math.ceil(self.settings["limits"]["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (min(hard, limit), hard))

    def _execute(self, code: str) -> None:
        tree = ast.parse(code, "<code>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert last is None or isinstance(last, ast.Expr)
        exec(compile(tree, "<code>", "exec"), self.namespace)  # running it is the point
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<code>", "eval"), self.namespace)
            if value is not None:
                print(repr(value))

    def _traceback(self, error: BaseException) -> str:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__]
        lines = traceback.format_list(frames) if frames else []
        head = "Traceback (most recent call last):\n" if lines else ""
        return head + "".join(lines) + "".join(traceback.format_exception_only(type(error), error))

    def _end_leftover_processes(self) -> None:
        """Kill every process the code left running and reap the kernel's own children; the orphans' zombies are
        bubblewrap's (pid 1 of the sandbox's PID namespace), which reaps them. Waits until no process but those two
        is left, zombies included, up to about a second for a fork bomb's last children."""
        if not self.settings["own_pid_namespace"]:
            return
        for _ in range(200):
            others = {pid: state for pid, state in _pids().items() if pid not in (1, self.pid)}
            if not others:
                return
            for pid in [pid for pid, state in others.items() if state != "Z"]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
            time.sleep(0.005)

    def _collect_figures(self) -> None:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None or self.pil is None:
            return
        try:
            for number in pyplot.get_fignums():
                figure = pyplot.figure(number)
                figure.canvas.draw()
                rgba = self.pil.frombuffer("RGBA", figure.canvas.get_width_height(), figure.canvas.buffer_rgba())
                if not self._saved_already(rgba):
                    self.collect(rgba.convert("RGB"), f"matplotlib figure {number}")
        finally:
            pyplot.close("all")

    def _saved_already(self, rgba: Image.Image) -> bool:
        """Whether the code saved this figure in this call (``savefig`` writes it through PIL): returned once."""
        data = rgba.tobytes()
        return any(
            image.mode == "RGBA" and image.size == rgba.size and image.tobytes() == data for image, _ in self.outputs
        )

    def _descriptor_output(self) -> tuple[str, int]:
        """What was written to fd 1 and 2 directly (subprocesses, C code, os.write), capped, and the bytes left
        unread past the cap."""
        os.lseek(self.output_fd, 0, os.SEEK_SET)
        data = os.read(self.output_fd, self.settings["limits"]["max_output_chars"])
        return data.decode("utf-8", "replace"), max(0, os.fstat(self.output_fd).st_size - len(data))

    def reply(self, call: str, text: str, failed: bool, cut: int) -> tuple[dict[str, Any], list[bytes]]:
        entries, blobs = [], []
        for image, origin in self.outputs:
            if image.mode not in MODES:
                image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
            entries.append({"mode": image.mode, "size": [image.width, image.height], "origin": origin})
            blobs.append(image.tobytes())
        header = {
            "call": call,
            "output": text,
            "cut": cut,
            "failed": failed,
            "images": entries,
            "refused": self.refused,
            "more_refused": self.more_refused,
        }
        self.outputs, self.returned_pixels, self.refused, self.more_refused = [], 0, [], 0
        return header, blobs


def _pids() -> dict[int, str]:
    """The processes of this PID namespace with their states (``Z``: a zombie)."""
    pids = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as stat:
                if name.isdigit():
                    pids[int(name)] = stat.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
    return pids


def serve(settings: dict[str, Any]) -> None:
    kernel = Kernel(settings)
    os.chdir(settings["workdir"])
    reader, writer = kernel.isolate_descriptors()
    kernel.set_limits()
    kernel.load_packages()
    write_message(writer, {"ready": True, "pil": kernel.pil is not None})
    while (message := read_message(reader)) is not None:
        header, blobs = message
        try:
            if kernel.pil is not None:
                kernel.take_images(header, blobs)
            text, failed, cut = kernel.run(header["code"])
        except Exception as error:  # noqa: BLE001 - the kernel's own failure (the code may have broken it): say it
            text, failed, cut = f"the kernel itself failed: {type(error).__name__}: {error}", True, 0
        write_message(writer, *kernel.reply(header["call"], text, failed, cut))


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
