"""The one reader of recorded trajectories: every ``trajectory.json`` under the given folders (training dumps,
``verl-mm-tools eval`` output) or given as files, for ``export-sft``, ``rescore``, ``view`` and the demo.

A record is data someone else wrote, so the reader trusts none of it:

- every file a record names is resolved inside that record's own folder: an absolute path, a ``..`` or a symbolic
  link leading out of it is refused, and so is a record file that is itself a link out of its folder;
- every image file is decoded once, under PIL's decompression-bomb guard and ``MAX_IMAGE_PIXELS``, and must have the
  size the record says;
- every field has its type and range (``record_checks``), the format and version are ones this version reads;
- folders holding a command's output (``OUTPUT_MARKERS``) and the caller's own output folder are not read.

A bad record never stops the others: ``load_records`` returns the good ones and each bad one with its file and one
line saying why. Pure: no verl, no torch (the viewer and the commands' parsers use it)."""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RECORD_FILE, SITE_DIR, STAGING_DIR, RecordError, read_record
from verl_mm_tools.trajectories.record_checks import FieldError, check_fields

logger = logging.getLogger(__name__)

SITE_MARKER = ".verl-mm-tools-site"  # written by view into its site
RESCORE_MARKER = "rescore.json"  # written first by rescore into its output (rescore_options.SETTINGS_FILE)
EXPORT_MARKER = "export.json"  # written by export-sft (sft.SUMMARY_FILE)
OUTPUT_MARKERS = (SITE_MARKER, RESCORE_MARKER, EXPORT_MARKER)
MAX_IMAGE_PIXELS = 64 * 1024 * 1024  # far above any VLM's max_pixels; PIL's own bomb guard is twice its default
MAX_IMAGES = 1024  # images of one record (the loop's default max_images is 16)
IMAGE_FORMATS = {"file": ("PNG",), "thumb": ("JPEG", "PNG")}
TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class LoadedRecord:
    """One checked record, where it lives and its checked image files (by image id: ``files``, ``thumbs``)."""

    record: dict
    path: Path
    files: dict[int, Path] = field(default_factory=dict)
    thumbs: dict[int, Path] = field(default_factory=dict)
    strips: dict[str, Path] = field(default_factory=dict)  # the videos' strip thumbnails, by the name the record gives

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def split(self) -> str:
        """``val`` for a validation trajectory (verl's ``validate``; eval's), else ``train``."""
        return VAL if self.record.get("validate") else TRAIN

    def image_file(self, image_id: int) -> Path:
        """The checked PNG of image ``image_id`` (1-based, the ids tools use); a RecordError when it has none."""
        if image_id not in self.files:
            raise RecordError(f"{self.path}: image {image_id} has no file (its pixels were not available to the dump)")
        return self.files[image_id]

    def prompt_key(self) -> str:
        """The prompt this trajectory answers: the uid verl assigned (a GRPO group, an eval row's samples), else a
        digest of the prompt's text and image files (two rows with the same index may be different prompts)."""
        uid = (self.record.get("sample") or {}).get("uid")
        if uid is not None:
            return str(uid)
        digest = hashlib.sha256()
        for message in self.record["messages"]:
            if message["turn"] == 0:
                digest.update(f"{message['role']}\0{message['text']}\0".encode())
                for image_id in message.get("image_ids") or []:
                    path = self.files.get(image_id)
                    digest.update(path.read_bytes() if path else b"no file")
        return f"prompt {digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class BadRecord:
    path: Path
    reason: str

    def line(self) -> str:
        """The file and why it was left out, on one line (the reader's reasons already start with the file)."""
        reason = " ".join(self.reason.split())
        return reason if reason.startswith(str(self.path)) else f"{self.path}: {reason}"


@dataclass
class RecordSet:
    records: list[LoadedRecord] = field(default_factory=list)
    bad: list[BadRecord] = field(default_factory=list)

    def refuse(self, loaded: LoadedRecord, reason: str) -> None:
        """Move ``loaded`` to the bad records (it cannot be used after all)."""
        self.records.remove(loaded)
        self.bad.append(BadRecord(loaded.path, reason))

    def splits(self) -> dict[str, int]:
        return {split: sum(item.split == split for item in self.records) for split in (TRAIN, VAL)}


def is_output_folder(folder: Path) -> bool:
    """A folder a command wrote (a site, a rescore or an export): never read back as input."""
    return any((folder / marker).exists() for marker in OUTPUT_MARKERS)


def check_out_folder(out: Path, paths: Sequence[Path]) -> None:
    """An output folder inside an input folder must be empty (or new): it is then skipped when reading, and an
    earlier output there is never read back as input nor replaced by surprise."""
    real_out = os.path.realpath(out)
    for path in paths:
        real = os.path.realpath(path)
        inside = path.is_dir() and real_out != real and os.path.commonpath([real, real_out]) == real
        if inside and out.exists() and any(out.iterdir()):
            raise ConfigError(
                f"--out {out} is inside the input {path} and not empty; pass an empty or new folder, or one outside "
                "the input"
            )


def record_files(paths: Sequence[Path], exclude: Sequence[Path] = ()) -> list[Path]:
    """The record files ``paths`` name: files as given, folders searched without following links, and without
    staged records, output folders (``OUTPUT_MARKERS``) and ``exclude`` (the caller's own output)."""
    skipped = {os.path.realpath(path) for path in exclude}
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            inside = _search(path, skipped)
            if not inside:
                raise ConfigError(
                    f"{path}: no {RECORD_FILE} under it; pass a training dump (the mm_tool loop's dump_dir), an eval "
                    "output folder or record files"
                )
            found += inside
        else:
            raise ConfigError(f"{path}: no such file or folder")
    return found


def _search(root: Path, skipped: set[str]) -> list[Path]:
    found = []
    for folder, folders, files in os.walk(root):  # links to folders are listed, never entered
        here = Path(folder)
        folders[:] = sorted(
            name
            for name in folders
            if name not in (STAGING_DIR, SITE_DIR)
            and os.path.realpath(here / name) not in skipped
            and not is_output_folder(here / name)
        )
        if RECORD_FILE in files:
            found.append(here / RECORD_FILE)
    return sorted(found)


def load_records(paths: Sequence[Path], exclude: Sequence[Path] = ()) -> RecordSet:
    """Every good record under ``paths`` once (``read_checked``), the others in ``bad`` with their reason; a
    ConfigError when a path is missing or a folder holds no record."""
    loaded = RecordSet()
    seen_files: set[str] = set()
    seen_ids: dict[str, Path] = {}
    for path in record_files(paths, exclude):
        real = os.path.realpath(path)
        if real in seen_files:  # the same file reached through two of the given paths
            continue
        seen_files.add(real)
        try:
            item = read_checked(path)
        except RecordError as error:
            loaded.bad.append(BadRecord(path, str(error)))
            continue
        record_id = item.record["id"]
        if record_id in seen_ids:
            loaded.bad.append(BadRecord(path, f"the same trajectory (id {record_id}) as {seen_ids[record_id]}"))
            continue
        seen_ids[record_id] = path
        loaded.records.append(item)
    return loaded


def read_checked(path: Path) -> LoadedRecord:
    """The record in ``path`` with its image files, every field and file checked; a RecordError naming the file
    and what is wrong."""
    _check_not_a_link_out(path)
    record = read_record(path)
    try:
        check_fields(record)
    except FieldError as error:
        raise RecordError(f"{path}: {error}") from None
    if len(record["images"]) > MAX_IMAGES:
        raise RecordError(f"{path}: {len(record['images'])} images, more than the {MAX_IMAGES} a record may have")
    files, thumbs = {}, {}
    for image in record["images"]:
        if image.get("file"):
            files[image["id"]] = _checked_image(path, image, "file")
        if image.get("thumb"):
            thumbs[image["id"]] = _checked_image(path, image, "thumb")
    strips = {
        shown["thumb"]: _checked_image(
            path, shown, "thumb", f"video {video['id']}'s strip frame at {shown['time_s']} s"
        )
        for video in record.get("videos") or []
        for shown in video.get("strip") or []
        if shown.get("thumb")
    }
    return LoadedRecord(record, path, files, thumbs, strips)


def _check_not_a_link_out(path: Path) -> None:
    if path.is_symlink() and Path(os.path.realpath(path)).parent != Path(os.path.realpath(path.parent)):
        raise RecordError(f"{path}: a symbolic link to {os.path.realpath(path)}, outside its folder; not read")


def inside_folder(record_path: Path, name: str) -> Path:
    """``name`` (a path a record gives) as a file of the record's folder; a RecordError when it is absolute, goes
    up with ``..`` or leads out of the folder through a link."""
    folder = record_path.parent
    if os.path.isabs(name) or ".." in Path(name).parts or "\\" in name or "\0" in name:
        raise RecordError(f"{record_path}: names the file {name!r}, outside its folder; not read")
    real_folder = os.path.realpath(folder)
    real = os.path.realpath(folder / name)
    if os.path.commonpath([real_folder, real]) != real_folder:
        raise RecordError(f"{record_path}: its file {name!r} is a link leading outside its folder; not read")
    return folder / name


def _checked_image(record_path: Path, image: dict, key: str, what: str | None = None) -> Path:
    """The file ``image[key]`` names, inside the record's folder, a readable image of its kind (``what`` names it in
    errors; default: ``image N``)."""
    what = what or f"image {image['id']}"
    path = inside_folder(record_path, image[key])
    if not path.is_file():
        raise RecordError(f"{record_path}: {what}'s file {path} is missing")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as opened:
                size, kind = opened.size, opened.format
                if size[0] * size[1] > MAX_IMAGE_PIXELS:
                    raise RecordError(f"{record_path}: {what}'s {key} is {size[0]}x{size[1]} pixels")
                opened.load()
    except RecordError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise RecordError(f"{record_path}: {what}'s {key} {path.name} is not a readable image ({error})") from None
    if kind not in IMAGE_FORMATS[key]:
        raise RecordError(f"{record_path}: {what}'s {key} {path.name} is {kind}, not {IMAGE_FORMATS[key]}")
    recorded = (image.get("width"), image.get("height"))  # both optional; one without the other is a mismatch
    if key == "file" and recorded != (None, None) and size != recorded:
        raise RecordError(
            f"{record_path}: image {image['id']} is {recorded[0]}x{recorded[1]} in the record but "
            f"{size[0]}x{size[1]} in {path.name}"
        )
    return path


def report_bad(command: str, bad: Sequence[BadRecord], write: Callable[[str], object]) -> None:
    """Each bad record on one line (``write``: stderr's), prefixed with the command."""
    for item in bad:
        write(f"verl-mm-tools {command}: left out {item.line()}\n")
