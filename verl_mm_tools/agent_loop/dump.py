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
``images/<image id>.thumb.jpg``. Record keys (``RECORD_VERSION`` 1):

- ``format``, ``version``, ``id`` (the dump id, a uuid hex), ``request_id`` (verl's, of the trajectory);
- ``sample``: ``index``, ``uid``, ``data_source``, ``ground_truth``, ``extra_info`` (of the dataset row);
- ``messages``: in order, each ``role``, ``turn`` (0 for the prompt, j for assistant turn j and the tool or
  environment messages that answer it), ``text``, ``image_ids``; assistant messages add ``tool_calls`` (``name``,
  ``arguments``) and their text is the decoded generated tokens; tool messages add ``tool_call_id`` and ``error``
  (the text starts with "Error", as every error of the loop and of the tool library does);
- ``images``: ``id`` (1-based, the ids tools use), ``source`` (prompt, tool or environment), ``turn``, ``width``,
  ``height``, ``file``, ``thumb`` (paths relative to the trajectory folder; None when the pixels were unavailable);
- ``tool_calls``: flattened, each ``turn``, ``name``, ``arguments``, ``result`` (text), ``error``, ``image_ids``;
- ``tools_used``: sorted tool names called at least once;
- ``turns``: per assistant turn, ``turn``, ``trained_tokens`` (response_mask 1), ``context_tokens_after`` (tool and
  environment tokens until the next turn, mask 0), ``reward`` (the loop's per-turn reward);
- ``mask``: ``prompt_tokens``, ``response_tokens``, ``trained_tokens``, ``context_tokens``;
- ``masked``, ``stop_reason``, ``error``, ``stats`` (every ``mm_tool/*`` extra field without its prefix, plus
  ``tool_call_counts``, ``attempts``, ``turn_scores``, ``tool_rewards``), ``timing`` (verl's per-trajectory metrics);
- added on the trainer side: ``step``, ``validate``, ``rollout_n``, ``reward``: ``score`` (sum of ``rm_scores``, the
  reward manager's score; None when rewards were not computed during rollout), ``turn_rewards``, ``extra`` (the
  reward manager's ``reward_extra_info`` for this trajectory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from verl_mm_tools.rewards.turn_credit import turn_spans

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.step import StepBatch

logger = logging.getLogger(__name__)

RECORD_FORMAT = "verl-mm-tools/trajectory"
RECORD_VERSION = 1
DUMP_KEY = "mm_tool/dump"
STAGING_DIR = "_staging"
SITE_DIR = "_site"  # the viewer's default output; not counted against dump_max_mb
FULL_MARKER = "_FULL"
STEP_SUMMARY = "_step.json"
RECORD_FILE = "trajectory.json"
STAGED_RECORD_FILE = "record.json"
THUMBNAIL_SIZE = (160, 160)
STATS_KEYS = ("tool_call_counts", "attempts", "turn_scores", "tool_rewards")
STEP_COUNTS = ("written", "per_step_cap", "disk_cap", "error", "not_found")  # the keys of step_*/_step.json
_warned: set[tuple[str, str]] = set()


# ----- phase 1: the loop stages one trajectory ----------------------------------------------------------------------


async def stage_trajectory(loop, agent_data, output, sample: dict) -> dict:
    """Stage one finished trajectory of ``loop`` (an MMToolAgentLoop); returns the reference for ``extra_fields``.

    A dump must never cost a trajectory: any failure here is logged and reported in the reference instead."""
    config = loop.mm_config
    # Absolute, so the manager (another process, maybe another working directory) finds the same folder.
    dump_dir = Path(config.dump_dir).expanduser().resolve()
    reference = {"dump_dir": str(dump_dir), "max_per_step": config.dump_max_per_step,
                 "max_mb": config.dump_max_mb, "sample_index": _sample_ids(sample)["index"]}
    if (dump_dir / FULL_MARKER).exists():
        return {**reference, "skipped": "disk_cap"}
    try:
        record, images = _loop_record(loop, agent_data, output, sample)
        # Encoding images is the slow part: off the event loop, which other trajectories share.
        written = await asyncio.to_thread(write_staged, dump_dir, record, images)
    except Exception as error:  # noqa: BLE001 - see docstring
        logger.warning("mm_tool dump: could not stage a trajectory under %s", dump_dir, exc_info=True)
        return {**reference, "skipped": "error", "error": f"{type(error).__name__}: {error}"}
    return {**reference, **written}


def _loop_record(loop, agent_data, output, sample: dict) -> tuple[dict, list]:
    messages = list(getattr(agent_data, "messages", None) or sample.get("raw_prompt") or [])
    images = list(getattr(agent_data, "image_data", None) or [])
    return build_record(
        messages=messages,
        images=images,
        prompt_ids=list(output.prompt_ids),
        response_ids=list(output.response_ids),
        response_mask=list(output.response_mask),
        decode=lambda ids: loop.tokenizer.decode(ids, skip_special_tokens=True),
        extra_fields=output.extra_fields,
        sample=sample,
        request_id=getattr(agent_data, "request_id", None),
        timing=output.metrics.model_dump() if hasattr(output.metrics, "model_dump") else dict(output.metrics or {}),
    )


def build_record(*, messages, images, prompt_ids, response_ids, response_mask, decode, extra_fields, sample,
                 request_id=None, timing=None) -> tuple[dict, list]:
    """The JSON-able record of one trajectory and the image for each image id (None when unavailable)."""
    spans = turn_spans(torch.tensor(response_mask, dtype=torch.long))
    assistant_texts = [decode(response_ids[start:end]) for start, end in spans]
    record_messages, message_images = _messages(messages, assistant_texts)
    image_entries, pixels = _images(record_messages, message_images, images)
    stats = _stats(extra_fields)
    record = {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "id": uuid.uuid4().hex,
        "request_id": request_id,
        "sample": _sample_ids(sample),
        "messages": record_messages,
        "images": image_entries,
        "tool_calls": _tool_calls(record_messages),
        "turns": _turns(spans, len(response_mask), stats.get("turn_rewards") or []),
        "mask": _mask_summary(prompt_ids, response_mask),
        "masked": bool(stats.get("masked")),
        "stop_reason": stats.get("stop_reason"),
        "error": stats.get("error") or "",
        "stats": stats,
        "timing": _jsonable(timing or {}),
    }
    record["tools_used"] = sorted({call["name"] for call in record["tool_calls"]})
    return record, pixels


def _messages(messages: list[dict], assistant_texts: list[str]) -> tuple[list[dict], list[list]]:
    """Record messages (assistant text from the generated tokens) and each message's image objects."""
    records, images_per_message, turn, assistants = [], [], 0, 0
    for message in messages:
        role = message.get("role", "?")
        text, images = _split_content(message.get("content"))
        if role == "assistant":
            turn = assistants = assistants + 1
            text = assistant_texts[assistants - 1] if assistants <= len(assistant_texts) else text
        entry: dict[str, Any] = {"role": role, "turn": turn, "text": text, "image_ids": []}
        if role == "assistant":
            entry["tool_calls"] = [_call(call) for call in message.get("tool_calls") or []]
        if role == "tool":
            entry["tool_call_id"] = message.get("tool_call_id")
            entry["error"] = text.lstrip().startswith("Error")
        records.append(entry)
        images_per_message.append(images)
    # A turn cut by a length or turn limit never became a message (verl parses calls only below the limits).
    for text in assistant_texts[assistants:]:
        turn += 1
        records.append({"role": "assistant", "turn": turn, "text": text, "image_ids": [], "tool_calls": [],
                        "note": "generated at a length or turn limit: not parsed for tool calls"})
        images_per_message.append([])
    return records, images_per_message


def _split_content(content) -> tuple[str, list]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts, images = [], []
    for item in content:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in ("image", "image_url") or (isinstance(item, dict) and ("image" in item or "image_url" in item)):
            images.append(item.get("image", item.get("image_url")))
        elif kind == "text":
            texts.append(str(item.get("text", "")))
    return "".join(texts), images


def _call(call: dict) -> dict:
    function = call.get("function", call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # kept as the raw string the model wrote
    return {"name": function.get("name"), "arguments": _jsonable(arguments)}


def _images(records: list[dict], message_images: list[list], images: list) -> tuple[list[dict], list]:
    """Number images in message order (the token order, so the ids tools use); pixels are what the model saw."""
    entries, pixels = [], []
    for record, found in zip(records, message_images, strict=True):
        for item in found:
            image_id = len(entries) + 1
            image = images[image_id - 1] if image_id <= len(images) else item
            image = image if isinstance(image, Image.Image) else None
            record["image_ids"].append(image_id)
            entries.append({
                "id": image_id,
                "source": _image_source(record),
                "turn": record["turn"],
                "width": image.width if image else None,
                "height": image.height if image else None,
                "file": None,
                "thumb": None,
            })
            pixels.append(image)
    return entries, pixels


def _image_source(message: dict) -> str:
    if message["turn"] == 0:
        return "prompt"
    return "tool" if message["role"] == "tool" else "environment"


def _tool_calls(messages: list[dict]) -> list[dict]:
    """Each call of an assistant message paired with the tool message answering it (same order, as the loop runs
    calls sequentially); tool messages beyond the calls are the loop's answers to malformed calls."""
    calls = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        answers = []
        for later in messages[index + 1 :]:
            if later["role"] != "tool":
                break
            answers.append(later)
        for position, call in enumerate(message["tool_calls"]):
            answer = answers[position] if position < len(answers) else None
            calls.append({
                "turn": message["turn"],
                "name": call["name"],
                "arguments": call["arguments"],
                "result": answer["text"] if answer else None,
                "error": bool(answer and answer["error"]),
                "image_ids": list(answer["image_ids"]) if answer else [],
            })
    return calls


def _turns(spans: list[tuple[int, int]], response_tokens: int, turn_rewards: list) -> list[dict]:
    turns = []
    for index, (start, end) in enumerate(spans):
        next_start = spans[index + 1][0] if index + 1 < len(spans) else response_tokens
        reward = turn_rewards[index] if index < len(turn_rewards) else None
        turns.append({"turn": index + 1, "trained_tokens": end - start, "context_tokens_after": next_start - end,
                      "reward": reward})
    return turns


def _mask_summary(prompt_ids: list, response_mask: list) -> dict:
    trained = int(sum(response_mask))
    return {"prompt_tokens": len(prompt_ids), "response_tokens": len(response_mask), "trained_tokens": trained,
            "context_tokens": len(response_mask) - trained}


def _stats(extra_fields: dict) -> dict:
    stats = {key: extra_fields[key] for key in STATS_KEYS if key in extra_fields}
    for key, value in extra_fields.items():
        if key.startswith("mm_tool/") and key != DUMP_KEY:
            stats[key.removeprefix("mm_tool/")] = value
    return _jsonable(stats)


def _sample_ids(sample: dict) -> dict:
    extra_info = sample.get("extra_info")
    extra_info = extra_info if isinstance(extra_info, dict) else {}
    reward_model = sample.get("reward_model")
    return _jsonable({
        "index": sample.get("index", extra_info.get("index")),
        "uid": sample.get("uid"),
        "data_source": sample.get("data_source"),
        "ground_truth": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
        "extra_info": extra_info,
    })


def _jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars and arrays unwrapped, anything else (an image, say) as a short repr."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)[:200]


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
    return {"mm_tool/dump/written": float(totals["written"]), "mm_tool/dump/skipped": float(skipped),
            "mm_tool/dump/mb": used / 2**20}


def _final_fields(batch: StepBatch) -> list[dict]:
    """What only the trainer side knows, per row: step, rollout number, reward score and reward extra info."""
    scores = batch.rm_scores.sum(dim=-1).tolist() if batch.rm_scores is not None else None
    turn_rewards = batch.column("mm_tool/turn_rewards")
    extras = batch.reward_extra or [{}] * len(turn_rewards)
    return [{
        "step": batch.step,
        "validate": batch.validate,
        "rollout_n": batch.rollout_n[row],
        "reward": {
            "score": scores[row] if scores is not None else None,
            "turn_rewards": _jsonable(list(turn_rewards[row] or [])),
            "extra": _jsonable(extras[row]),
        },
    } for row in range(len(turn_rewards))]


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
                "(step_*/%s, metric mm_tool/dump/skipped)", dump_dir, step, counts[reason], limit, STEP_SUMMARY,
            )
