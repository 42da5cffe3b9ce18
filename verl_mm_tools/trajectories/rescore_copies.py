"""A rescore's output folder (``prepare_out``: empty, or an earlier rescore's, never one holding the records read) and
its record copies (``write_copy``: the new reward, the recorded one under ``reward_before``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RECORD_FILE
from verl_mm_tools.trajectories.read import LoadedRecord, check_out_folder
from verl_mm_tools.trajectories.rescore_options import SETTINGS_FILE, TRAJECTORIES, RescoreOptions
from verl_mm_tools.trajectories.rescore_scoring import Rescored


def prepare_out(options: RescoreOptions, records: list[LoadedRecord]) -> None:
    """An empty ``out`` (a previous rescore output there is replaced), never one holding the records read; its
    settings file first."""
    out = options.out
    resolved = out.resolve()
    for item in records:
        if resolved in item.path.resolve().parents:
            raise ConfigError(f"--out {out} holds the record {item.path} being rescored; write to another folder")
    check_out_folder(out, options.records)
    if out.exists() and any(out.iterdir()):
        if not (out / SETTINGS_FILE).is_file():
            raise ConfigError(f"--out {out} is not empty and not a rescore output; pass an empty or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / SETTINGS_FILE).write_text(json.dumps(options.describe(), indent=2) + "\n")


def write_copy(result: Rescored, options: RescoreOptions) -> Path:
    """The record's folder copied to ``OUT/trajectories/<step>/<id>``, its ``reward`` the new one, the recorded one
    under ``reward_before``."""
    record = dict(result.item.record)
    target = options.out / TRAJECTORIES / _step_dir(result.item) / str(record["id"])
    _copy_checked_files(result.item, target)
    before = record.get("reward") or {}
    record["reward_before"] = before
    record["reward"] = {"score": result.score, "turn_rewards": before.get("turn_rewards", []), "extra": result.extra}
    record["rescored"] = {
        **options.describe(),
        "source": str(result.item.path),
        "tokens_as_recorded": result.tokens_as_recorded,
    }
    temporary = target / (RECORD_FILE + ".tmp")
    temporary.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(temporary, target / RECORD_FILE)
    return target / RECORD_FILE


def _copy_checked_files(item: LoadedRecord, target: Path) -> None:
    """The record's image files the reader checked, nothing else of its folder (a link there may lead anywhere)."""
    target.mkdir(parents=True)
    for path in [*item.files.values(), *item.thumbs.values()]:
        copied = target / path.relative_to(item.folder)
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copied)


def _step_dir(item: LoadedRecord) -> str:
    """The dump's step folder name (``step_NNNNNN``, ``val_step_NNNNNN``), from the record, else its parent's."""
    step = item.record.get("step")
    if isinstance(step, int):
        return f"{'val_' if item.record.get('validate') else ''}step_{step:06d}"
    parent = item.folder.parent.name
    return parent if "step_" in parent else "step_unknown"
