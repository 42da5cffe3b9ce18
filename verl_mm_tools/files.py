"""Confined file access and safe image decoding, for everything that reads a path a user or a model supplied.

``FileRoots`` is the only way this package reads such a path (a dataset image given as a path or ``file://`` URL,
a file a tool or an environment opens): the path is resolved (``..`` and symlinks, like ``os.path.realpath``;
relative paths against the first root) and must then lie inside one of the configured roots, be a regular file and
hold at most ``max_bytes``; anything else, and any URL, is refused with a ``FileAccessError`` saying what was asked,
why it was refused and how to allow it. No roots configured: every path is refused. Tools reach the trajectory's
roots with ``files_of(agent_data)``, environments with ``sample.files``; the mm_tool loop sets them from its
``file_roots`` option.

``decode_image`` turns untrusted bytes into an image: common raster formats only (never PIL's EPS plugin, which runs
Ghostscript), at most ``MAX_DECODE_PIXELS`` pixels judged from the header before any pixel is decoded (decompression
bombs), decoded completely up front (a truncated file fails here, not in the processor), and normalized by
``to_rgb``. No verl import.
"""

from __future__ import annotations

import io
import logging
import os
import re
import stat
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from verl_mm_tools.errors import ConfigError, FileAccessError, ImageInputError

# The one attribute the mm_tool loop sets on verl's AgentData: the trajectory's state (``TrajectoryState``), whose
# ``workspace`` and ``files`` are what a tool may use (``files_of``, ``workspace.workspace_of``).
STATE_ATTR = "mm_state"

logger = logging.getLogger(__name__)

MAX_DECODE_PIXELS = 1 << 26
"""Largest image (64 Mpx) decoded or accepted anywhere: larger headers are refused before any pixel is read."""
DEFAULT_MAX_BYTES = 64 << 20
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HIGH_DEPTH_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


@dataclass(frozen=True)
class FileRoots:
    """The directories paths may be read from (resolved, absolute); empty: nothing may be read."""

    roots: tuple[Path, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_config(
        cls, roots: str | os.PathLike | Iterable | None, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> FileRoots:
        """Roots from a config value: None, one path, or a list of absolute directory paths (``~`` expanded)."""
        if roots is None:
            return cls((), max_bytes)
        if isinstance(roots, (str, os.PathLike)):
            roots = [roots]
        return cls(tuple(_checked_root(root) for root in roots), max_bytes)

    def confined(self, path: object) -> Path:
        """The real path of ``path`` if it lies inside a root (it need not exist); FileAccessError otherwise."""
        text = _path_text(path)
        if not self.roots:
            raise FileAccessError(
                f"refused to read {text!r}: no file roots are configured; set the mm_tool option "
                "file_roots to the directories that hold your data"
            )
        candidate = Path(text).expanduser()
        real = Path(os.path.realpath(self.roots[0] / candidate))  # an absolute candidate replaces the root
        if not any(real == root or root in real.parents for root in self.roots):
            raise FileAccessError(
                f"refused to read {text!r}: it resolves to {str(real)!r}, outside the file roots "
                f"{[str(root) for root in self.roots]}; move the file under a root or add a root"
            )
        return real

    def resolve(self, path: object) -> Path:
        """The real path of ``path`` if it is a regular file inside a root; FileAccessError otherwise."""
        text, real = _path_text(path), self.confined(path)
        if not real.exists():
            raise FileAccessError(f"refused to read {text!r}: {str(real)!r} does not exist")
        if not real.is_file():
            raise FileAccessError(f"refused to read {text!r}: {str(real)!r} is not a regular file")
        return real

    def read_bytes(self, path: object) -> bytes:
        """The content of a file inside the roots (at most ``max_bytes``)."""
        real = self.resolve(path)
        descriptor = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(descriptor, "rb") as handle:
            self._check_opened(handle.fileno(), real)
            return handle.read()

    def _check_opened(self, descriptor: int, real: Path) -> None:
        """What was opened is still a regular file inside the roots (a directory may have been swapped for a
        symlink between ``resolve`` and ``open``), and small enough."""
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise FileAccessError(f"refused to read {str(real)!r}: it is not a regular file")
        opened = Path(f"/proc/self/fd/{descriptor}")
        if opened.exists():
            target = Path(os.path.realpath(opened))
            if not any(target == root or root in target.parents for root in self.roots):
                raise FileAccessError(f"refused to read {str(real)!r}: it changed to {str(target)!r} while opened")
        if info.st_size > self.max_bytes:
            raise FileAccessError(
                f"refused to read {str(real)!r}: {info.st_size} bytes, more than max_bytes={self.max_bytes}"
            )

    def open_image(self, path: object, *, max_pixels: int = MAX_DECODE_PIXELS) -> Image.Image:
        """The decoded RGB image stored in a file inside the roots."""
        return decode_image(self.read_bytes(path), source=_path_text(path), max_pixels=max_pixels)


def files_of(agent_data: object) -> FileRoots:
    """The file roots of a trajectory (set by the mm_tool loop); none, so nothing readable, elsewhere."""
    roots = getattr(getattr(agent_data, STATE_ATTR, None), "files", None)
    return roots if isinstance(roots, FileRoots) else FileRoots()


def _checked_root(root: object) -> Path:
    path = Path(_path_text(root)).expanduser()
    if not path.is_absolute():
        raise ConfigError(
            f"file_roots entries must be absolute directory paths, got {str(root)!r}; write e.g. "
            f"{str(Path.cwd() / path)!r}"
        )
    if not path.is_dir():
        raise ConfigError(f"file root {str(root)!r} is not an existing directory")
    return Path(os.path.realpath(path))


def is_url(text: str) -> bool:
    """``text`` starts with a URL scheme (``http://``, ``s3://``, ...)."""
    return bool(_URL.match(text))


def _path_text(path: object) -> str:
    """A path as text, ``file://`` stripped; URLs, bytes and NUL characters refused."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise FileAccessError(f"a file path must be a string, got {type(path).__name__}")
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif is_url(path):
        raise FileAccessError(
            f"refused to fetch {path[:80]!r}: only local files under the file roots are read; "
            "download it under a root first"
        )
    if "\0" in path or not path:
        raise FileAccessError(f"refused to read {path[:80]!r}: not a valid file path")
    return path


# ----- images -----------------------------------------------------------------------------------------------------


def decode_image(data: bytes, *, source: str, max_pixels: int = MAX_DECODE_PIXELS) -> Image.Image:
    """Untrusted image bytes as a fully decoded RGB image, or ImageInputError naming ``source``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            return loaded_rgb(image, source=source, max_pixels=max_pixels)
    except ImageInputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageInputError(f"{source}: refused as a decompression bomb ({error})") from None
    except Exception as error:  # noqa: BLE001 - PIL raises many kinds on corrupt data
        raise ImageInputError(f"{source}: cannot be decoded ({type(error).__name__}: {error})") from None


def loaded_rgb(image: Image.Image, *, source: str, max_pixels: int = MAX_DECODE_PIXELS) -> Image.Image:
    """A (maybe lazily opened) PIL image checked against ``max_pixels`` before decoding, decoded, and in RGB."""
    width, height = image.size
    if width < 1 or height < 1 or width * height > max_pixels:
        raise ImageInputError(f"{source}: {width}x{height} px is outside 1..{max_pixels} px; shrink it before use")
    try:
        image.load()
    except Exception as error:  # noqa: BLE001 - truncated or corrupt data
        raise ImageInputError(f"{source}: cannot be decoded ({type(error).__name__}: {error})") from None
    return to_rgb(image)


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB (itself when it already is): transparency composited over white (as qwen_vl_utils does),
    16-bit, 32-bit and float images stretched to 8 bits (a plain conversion clips them to white)."""
    if image.mode == "RGB":
        return image
    if image.mode in _HIGH_DEPTH_MODES:
        return _stretched_to_8_bits(image).convert("RGB")
    if image.mode in _ALPHA_MODES or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _stretched_to_8_bits(image: Image.Image) -> Image.Image:
    values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = float(values.min()), float(values.max())
    if low < 0 or high > 255:  # already 8-bit values are kept as they are
        values = (values - low) * (255.0 / (high - low)) if high > low else np.zeros_like(values)
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))  # 2-D uint8: mode L
