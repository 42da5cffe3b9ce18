"""Reading recorded trajectories back: every ``trajectory.json`` under the given folders (training dumps,
``verl-mm-tools eval`` output) or given as files. A bad record never stops the others: it is listed with its file
and reason, and the caller reports what it could not use."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RECORD_FILE, STAGING_DIR, RecordError, read_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedRecord:
    """One record and where it lives (its image files are relative to ``folder``)."""

    record: dict
    path: Path

    @property
    def folder(self) -> Path:
        return self.path.parent

    def image_file(self, image_id: int) -> Path:
        """The PNG of image ``image_id`` (1-based, the ids tools use); a RecordError when the record has none."""
        entries = self.record.get("images") or []
        entry = entries[image_id - 1] if 0 < image_id <= len(entries) else None
        if entry is None or not entry.get("file"):
            raise RecordError(f"{self.path}: image {image_id} has no file (its pixels were not available to the dump)")
        path = self.folder / entry["file"]
        if not path.is_file():
            raise RecordError(f"{self.path}: image {image_id}'s file {path} is missing")
        return path


@dataclass(frozen=True)
class BadRecord:
    path: Path
    reason: str


@dataclass
class RecordSet:
    records: list[LoadedRecord] = field(default_factory=list)
    bad: list[BadRecord] = field(default_factory=list)

    def refuse(self, loaded: LoadedRecord, reason: str) -> None:
        """Move ``loaded`` to the bad records (it cannot be used after all)."""
        self.records.remove(loaded)
        self.bad.append(BadRecord(loaded.path, reason))


def record_files(paths: list[Path]) -> list[Path]:
    """The record files ``paths`` name: files as given, folders searched (staged, unpublished records skipped)."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            inside = sorted(p for p in path.rglob(RECORD_FILE) if STAGING_DIR not in p.relative_to(path).parts)
            if not inside:
                raise ConfigError(
                    f"{path}: no {RECORD_FILE} under it; pass a training dump (the mm_tool loop's dump_dir), an eval "
                    "output folder or record files"
                )
            found += inside
        else:
            raise ConfigError(f"{path}: no such file or folder")
    return found


def load_records(paths: list[Path]) -> RecordSet:
    """Every readable record under ``paths``; the unreadable ones in ``bad`` with their reason."""
    loaded = RecordSet()
    for path in record_files(paths):
        try:
            loaded.records.append(LoadedRecord(read_record(path), path))
        except RecordError as error:
            loaded.bad.append(BadRecord(path, str(error)))
    return loaded
