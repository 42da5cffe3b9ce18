"""Find and load trajectory records for the viewer: mm_tool dumps (``dump_dir``), each record through the one reader
(``trajectories.read.read_checked``: fields, images and the files they name checked inside the record's folder; a bad
record is listed, not shown), and verl's own ``trainer.rollout_data_dir`` JSONL (text only: verl writes the decoded
prompt and response, no images)."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from verl_mm_tools.errors import VerlMMToolsError
from verl_mm_tools.record import RECORD_FILE, STAGED_RECORD_FILE, STAGING_DIR, RecordError
from verl_mm_tools.trajectories.read import BadRecord, read_checked

logger = logging.getLogger(__name__)

STEP_DIR_PATTERN = "*step_*"  # step_000001 and val_step_000001
TOOL_CALL_NAME = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"([^"]+)"')


class ViewerError(VerlMMToolsError, ValueError):
    """The viewer was pointed at something it cannot show."""


@dataclass(frozen=True)
class Trajectory:
    """One record and the folder its image paths are relative to (None: a text-only record)."""

    record: dict
    folder: Path | None
    origin: str  # "dump", "staged" (published by no manager yet) or "verl-jsonl"
    files: dict[str, Path] = field(default_factory=dict)  # each file the record names (checked) -> where it is

    @property
    def id(self) -> str:
        return self.record["id"]


@dataclass
class TrajectorySet:
    trajectories: list[Trajectory]
    bad: list[BadRecord]


def load_trajectories(directory: str | os.PathLike) -> list[Trajectory]:
    """The good trajectories under ``directory`` (``load_trajectory_set``)."""
    return load_trajectory_set(directory).trajectories


def load_trajectory_set(directory: str | os.PathLike) -> TrajectorySet:
    """Every good trajectory under ``directory``, sorted by validation flag, step, sample index and rollout number,
    and each bad record with its reason; a ViewerError when there is no good one."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ViewerError(f"{directory} is not a directory; pass the mm_tool dump_dir or verl's rollout_data_dir")
    bad: list[BadRecord] = []
    found = [*_dumped(directory, bad), *_staged(directory, bad), *_verl_jsonl(directory, bad)]
    found = _each_id_once(found, bad)
    if not found and bad:
        reasons = "; ".join(item.line() for item in bad[:5])
        raise ViewerError(
            f"no readable trajectory under {directory}: {reasons}; delete the trajectory folder or re-run"
        )
    if not found:
        raise ViewerError(
            f"no trajectories under {directory}: expected step_*/<id>/{RECORD_FILE} (the mm_tool loop's dump_dir "
            f"option) or <step>.jsonl files (verl's trainer.rollout_data_dir)"
        )
    return TrajectorySet(sorted(found, key=_order), bad)


def _each_id_once(found: list[Trajectory], bad: list[BadRecord]) -> list[Trajectory]:
    """A trajectory's page is named by its id: a second record with the same id is listed as bad."""
    seen: dict[str, Trajectory] = {}
    for trajectory in found:
        if trajectory.id in seen:
            where = trajectory.folder or Path(trajectory.id)
            bad.append(BadRecord(where, f"the same trajectory (id {trajectory.id}) as {seen[trajectory.id].folder}"))
            continue
        seen[trajectory.id] = trajectory
    return list(seen.values())


def _order(trajectory: Trajectory) -> tuple:
    record = trajectory.record
    step = record.get("step")
    index = (record.get("sample") or {}).get("index")
    return (
        bool(record.get("validate")),
        step is None,
        step or 0,
        str(index),
        record.get("rollout_n") or 0,
        trajectory.id,
    )


def _dumped(directory: Path, bad: list[BadRecord]) -> list[Trajectory]:
    paths = sorted(directory.glob(f"{STEP_DIR_PATTERN}/*/{RECORD_FILE}"))
    return _checked(paths, "dump", bad)


def _checked(paths: list[Path], origin: str, bad: list[BadRecord]) -> list[Trajectory]:
    trajectories = []
    for path in paths:
        try:
            loaded = read_checked(path)
        except RecordError as error:
            bad.append(BadRecord(path, str(error)))
            continue
        images = {entry["id"]: entry for entry in loaded.record["images"]}
        files = {images[image_id]["file"]: file for image_id, file in loaded.files.items()}
        files |= {images[image_id]["thumb"]: file for image_id, file in loaded.thumbs.items()}
        files |= loaded.strips
        trajectories.append(Trajectory(loaded.record, path.parent, origin, files))
    return trajectories


def _staged(directory: Path, bad: list[BadRecord]) -> list[Trajectory]:
    """Records the manager has not published: a step in progress, or a run that stopped mid-step."""
    paths = sorted((directory / STAGING_DIR).glob(f"*/{STAGED_RECORD_FILE}"))
    if paths:
        logger.warning(
            "%d trajectories under %s were never published by the manager (no step or rewards); shown as staged",
            len(paths),
            directory / STAGING_DIR,
        )
    return _checked(paths, "staged", bad)


def _verl_jsonl(directory: Path, bad: list[BadRecord]) -> list[Trajectory]:
    trajectories = []
    for path in sorted(directory.glob("*.jsonl")):
        for line_number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                trajectories.append(Trajectory(_verl_record(path, line_number, line), None, "verl-jsonl"))
            except ViewerError as error:
                bad.append(BadRecord(path, str(error)))
    return trajectories


def _verl_record(path: Path, line_number: int, line: str) -> dict:
    """A text-only record from one line of verl's rollout dump (input, output, gts, score, step, reward extras)."""
    try:
        row = json.loads(line)
    except ValueError as error:
        raise ViewerError(f"{path}:{line_number} is not a JSON line ({error})") from error
    if not isinstance(row, dict) or "output" not in row:
        raise ViewerError(f"{path}:{line_number} is not a verl rollout record (no 'output' key): {line[:120]!r}")
    output = str(row.get("output", ""))
    extra = {key: value for key, value in row.items() if key not in ("input", "output", "gts", "score", "step")}
    tools = TOOL_CALL_NAME.findall(output)
    return {
        "id": f"{path.stem}-{line_number}",
        "step": row.get("step"),
        "validate": False,
        "sample": {"index": line_number - 1, "ground_truth": row.get("gts")},
        "messages": [
            {"role": "user", "turn": 0, "text": str(row.get("input", "")), "image_ids": []},
            {
                "role": "assistant",
                "turn": 1,
                "text": output,
                "image_ids": [],
                "tool_calls": [],
                "note": "verl's rollout dump: the whole response as one text (tool turns included), no images",
            },
        ],
        "images": [],
        "tool_calls": [
            {"turn": 1, "name": name, "arguments": None, "result": None, "error": False, "image_ids": []}
            for name in tools
        ],
        "tools_used": sorted(set(tools)),
        "turns": [],
        "masked": None,
        "stop_reason": None,
        "reward": {"score": row.get("score"), "turn_rewards": [], "extra": extra},
    }
