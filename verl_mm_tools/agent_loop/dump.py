"""Opt-in trajectory dumps of the mm_tool loop, read by ``verl-mm-tools view``.

Each half of a trajectory is known to a different process, so a dump is written in two phases:

1. the loop (``stage_trajectory``, in the agent-loop worker) knows the messages, images, tokens and mask. It writes
   every image (PNG, exactly the pixels the model saw, plus a JPEG thumbnail) and a record without step or rewards
   to ``<dump_dir>/_staging/<id>/`` and puts a small reference in ``extra_fields["mm_tool/dump"]``;
2. the trainer side (``finalize_step_dumps``, called by ``step.process_step`` from verl-mm-tools' v1 replay buffer
   or classic manager) knows the step and the rewards. It moves the first
   ``dump_max_per_step`` staged trajectories of the batch (batch order, so whole GRPO groups stay together) to
   ``<dump_dir>/step_<NNNNNN>/<id>/`` (``val_step_<NNNNNN>`` for validation), completes their records, deletes the
   others, and stops dumping for good once the dump holds ``dump_max_mb`` (it then writes ``<dump_dir>/_FULL``, which
   the loops check so they stop writing images too). What was skipped is counted in ``step_<NNNNNN>/_step.json``
   (``written``, ``per_step_cap``, ``disk_cap``, ``error``: staging failed, ``not_found``: the driver cannot see the
   workers' staged folder) and in the step metrics ``mm_tool/dump/*``, and logged once per reason.

``dump_dir`` is resolved to an absolute path by the loop; on several nodes it must be on a file system the rollout
workers and the trainer's driver share. A failing dump never costs a trajectory or stops training.

A finished trajectory is ``<step dir>/<id>/trajectory.json`` plus ``images/<image id>.png`` and
``images/<image id>.thumb.jpg``; the record's keys: ``verl_mm_tools.record``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from verl_mm_tools.agent_loop.export import rendered_history
from verl_mm_tools.agent_loop.state import TURN_SPANS_KEY, state_of
from verl_mm_tools.record import (
    DUMP_KEY,
    FULL_MARKER,
    RECORD_FILE,
    SITE_DIR,
    STAGED_RECORD_FILE,
    STAGING_DIR,
    STEP_COUNTS,
    STEP_SUMMARY,
    SampleRecord,
    TurnRecord,
    build_record,
    chat_record,
    jsonable,
    sample_ids,
)

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.step import StepBatch

logger = logging.getLogger(__name__)

THUMBNAIL_SIZE = (160, 160)
_warned: set[tuple[str, str]] = set()


# ----- phase 1: the loop stages one trajectory ----------------------------------------------------------------------


async def stage_trajectory(loop, agent_data, outputs: list, sample: dict) -> dict:
    """Stage one finished trajectory of ``loop`` (an MMToolAgentLoop), its training samples ``outputs`` (the final
    one last); returns the reference for the final output's ``extra_fields``.

    A dump must never cost a trajectory: any failure here is logged and reported in the reference instead."""
    config = loop.mm_config
    # Absolute, so the manager (another process, maybe another working directory) finds the same folder.
    dump_dir = Path(config.dump_dir).expanduser().resolve()
    reference = {
        "dump_dir": str(dump_dir),
        "max_per_step": config.dump_max_per_step,
        "max_mb": config.dump_max_mb,
        "sample_index": sample_ids(sample)["index"],
    }
    if (dump_dir / FULL_MARKER).exists():
        return {**reference, "skipped": "disk_cap"}
    try:
        record, images = _loop_record(loop, agent_data, outputs, sample)
        # Encoding images is the slow part: off the event loop, which other trajectories share.
        written = await asyncio.to_thread(write_staged, dump_dir, record, images)
    except Exception as error:
        logger.warning("mm_tool dump: could not stage a trajectory under %s", dump_dir, exc_info=True)
        return {**reference, "skipped": "error", "error": f"{type(error).__name__}: {error}"}
    return {**reference, **written}


def _loop_record(loop, agent_data, outputs: list, sample: dict) -> tuple[dict, list]:
    messages = list(getattr(agent_data, "messages", None) or sample.get("raw_prompt") or [])
    state = state_of(agent_data)
    images = list(getattr(agent_data, "image_data", None) or [])
    output = outputs[-1]
    return build_record(
        messages=messages,
        images=images,
        samples=[
            SampleRecord(len(o.prompt_ids), tuple(o.response_mask), len(o.multi_modal_data.get("images") or []))
            for o in outputs
        ],
        turns=_turn_records(agent_data, outputs, lambda ids: loop.tokenizer.decode(ids, skip_special_tokens=True)),
        extra_fields=output.extra_fields,
        sample=sample,
        model=str(loop.config.actor_rollout_ref.model.path),
        request_id=getattr(agent_data, "request_id", None),
        timing=output.metrics.model_dump() if hasattr(output.metrics, "model_dump") else dict(output.metrics or {}),
        chat=_chat(loop, agent_data, state) if state is not None and messages else None,
    )


def _chat(loop, agent_data, state) -> dict:
    schemas = getattr(agent_data, "_active_tool_schemas", None) or []
    return chat_record(
        rendered_history(loop, agent_data, state),
        loop.tool_format.template_tools(schemas),
        loop.apply_chat_template_kwargs,
    )


def _turn_records(agent_data, outputs: list, decode) -> list[TurnRecord]:
    """The turns the loop recorded that the outputs hold, with their spans in their own sample's response."""
    state = state_of(agent_data)
    turns = state.output_turns if state is not None else []
    records = []
    for index, output in enumerate(outputs):
        spans = output.extra_fields.get(TURN_SPANS_KEY) or []
        for turn, (start, end) in zip([turn for turn in turns if turn.sample == index], spans, strict=True):
            records.append(
                TurnRecord(
                    (start, end),
                    len(output.prompt_ids) + start,
                    tuple(turn.tool_calls),
                    tuple(turn.images_added),
                    turn.reward,
                    index,
                    decode(output.response_ids[start:end]),
                )
            )
    return records


def write_staged(dump_dir: str | os.PathLike, record: dict, images: list) -> dict:
    """Write the images and the record under ``<dump_dir>/_staging/<id>/``; returns ``id``, ``dir`` and ``bytes``."""
    folder = Path(dump_dir) / STAGING_DIR / record["id"]
    (folder / "images").mkdir(parents=True)
    for entry, image in zip(record["images"], images, strict=True):
        if image is not None:
            entry["file"], entry["thumb"] = _write_image(folder, entry["id"], image)
    _write_json(folder / STAGED_RECORD_FILE, record)
    return {"id": record["id"], "dir": str(folder), "bytes": folder_bytes(folder)}


def _write_image(folder: Path, image_id: int, image: Image.Image) -> tuple[str, str]:
    file, thumb = f"images/{image_id}.png", f"images/{image_id}.thumb.jpg"
    image.save(folder / file, format="PNG")
    small = image.convert("RGB")
    small.thumbnail(THUMBNAIL_SIZE)
    small.save(folder / thumb, format="JPEG", quality=80)
    return file, thumb


def _write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(temporary, path)  # a reader never sees half a record


def folder_bytes(folder: str | os.PathLike, skip: frozenset[str] = frozenset()) -> int:
    """Bytes of the files under ``folder``, not descending into top-level entries named in ``skip``."""
    total = 0
    for entry in os.scandir(folder):
        if entry.name in skip:
            continue
        if entry.is_dir(follow_symlinks=False):
            total += folder_bytes(entry.path)
        elif entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


# ----- phase 2: the trainer side finishes a step ---------------------------------------------------------------------


def finalize_step_dumps(batch: StepBatch) -> dict[str, float]:
    """Publish the staged trajectories of one batch within the caps; returns step metrics
    ``mm_tool/dump/{written,skipped,mb}``. Batches without dumps return ``{}``.

    A dump must never stop training: a file-system failure is logged and reported as ``mm_tool/dump/failed``."""
    references = batch.column(DUMP_KEY)
    if not any(isinstance(reference, dict) for reference in references):
        return {}
    try:
        return _finalize(batch, references)
    except OSError:
        logger.warning("mm_tool dump: publishing the step's trajectories failed; training goes on", exc_info=True)
        return {"mm_tool/dump/failed": 1.0}


def _finalize(batch: StepBatch, references: list) -> dict[str, float]:
    finals = _final_fields(batch)
    by_dir: dict[str, list[int]] = {}
    for row, reference in enumerate(references):
        if isinstance(reference, dict):
            by_dir.setdefault(reference["dump_dir"], []).append(row)
    totals, used = Counter(), 0
    for dump_dir, rows in by_dir.items():
        pairs = [(references[row], finals[row]) for row in rows]
        counts, dir_bytes = _publish_rows(Path(dump_dir), pairs, batch.step, batch.validate)
        totals.update(counts)
        used += dir_bytes
    skipped = sum(count for reason, count in totals.items() if reason != "written")
    return {
        "mm_tool/dump/written": float(totals["written"]),
        "mm_tool/dump/skipped": float(skipped),
        "mm_tool/dump/mb": used / 2**20,
    }


def _final_fields(batch: StepBatch) -> list[dict]:
    """What only the trainer side knows, per row: step, rollout number, reward score and reward extra info."""
    scores = batch.rm_scores.sum(dim=-1).tolist() if batch.rm_scores is not None else None
    turn_rewards = batch.column("mm_tool/turn_rewards")
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
    _write_json(target / RECORD_FILE, record)
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
    _write_json(path, summary)


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
