"""Phase 2 of the mm_tool dumps (phase 1, and the layout: ``agent_loop/dump.py``): the trainer side knows the step
and the rewards. ``finalize_step_dumps`` (called by ``step.process_step``) moves the first ``dump_max_per_step``
staged trajectories of the batch (batch order, so whole GRPO groups stay together) to
``<dump_dir>/step_<NNNNNN>/<id>/`` (``val_step_<NNNNNN>`` for validation), completes their records, deletes the
others, and stops dumping for good once the dump holds ``dump_max_mb`` (it then writes ``<dump_dir>/_FULL``, which
the loops check so they stop writing images too). What was skipped is counted in ``step_<NNNNNN>/_step.json`` and in
the step metrics ``mm_tool/dump/*``, and logged once per reason. A dump must never stop training.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from verl_mm_tools.agent_loop.dump import folder_bytes, write_json
from verl_mm_tools.record import (
    FULL_MARKER,
    RECORD_FILE,
    SITE_DIR,
    STAGED_RECORD_FILE,
    STAGING_DIR,
    STEP_COUNTS,
    STEP_SUMMARY,
    jsonable,
)
from verl_mm_tools.step_metrics import DUMP_FAILED, DUMP_MB, DUMP_SKIPPED, DUMP_WRITTEN

if TYPE_CHECKING:
    from verl_mm_tools.step_hook.batch import StepBatch

logger = logging.getLogger(__name__)

_warned: set[tuple[str, str]] = set()


def finalize_step_dumps(batch: StepBatch) -> dict[str, float]:
    """Publish the staged trajectories of one batch within the caps; returns step metrics
    ``mm_tool/dump/{written,skipped,mb}``. Batches without dumps return ``{}``.

    A dump must never stop training: a file-system failure is logged and reported as ``mm_tool/dump/failed``."""
    references = [None if fields is None else fields.dump for fields in batch.fields]
    if not any(isinstance(reference, dict) for reference in references):
        return {}
    try:
        return _finalize(batch, references)
    except OSError:
        logger.warning("mm_tool dump: publishing the step's trajectories failed; training goes on", exc_info=True)
        return {DUMP_FAILED: 1.0}


def _finalize(batch: StepBatch, references: list[dict | None]) -> dict[str, float]:
    finals = _final_fields(batch)
    by_dir: dict[str, list[tuple[dict, dict]]] = {}
    for reference, final in zip(references, finals, strict=True):
        if isinstance(reference, dict):
            by_dir.setdefault(reference["dump_dir"], []).append((reference, final))
    totals: Counter[str] = Counter()
    used = 0
    for dump_dir, pairs in by_dir.items():
        counts, dir_bytes = _publish_rows(Path(dump_dir), pairs, batch.step, batch.validate)
        totals.update(counts)
        used += dir_bytes
    skipped = sum(count for reason, count in totals.items() if reason != "written")
    return {
        DUMP_WRITTEN: float(totals["written"]),
        DUMP_SKIPPED: float(skipped),
        DUMP_MB: used / 2**20,
    }


def _final_fields(batch: StepBatch) -> list[dict]:
    """What only the trainer side knows, per row: step, rollout number, reward score and reward extra info."""
    scores = batch.rm_scores.sum(dim=-1).tolist() if batch.rm_scores is not None else None
    turn_rewards = [None if fields is None else fields.turn_rewards for fields in batch.fields]
    extras = batch.reward_extra or [{}] * len(turn_rewards)
    return [
        {
            "step": batch.step,
            "validate": batch.validate,
            "rollout_n": batch.rollout_n[row],
            "reward": {
                "score": scores[row] if scores is not None else None,
                "turn_rewards": jsonable(list(turn_rewards[row] or [])),
                "extra": jsonable(extras[row]),
            },
        }
        for row in range(len(turn_rewards))
    ]


def _publish_rows(dump_dir: Path, rows: list[tuple[dict, dict]], step: int, validate: bool) -> tuple[Counter, int]:
    step_dir = dump_dir / f"{'val_' if validate else ''}step_{step:06d}"
    max_per_step, max_bytes = rows[0][0]["max_per_step"], rows[0][0]["max_mb"] * 2**20
    dump_dir.mkdir(parents=True, exist_ok=True)  # no trajectory may have been staged (all failed, say)
    used = folder_bytes(dump_dir, skip=frozenset({STAGING_DIR, SITE_DIR}))
    already = sum(1 for entry in step_dir.iterdir() if entry.is_dir()) if step_dir.is_dir() else 0
    counts: Counter = Counter()
    full = (dump_dir / FULL_MARKER).exists()
    for reference, final in rows:
        reason = reference.get("skipped") or ("disk_cap" if full else None)
        if reason is None and not Path(reference["dir"]).is_dir():
            reason = "not_found"  # staged by a worker whose file system this process does not see
        if reason is None and already + counts["written"] >= max_per_step:
            reason = "per_step_cap"
        elif reason is None and used + reference["bytes"] > max_bytes:
            reason, full = "disk_cap", True  # for good: a smaller trajectory that would still fit is skipped too
            (dump_dir / FULL_MARKER).write_text(f"dump_max_mb={reference['max_mb']} reached at step {step}\n")
        if reason is None:
            used += _publish(reference, final, step_dir)
            counts["written"] += 1
        else:
            _discard(reference)
            counts[reason] += 1
    _write_step_summary(step_dir, counts, step, validate)
    _log_skips_once(dump_dir, counts, step, rows[0][0])
    return counts, used


def _publish(reference: dict, final: dict, step_dir: Path) -> int:
    staged = Path(reference["dir"])
    record = json.loads((staged / STAGED_RECORD_FILE).read_text(encoding="utf-8"))
    record.update(final)
    step_dir.mkdir(parents=True, exist_ok=True)
    target = step_dir / reference["id"]
    os.replace(staged, target)
    (target / STAGED_RECORD_FILE).unlink()
    write_json(target / RECORD_FILE, record)
    return folder_bytes(target)


def _discard(reference: dict) -> None:
    if reference.get("dir"):
        shutil.rmtree(reference["dir"], ignore_errors=True)


def _write_step_summary(step_dir: Path, counts: Counter, step: int, validate: bool) -> None:
    step_dir.mkdir(parents=True, exist_ok=True)
    path = step_dir / STEP_SUMMARY
    summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"step": step, "validate": validate}
    for reason in STEP_COUNTS:
        summary[reason] = summary.get(reason, 0) + counts[reason]
    write_json(path, summary)


def _log_skips_once(dump_dir: Path, counts: Counter, step: int, reference: dict) -> None:
    limits = {
        "per_step_cap": f"dump_max_per_step={reference['max_per_step']}",
        "disk_cap": f"dump_max_mb={reference['max_mb']} (free space, then delete {dump_dir / FULL_MARKER} to resume)",
        "error": "staging failed; see the earlier warning",
        "not_found": "their staged folders are not visible here: dump_dir must be on a file system that the rollout "
        "workers and the trainer's driver share",
    }
    for reason, limit in limits.items():
        if counts[reason] and (str(dump_dir), reason) not in _warned:
            _warned.add((str(dump_dir), reason))
            logger.warning(
                "mm_tool dump %s: step %d skipped %d trajectories because of %s; later skips are only counted "
                "(step_*/%s, metric mm_tool/dump/skipped)",
                dump_dir,
                step,
                counts[reason],
                limit,
                STEP_SUMMARY,
            )
