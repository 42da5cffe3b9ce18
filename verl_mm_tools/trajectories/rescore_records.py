"""The records a rescore reads (the one reader, ``read.load_records``: each good record once, every image file
checked inside its folder), grouped by the model whose tokenizer and processor rebuild its tokens; the others
refused with their reason."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from verl_mm_tools.trajectories.read import BadRecord, LoadedRecord, RecordSet, load_records


def usable_records(paths: Sequence[Path], out: Path | None = None) -> RecordSet:
    """The good records under ``paths`` (``read.load_records``), never those of ``out`` (the rescore's own
    output) or of an earlier command's output folder; the others in ``bad`` with the reason."""
    return load_records(list(paths), exclude=[out] if out is not None else [])


def by_model(loaded: RecordSet, model_path: str | None) -> dict[str, list[LoadedRecord]]:
    groups: dict[str, list[LoadedRecord]] = {}
    for item in list(loaded.records):
        path = model_path or item.record.get("model")
        if not path:
            loaded.refuse(item, "the record names no model (its 'model' is empty): pass --model-path")
            continue
        groups.setdefault(str(path), []).append(item)
    return groups


def described(bad: BadRecord) -> str:
    """A bad record's file and reason on one line (the reader's reasons already start with the file)."""
    return bad.line()
