"""Recorded trajectories as verl's multi-turn SFT data (``verl-mm-tools export-sft``).

A record's ``chat`` is the conversation as the chat template rendered it in the loop; a row is that conversation in
the layout ``verl.utils.dataset.multiturn_sft_dataset.MultiTurnSFTDataset`` reads: ``messages`` (role, content with
an ``<image>`` placeholder per image, and the keys the template reads: ``tool_calls``, ``name``), ``images`` (the
PNGs the model saw, in placeholder order), ``tools`` (the template's ``tools`` as JSON text, when it had any: verl
reads it with this package's fix, ``adaptations/fixes/sft_tools_nulls.py``) and
``enable_thinking`` (when the loop set it), and ``videos`` (the prompt's video files, each sampled as the loop sampled
it: ``sft_videos``; only with ``--video-root``, the folder they must be under, and read by this package's fix,
``adaptations/fixes/sft_video_sampling.py``). verl renders each message alone and trains every assistant message
(its generation prompt excluded); ``--per-turn`` writes one row per assistant turn, the conversation up to it. A
record whose loop kept only the last images in context (``keep_last_images``, ``image_window``) is written per turn
only, each row as its turn's context held it: the earlier images as notes.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.image_window import windowed
from verl_mm_tools.record import RecordError, chat_image_ids
from verl_mm_tools.trajectories.read import (
    EXPORT_MARKER,
    TRAIN,
    VAL,
    LoadedRecord,
    RecordSet,
    check_out_folder,
    load_records,
)
from verl_mm_tools.trajectories.sft_videos import VideoRefused, VideoRows

logger = logging.getLogger(__name__)

CHAT_VERSION = 4  # the first record version with ``chat``
PLACEHOLDERS = ("<image>", "<video>")  # what MultiTurnSFTDataset replaces in message text
TRAIN_FILE = "train.parquet"
SUMMARY_FILE = EXPORT_MARKER  # also what keeps a later command from reading this folder as input
SPLITS = (TRAIN, VAL, "all")


@dataclass(frozen=True)
class SFTFilters:
    """Which records become rows; a record failing one is counted under that reason."""

    min_reward: float | None = None
    stops: tuple[str, ...] = ()
    tools_used: tuple[str, ...] = ()
    data_sources: tuple[str, ...] = ()
    best_of: bool = False  # only each prompt's best-scored record
    split: str = TRAIN  # train, val or all: validation trajectories are no training data unless asked for

    def reason_to_skip(self, record: dict) -> str | None:
        score = (record.get("reward") or {}).get("score")
        if self.split != "all" and (VAL if record.get("validate") else TRAIN) != self.split:
            return f"not in the {self.split} split (--split)"
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
    splits: dict = field(default_factory=dict)  # trajectories seen of each split
    models: set = field(default_factory=set)  # the models of the exported trajectories
    bad: list[dict] = field(default_factory=list)
    template_kwargs: dict = field(default_factory=dict)
    videos: int = 0  # the video entries of the rows written

    def as_dict(self, out: Path) -> dict:
        return {
            "rows": self.rows,
            "records": self.records,
            "skipped": dict(sorted(self.skipped.items())),
            "splits_seen": self.splits,
            "videos": self.videos,
            "bad_records": self.bad,
            "verl_overrides": verl_overrides(out.absolute() / TRAIN_FILE, self.template_kwargs, bool(self.videos)),
            "verl_command": verl_command(out, self.template_kwargs, self.models, bool(self.videos)),
        }


def export_sft(
    paths: list[Path],
    out: Path,
    filters: SFTFilters = SFTFilters(),
    per_turn: bool = False,
    video_root: Path | None = None,
) -> dict:
    """Write ``out/train.parquet`` and ``out/export.json`` (counts, splits seen, skipped and bad records, verl's
    command) from the good records under ``paths`` (``read.load_records``); returns the summary. Records with
    videos need ``video_root`` (their files must be under it), else they are skipped. A ConfigError when no row
    would be written."""
    check_out_folder(out, paths)
    videos = VideoRows.under(video_root)
    loaded = load_records(paths, exclude=[out])
    summary = ExportSummary(bad=[{"path": str(bad.path), "reason": bad.reason} for bad in loaded.bad])
    summary.splits = loaded.splits()
    exported = []
    for item in _kept(loaded, filters, summary):
        try:
            exported.append((item, record_rows(item, per_turn, videos.of(item))))
        except RecordError as error:
            summary.bad.append({"path": str(item.path), "reason": str(error)})
        except VideoRefused as refused:
            summary.skipped[refused.reason] += 1
            logger.warning("export-sft: skipped %s", refused)
    summary.template_kwargs, exported = _shared_template_kwargs(exported, summary)
    rows = [row for _, record_rows_ in exported for row in record_rows_]
    if not rows:
        raise ConfigError(f"no SFT row to write from {[str(path) for path in paths]}: {_nothing_reason(summary)}")
    summary.records, summary.rows = len(exported), len(rows)
    summary.models = {item.record.get("model") for item, _ in exported}
    summary.videos = sum(len(row["videos"]) for row in rows)
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
    """The best-scored record of each prompt (``LoadedRecord.prompt_key``: verl's uid, else the prompt's text and
    images), the earliest sample on a tie."""
    best: dict = {}
    for order, item in enumerate(records):
        key = item.prompt_key()
        rank = (item.record["reward"]["score"], -(item.record.get("rollout_n") or 0), -order)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, order, item)
    return [item for _, _, item in sorted(best.values(), key=lambda entry: entry[1])]


def record_rows(item: LoadedRecord, per_turn: bool, videos: list[dict] | None = None) -> list[dict]:
    """The record's SFT rows: the whole conversation up to its last assistant message, or one per assistant turn;
    ``videos``: its videos' row entries (``sft_videos.VideoRows.of``), in placeholder order."""
    chat = item.record.get("chat")
    if item.record.get("version", 0) < CHAT_VERSION or not chat:
        raise RecordError(
            f"{item.path}: record version {item.record.get('version')} has no rendered conversation ('chat', "
            f"records of version {CHAT_VERSION} on); re-record it with this verl-mm-tools"
        )
    assistant_ends = [index + 1 for index, message in enumerate(chat["messages"]) if message["role"] == "assistant"]
    if not assistant_ends:
        raise RecordError(f"{item.path}: no assistant message to train on")
    left_outs = _images_left_out(item, len(assistant_ends), per_turn)
    if not any(left_outs):
        return _rows(item, chat, assistant_ends if per_turn else assistant_ends[-1:], videos=videos)
    # keep_last_images: each turn's row is the context its sample held, earlier images as notes
    rows = []
    for end, left_out in zip(assistant_ends, left_outs, strict=True):
        window = {**chat, "messages": windowed(chat["messages"][:end], left_out)}
        rows += _rows(item, window, [end], chat_image_ids(chat)[left_out:], videos)
    return rows


def _rows(
    item: LoadedRecord,
    chat: dict,
    ends: list[int],
    image_ids: list[int] | None = None,
    videos: list[dict] | None = None,
) -> list[dict]:
    """A row per end (an assistant message's index + 1) of ``chat``, whose image parts show ``image_ids`` in order
    (the chat's own by default) and video parts ``videos``."""
    messages = [_sft_message(item, message) for message in chat["messages"]]
    ids = chat_image_ids(chat) if image_ids is None else image_ids
    # a row's images are the chat's first ones (numbered in placeholder order), one per "<image>" (a literal one in
    # a text is refused); read once for the rows that share them, none after the last row's messages
    pngs = [item.image_file(image_id).read_bytes() for image_id in ids[: _images(messages[: ends[-1]])]]
    return [
        _row(item, chat, messages[:end], pngs[: _images(messages[:end])], (videos or [])[: _videos(messages[:end])])
        for end in ends
    ]


def _images_left_out(item: LoadedRecord, assistant_messages: int, per_turn: bool) -> list[int]:
    """Per assistant message, the images its sample's context left out (``keep_last_images``; version 6 on)."""
    samples, turns = item.record.get("samples") or [], item.record.get("turns") or []
    at = [turn.get("sample") or 0 for turn in turns]
    left_outs = [samples[sample].get("images_left_out") or 0 for sample in at if sample < len(samples)]
    if not any(left_outs):
        return [0] * assistant_messages
    if not per_turn:
        raise RecordError(
            f"{item.path}: the loop's keep_last_images left earlier images out of its later turns' context, so no "
            "one conversation is what the model saw at every turn; export it with --per-turn (a row per turn, as "
            "its context held it)"
        )
    if len(left_outs) < assistant_messages:
        raise RecordError(
            f"{item.path}: {assistant_messages} assistant messages but {len(left_outs)} turns with a training "
            "sample: which images each turn saw is unknown"
        )
    return left_outs[:assistant_messages]


def _images(messages: list[dict]) -> int:
    return sum(message["content"].count("<image>") for message in messages)


def _videos(messages: list[dict]) -> int:
    return sum(message["content"].count("<video>") for message in messages)


def _row(item: LoadedRecord, chat: dict, messages: list[dict], pngs: list[bytes], videos: list[dict]) -> dict:
    row: dict[str, Any] = {
        "messages": messages,
        "images": [{"bytes": png} for png in pngs],
        "videos": videos,
        # JSON text: a Parquet column of dicts would reorder and pad the schemas
        # (adaptations/fixes/sft_tools_nulls.py reads it)
        "tools": json.dumps(chat["tools"]) if chat.get("tools") else None,
        "source": str(item.path),
    }
    if "enable_thinking" in chat.get("template_kwargs", {}):
        row["enable_thinking"] = bool(chat["template_kwargs"]["enable_thinking"])
    return row


def _sft_message(item: LoadedRecord, message: dict) -> dict:
    """A chat message with its content as one string, ``<image>`` where each image was, ``<video>`` each video."""
    content = message.get("content")
    parts = [{"type": "text", "text": content or ""}] if not isinstance(content, list) else content
    text = ""
    for part in parts:
        if part["type"] in ("image", "video"):
            text += f"<{part['type']}>"
            continue
        found = [placeholder for placeholder in PLACEHOLDERS if placeholder in part["text"]]
        if found:
            raise RecordError(
                f"{item.path}: a {message['role']} message's text holds {found[0]!r}, which verl's "
                "MultiTurnSFTDataset would read as an image or video placeholder"
            )
        text += part["text"]
    extra = {key: value for key, value in message.items() if key != "content" and value is not None}
    return {**extra, "content": text}


def _template_kwargs(item: LoadedRecord) -> str:
    kwargs = (item.record.get("chat") or {}).get("template_kwargs") or {}
    return json.dumps({key: value for key, value in kwargs.items() if key != "enable_thinking"}, sort_keys=True)


def _shared_template_kwargs(exported: list, summary: ExportSummary) -> tuple[dict, list]:
    """The chat template kwargs most records were rendered with (verl's SFT takes one set,
    ``data.apply_chat_template_kwargs``; enable_thinking aside, a column) and the records rendered with them; the
    others are listed as bad, to export separately."""
    found = Counter(_template_kwargs(item) for item, _ in exported)
    if not found:
        return {}, exported
    shared = found.most_common(1)[0][0]
    for item, _ in exported:
        if _template_kwargs(item) != shared:
            summary.bad.append(
                {
                    "path": str(item.path),
                    "reason": f"{item.path}: rendered with chat template kwargs {_template_kwargs(item)}, not the "
                    f"{shared} of the others (verl's SFT trainer takes one set): export it separately",
                }
            )
    return json.loads(shared), [entry for entry in exported if _template_kwargs(entry[0]) == shared]


def _nothing_reason(summary: ExportSummary) -> str:
    reasons = [f"{count} {reason}" for reason, count in summary.skipped.items()]
    reasons += [bad["reason"] for bad in summary.bad[:5]]  # each names its file
    return "; ".join(reasons) or "no records"


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    if frame["tools"].isna().all():
        frame = frame.drop(columns=["tools"])  # a template that took no tools: verl then passes none
    if not any(len(videos) for videos in frame["videos"]):
        frame = frame.drop(columns=["videos"])  # verl then reads no video column
    frame.to_parquet(path)


def verl_overrides(train_file: Path, template_kwargs: dict, videos: bool = False) -> list[str]:
    """The data options of ``python -m verl.trainer.sft_trainer`` for the written parquet."""
    overrides = [f"data.train_files={train_file}", "data.messages_key=messages", "data.image_key=images"]
    overrides += ["data.video_key=videos"] if videos else []
    overrides += [
        f"+data.apply_chat_template_kwargs.{key}={json.dumps(value)}" for key, value in template_kwargs.items()
    ]
    return overrides


def verl_command(out: Path, template_kwargs: dict, models: set, videos: bool = False) -> str:
    """The whole command line of verl's SFT trainer for the written parquet, absolute paths: the model the
    trajectories were generated by when they share one (else MODEL_PATH, to fill in), checkpoints under ``out``."""
    out = out.absolute()
    named = sorted(str(model) for model in models if model)
    model = str(Path(named[0]).absolute()) if len(named) == 1 and len(models) == 1 else "MODEL_PATH"
    overrides = [
        *verl_overrides(out / TRAIN_FILE, template_kwargs, videos),
        f"model.path={model}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
    ]
    return " ".join(["torchrun --standalone --nproc_per_node=1 -m verl.trainer.sft_trainer", *overrides])
