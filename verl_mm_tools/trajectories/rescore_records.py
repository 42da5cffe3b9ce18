"""The records a rescore reads: each readable record once, with all its image files, grouped by the model whose
tokenizer and processor rebuild its tokens; the others refused with their reason."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from verl_mm_tools.record import RecordError
from verl_mm_tools.trajectories.read import BadRecord, LoadedRecord, RecordSet, load_records


def usable_records(paths: Sequence[Path]) -> RecordSet:
    """The readable records (``read.load_records``), each once, whose image files are all there (the copies must
    show in the viewer and the processor needs the pixels); the others moved to ``bad`` with the reason."""
    loaded = load_records(list(paths))
    seen_paths: set[Path] = set()
    seen_ids: dict[str, Path] = {}
    for item in list(loaded.records):
        resolved = item.path.resolve()
        if resolved in seen_paths:  # the same file reached through two of the given paths
            loaded.records.remove(item)
            continue
        seen_paths.add(resolved)
        record_id = str(item.record.get("id"))
        if record_id in seen_ids:
            loaded.refuse(item, f"the same trajectory (id {record_id}) as {seen_ids[record_id]}: rescored once")
            continue
        seen_ids[record_id] = item.path
        try:
            check_image_files(item)
        except RecordError as error:
            loaded.refuse(item, str(error))
    return loaded


def check_image_files(item: LoadedRecord) -> None:
    for entry in item.record.get("images") or []:
        if entry.get("file"):
            item.image_file(entry["id"])  # a RecordError naming the missing file


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
    """A bad record's file and reason (the reader's reasons already start with the file)."""
    return bad.reason if bad.reason.startswith(str(bad.path)) else f"{bad.path}: {bad.reason}"
