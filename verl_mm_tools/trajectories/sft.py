"""Recorded trajectories as verl's multi-turn SFT data (``verl-mm-tools export-sft``).

A record's ``chat`` is the conversation as the chat template rendered it in the loop; a row is that conversation in
the layout ``verl.utils.dataset.multiturn_sft_dataset.MultiTurnSFTDataset`` reads: ``messages`` (role, content with
an ``<image>`` placeholder per image, and the keys the template reads: ``tool_calls``, ``name``), ``images`` (the
PNGs the model saw, in placeholder order), ``tools`` (the template's ``tools`` as JSON text, when it had any: verl
reads it with this package's fix, ``adaptations/fixes/sft_tools_nulls.py``) and
``enable_thinking`` (when the loop set it). verl renders each message alone and trains every assistant message
(its generation prompt excluded); ``--per-turn`` writes one row per assistant turn, the conversation up to it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RecordError, chat_image_ids
from verl_mm_tools.trajectories.read import LoadedRecord, RecordSet, load_records

logger = logging.getLogger(__name__)

CHAT_VERSION = 4  # the first record version with ``chat``
PLACEHOLDERS = ("<image>", "<video>")  # what MultiTurnSFTDataset replaces in message text
TRAIN_FILE = "train.parquet"
SUMMARY_FILE = "export.json"


@dataclass(frozen=True)
class SFTFilters:
    """Which records become rows; a record failing one is counted under that reason."""

    min_reward: float | None = None
    stops: tuple[str, ...] = ()
    tools_used: tuple[str, ...] = ()
    data_sources: tuple[str, ...] = ()
    best_of: bool = False  # only each prompt's best-scored record

    def reason_to_skip(self, record: dict) -> str | None:
        score = (record.get("reward") or {}).get("score")
        if record.get("masked"):
            return "masked (the loop trained on nothing)"
        if (self.min_reward is not None or self.best_of) and score is None:
            return "no reward score"
        if self.min_reward is not None and score is not None and score < self.min_reward:
            return f"reward below {self.min_reward}"
        if self.stops and record.get("stop_reason") not in self.stops:
            return f"stop reason not in {list(self.stops)}"
        if self.tools_used and not set(self.tools_used) <= set(record.get("tools_used") or []):
            return f"did not use {list(self.tools_used)}"
        if self.data_sources and (record.get("sample") or {}).get("data_source") not in self.data_sources:
            return f"data source not in {list(self.data_sources)}"
        return None


@dataclass
class ExportSummary:
    rows: int = 0
    records: int = 0
    skipped: Counter = field(default_factory=Counter)
    bad: list[dict] = field(default_factory=list)
    template_kwargs: dict = field(default_factory=dict)

    def as_dict(self, out: Path) -> dict:
        return {
            "rows": self.rows,
            "records": self.records,
            "skipped": dict(sorted(self.skipped.items())),
            "bad_records": self.bad,
            "verl_overrides": verl_overrides(out / TRAIN_FILE, self.template_kwargs),
        }


def export_sft(paths: list[Path], out: Path, filters: SFTFilters = SFTFilters(), per_turn: bool = False) -> dict:
    """Write ``out/train.parquet`` and ``out/export.json`` (counts, skipped and bad records, verl's overrides) from
    the records under ``paths``; returns the summary. A ConfigError when no row would be written."""
    loaded = load_records(paths)
    summary = ExportSummary(bad=[{"path": str(bad.path), "reason": bad.reason} for bad in loaded.bad])
    kept = _kept(loaded, filters, summary)
    rows = []
    for item in kept:
        try:
            rows += record_rows(item, per_turn)
        except RecordError as error:
            summary.bad.append({"path": str(item.path), "reason": str(error)})
            continue
        summary.records += 1
    if not rows:
        raise ConfigError(f"no SFT row to write from {[str(path) for path in paths]}: {_nothing_reason(summary)}")
    summary.template_kwargs = _shared_template_kwargs(kept)
    summary.rows = len(rows)
    out.mkdir(parents=True, exist_ok=True)
    _write_parquet(rows, out / TRAIN_FILE)
    result = summary.as_dict(out)
    (out / SUMMARY_FILE).write_text(json.dumps(result, indent=1) + "\n")
    for bad in summary.bad:
        logger.warning("export-sft: left out %s: %s", bad["path"], bad["reason"])
    return result


def _kept(loaded: RecordSet, filters: SFTFilters, summary: ExportSummary) -> list[LoadedRecord]:
    kept = []
    for item in loaded.records:
        reason = filters.reason_to_skip(item.record)
        if reason is None:
            kept.append(item)
        else:
            summary.skipped[reason] += 1
    if filters.best_of:
        best = best_of_each_prompt(kept)
        summary.skipped["not its prompt's best"] += len(kept) - len(best)
        kept = best
    return kept


def best_of_each_prompt(records: list[LoadedRecord]) -> list[LoadedRecord]:
    """The best-scored record of each prompt (data source and sample index, else uid), the earliest sample on a
    tie; a record naming no prompt stands alone."""
    best: dict = {}
    for order, item in enumerate(records):
        sample = item.record.get("sample") or {}
        prompt = sample.get("index") if sample.get("index") is not None else sample.get("uid")
        key = (sample.get("data_source"), prompt) if prompt is not None else ("record", order)
        rank = (item.record["reward"]["score"], -(item.record.get("rollout_n") or 0), -order)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, order, item)
    return [item for _, _, item in sorted(best.values(), key=lambda entry: entry[1])]


def record_rows(item: LoadedRecord, per_turn: bool) -> list[dict]:
    """The record's SFT rows: the whole conversation up to its last assistant message, or one per assistant turn."""
    chat = item.record.get("chat")
    if item.record.get("version", 0) < CHAT_VERSION or not chat:
        raise RecordError(
            f"{item.path}: record version {item.record.get('version')} has no rendered conversation ('chat', "
            f"records of version {CHAT_VERSION} on); re-record it with this verl-mm-tools"
        )
    messages = [_sft_message(item, message) for message in chat["messages"]]
    assistant_ends = [index + 1 for index, message in enumerate(messages) if message["role"] == "assistant"]
    if not assistant_ends:
        raise RecordError(f"{item.path}: no assistant message to train on")
    ends = assistant_ends if per_turn else assistant_ends[-1:]
    # a row's images are the chat's first ones (numbered in placeholder order), one per "<image>" (a literal one in
    # a text is refused); read once for the rows that share them, none after the last row's messages
    pngs = [
        item.image_file(image_id).read_bytes() for image_id in chat_image_ids(chat)[: _images(messages[: ends[-1]])]
    ]
    return [_row(item, chat, messages[:end], pngs[: _images(messages[:end])]) for end in ends]


def _images(messages: list[dict]) -> int:
    return sum(message["content"].count("<image>") for message in messages)


def _row(item: LoadedRecord, chat: dict, messages: list[dict], pngs: list[bytes]) -> dict:
    row: dict[str, Any] = {
        "messages": messages,
        "images": [{"bytes": png} for png in pngs],
        # JSON text: a Parquet column of dicts would reorder and pad the schemas
        # (adaptations/fixes/sft_tools_nulls.py reads it)
        "tools": json.dumps(chat["tools"]) if chat.get("tools") else None,
        "source": str(item.path),
    }
    if "enable_thinking" in chat.get("template_kwargs", {}):
        row["enable_thinking"] = bool(chat["template_kwargs"]["enable_thinking"])
    return row


def _sft_message(item: LoadedRecord, message: dict) -> dict:
    """A chat message with its content as one string, ``<image>`` where each image was."""
    content = message.get("content")
    parts = [{"type": "text", "text": content or ""}] if not isinstance(content, list) else content
    text = ""
    for part in parts:
        if part["type"] == "image":
            text += "<image>"
            continue
        found = [placeholder for placeholder in PLACEHOLDERS if placeholder in part["text"]]
        if found:
            raise RecordError(
                f"{item.path}: a {message['role']} message's text holds {found[0]!r}, which verl's "
                "MultiTurnSFTDataset would read as an image placeholder"
            )
        text += part["text"]
    extra = {key: value for key, value in message.items() if key != "content" and value is not None}
    return {**extra, "content": text}


def _shared_template_kwargs(records: list[LoadedRecord]) -> dict:
    """The chat template kwargs every record was rendered with (verl's SFT takes one set), enable_thinking aside
    (a column)."""
    found = {
        json.dumps(
            {
                k: v
                for k, v in ((item.record.get("chat") or {}).get("template_kwargs") or {}).items()
                if k != "enable_thinking"
            },
            sort_keys=True,
        )
        for item in records
        if item.record.get("chat")
    }
    if len(found) > 1:
        raise ConfigError(
            f"the records were rendered with different chat template kwargs {sorted(found)}; verl's SFT trainer "
            "takes one set (data.apply_chat_template_kwargs): export them separately (--data-source, or one folder "
            "at a time)"
        )
    return json.loads(found.pop()) if found else {}


def _nothing_reason(summary: ExportSummary) -> str:
    reasons = [f"{count} {reason}" for reason, count in summary.skipped.items()]
    reasons += [bad["reason"] for bad in summary.bad[:5]]  # each names its file
    return "; ".join(reasons) or "no records"


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    if frame["tools"].isna().all():
        frame = frame.drop(columns=["tools"])  # a template that took no tools: verl then passes none
    frame.to_parquet(path)


def verl_overrides(train_file: Path, template_kwargs: dict) -> list[str]:
    """The data options of ``python -m verl.trainer.sft_trainer`` for the written parquet."""
    overrides = [f"data.train_files={train_file}", "data.messages_key=messages", "data.image_key=images"]
    overrides += [
        f"+data.apply_chat_template_kwargs.{key}={json.dumps(value)}" for key, value in template_kwargs.items()
    ]
    return overrides
