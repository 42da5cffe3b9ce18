"""``SandboxLimits``: what one kernel may use. Parsed once from the tool's ``limits:`` mapping; no verl import."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from verl_mm_tools.errors import ConfigError, did_you_mean


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one kernel (one trajectory's Python session). Each has a range it is checked against.

    timeout_s: wall-clock seconds of one call; past it the whole sandbox is killed (the session restarts empty).
    cpu_s: CPU seconds of one call (RLIMIT_CPU, re-armed before each call); the code gets ``CPUTimeExceeded``.
    session_cpu_s: CPU seconds of the whole session (the hard RLIMIT_CPU): past it the kernel is killed.
    memory_mb: address space of the kernel and of each process it starts (RLIMIT_AS): ``MemoryError`` past it.
    max_processes: processes and threads of the sandbox's user (RLIMIT_NPROC; a fresh user id per kernel as root).
    max_file_mb: size of any one file written (RLIMIT_FSIZE): the write fails with EFBIG.
    max_open_files: open file descriptors (RLIMIT_NOFILE).
    workdir_mb: size of the private work directory (a tmpfs: all files written together).
    max_output_chars: characters of stdout and stderr returned per call (the rest is counted and cut).
    max_images: images returned per call (more are refused, with a note to the model).
    max_image_pixels: pixels of a returned image (larger ones are refused, with a note to the model).
    max_total_pixels: pixels of the images one call returns, together (images past it are refused, with a note);
        checked from the reply's header before any pixel is read, it bounds the host's memory per call.
    startup_timeout_s: how long a kernel may take to start (bubblewrap, Python, imports).
    """

    timeout_s: float = 10.0
    cpu_s: float = 10.0
    session_cpu_s: float = 300.0
    memory_mb: int = 2048
    max_processes: int = 32
    max_file_mb: int = 64
    max_open_files: int = 64
    workdir_mb: int = 256
    max_output_chars: int = 8192
    max_images: int = 8
    max_image_pixels: int = 16_777_216
    max_total_pixels: int = 16_777_216
    startup_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            low, high = _RANGES[field.name]
            value = getattr(self, field.name)
            kind = float if field.type in ("float", float) else int
            valid = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
            if not valid or not math.isfinite(value) or not low <= value <= high:
                noun = "a number" if kind is float else "an integer"
                raise ConfigError(
                    f"sandbox limit {field.name} must be {noun} between {low} and {high}, got {value!r}; "
                    "fix it in the tool's config.limits"
                )

    @classmethod
    def from_dict(cls, limits: Mapping[str, Any] | None) -> SandboxLimits:
        """Parse a ``limits:`` mapping; an unknown key is a ConfigError naming the closest known one."""
        if limits is not None and not isinstance(limits, Mapping):
            raise ConfigError(f"the python tool's limits must be a mapping such as {{timeout_s: 10}}, got {limits!r}")
        known = [field.name for field in dataclasses.fields(cls)]
        for key in limits or {}:
            if key not in known:
                raise ConfigError(
                    f"unknown sandbox limit {key!r}.{did_you_mean(str(key), known)} Known limits: {sorted(known)}"
                )
        return cls(**dict(limits or {}))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_RANGES: dict[str, tuple[float, float]] = {
    "timeout_s": (0.1, 3600),
    "cpu_s": (1, 3600),
    "session_cpu_s": (1, 86400),
    "memory_mb": (256, 1 << 20),
    "max_processes": (2, 4096),
    "max_file_mb": (1, 1 << 20),
    "max_open_files": (16, 65536),
    "workdir_mb": (1, 1 << 20),
    "max_output_chars": (64, 1 << 24),
    "max_images": (0, 1024),
    "max_image_pixels": (1, 1 << 28),
    "max_total_pixels": (1, 1 << 28),
    "startup_timeout_s": (1, 3600),
}
