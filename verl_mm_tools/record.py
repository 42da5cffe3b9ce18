"""The trajectory record: one JSON document per trajectory, written by the mm_tool dumps (``agent_loop.dump``) and
read by the viewer. Pure: it imports neither verl nor torch, so the viewer runs without them.

A trajectory's name everywhere (viewer index and page): ``trajectory_name``. Its turn count: ``len(record["turns"])``,
the assistant turns (generations), as the step metric ``mm_tool/turns/mean`` counts them (verl's own ``num_turns``
counts messages, prompt included).

A finished trajectory is ``<step dir>/<id>/trajectory.json`` plus ``images/<image id>.png`` and
``images/<image id>.thumb.jpg``. Record keys (``RECORD_VERSION`` 9; version 8 records hold no video a tool
answered (``source`` tool), version 7 records also lack the ``chat``'s video parts, version 6 records also ``videos``
and the messages' ``video_ids``, version 5 records also the samples' ``images_left_out``, version 4 records also the
turns' ``weight_versions``, version 3 records also ``chat``, version 2 records also ``samples`` and the turns'
``sample``, version 1 records also the turns' ``prompt_tokens``, ``tool_calls`` and ``images_added``):

- ``format``, ``version``, ``id`` (the dump id, a uuid hex), ``request_id`` (verl's, of the trajectory), ``model``
  (the path of the model that generated it: ``actor_rollout_ref.model.path``);
- ``sample``: ``index``, ``uid``, ``data_source``, ``ground_truth``, ``extra_info`` (of the dataset row);
- ``messages``: in order, each ``role``, ``turn`` (0 for the prompt, j for assistant turn j and the tool or
  environment messages that answer it), ``text``, ``image_ids``; assistant messages add ``tool_calls`` (``name``,
  ``arguments``) and their text is the decoded generated tokens; tool messages add ``tool_call_id`` and ``error``
  (the text starts with "Error", as every error of the loop and of the tool library does); a message holding videos
  adds ``video_ids``;
- ``images``: ``id`` (1-based, the ids tools use), ``source`` (prompt, tool or environment), ``turn``, ``width``,
  ``height``, ``file``, ``thumb`` (paths relative to the trajectory folder; None when the pixels were unavailable);
- ``videos``: the videos as the model saw them: ``id`` (1-based, "Video N", the ids ``get_frames`` and ``clip``
  take), ``source`` (prompt, or tool: a ``clip``'s answer), ``turn``, ``path`` (the file, None for a video given as
  frames or a tool's), ``times_s`` (the time of each frame sampled, in the video), ``width``, ``height`` (the frames'
  size after the processor's resize), ``strip`` (up to 8 of those frames spread over the video, each ``time_s`` and
  ``thumb``, a JPEG relative to the folder; None when its pixels were unavailable);
- ``tool_calls``: flattened, each ``turn``, ``name``, ``arguments``, ``result`` (text), ``error``, ``image_ids``;
- ``tools_used``: sorted tool names called at least once;
- ``turns``: per assistant turn as the loop recorded it, ``turn``, ``prompt_tokens`` (tokens before its generation:
  its prompt), ``trained_tokens`` (its generated tokens, response_mask 1), ``context_tokens_after`` (tool and
  environment tokens until the next turn, mask 0), ``tool_calls`` (names of the calls it made that were run),
  ``images_added`` (ids of the images the answering tool or environment turn added), ``reward`` (tool step rewards
  plus the environment's reward for the turn), ``sample`` (the training sample holding it; its token counts are in
  that sample), ``weight_versions`` ([first, last] weight version its generation ran under: they differ where a
  weight sync interrupted it and verl's fully async client resumed it; None where the engine reports none); empty
  for a masked trajectory;
- ``samples``: the training samples the trajectory became (one unless the loop's ``export`` is per_turn or auto),
  each ``sample``, ``turns`` (the turn numbers it trains on), ``prompt_tokens``, ``response_tokens``,
  ``trained_tokens``, ``images`` (how many it holds: the trajectory's images after its ``images_left_out`` first,
  which the loop's ``keep_last_images`` rendered as notes, ``image_window``);
- ``chat``: the conversation as the chat template rendered it (what ``verl-mm-tools export-sft`` writes):
  ``messages`` (the loop's tool format applied: the tool block, tool results as the template takes them; assistant
  messages as the model wrote them; content a string or parts ``{"type": "text", "text"}``,
  ``{"type": "image", "image_id"}`` and ``{"type": "video", "video_id"}``), ``tools`` (the ``tools`` argument of the
  template, or None) and ``template_kwargs`` (``apply_chat_template_kwargs``); None when its images or videos could
  not be matched to ``images`` and ``videos``;
- ``mask``: ``prompt_tokens``, ``response_tokens``, ``trained_tokens``, ``context_tokens``, summed over the samples;
- ``masked``, ``stop_reason``, ``error``, ``stats`` (every ``mm_tool/*`` extra field without its prefix, plus
  ``tool_call_counts``, ``attempts``, ``turn_scores``, ``tool_rewards``), ``timing`` (verl's per-trajectory metrics);
- added on the trainer side: ``step``, ``validate``, ``rollout_n``, ``reward``: ``score`` (sum of ``rm_scores``, the
  reward manager's score; None when rewards were not computed during rollout), ``turn_rewards`` (of the final
  sample's turns; every turn's reward is in ``turns``), ``extra`` (the
  reward manager's ``reward_extra_info`` for this trajectory).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from verl_mm_tools.errors import VerlMMToolsError
from verl_mm_tools.handoff import PREFIX, SampleFields
from verl_mm_tools.video import is_video_entry

logger = logging.getLogger(__name__)

RECORD_FORMAT = "verl-mm-tools/trajectory"
RECORD_VERSION = 9
RECORD_FILE = "trajectory.json"
STAGED_RECORD_FILE = "record.json"
STAGING_DIR = "_staging"
SITE_DIR = "_site"  # the viewer's default output; not counted against dump_max_mb
FULL_MARKER = "_FULL"
STEP_SUMMARY = "_step.json"
STEP_COUNTS = ("written", "per_step_cap", "disk_cap", "error", "not_found")  # the keys of step_*/_step.json
STATS_KEYS = ("tool_call_counts", "attempts", "turn_scores", "tool_rewards")


class RecordError(VerlMMToolsError, ValueError):
    """A trajectory record that cannot be read: not JSON, another format, a newer version, missing files."""


def read_record(path: str | os.PathLike) -> dict:
    """The record in ``path`` (a ``trajectory.json``); a RecordError naming the file when it is not one this
    version reads."""
    try:
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, ValueError) as error:
        raise RecordError(f"{path}: not a readable JSON record ({error})") from error
    version = record.get("version") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise RecordError(f"{path}: format {found!r}, not a trajectory record ({RECORD_FORMAT!r})")
    if not isinstance(version, int) or not 1 <= version <= RECORD_VERSION:
        raise RecordError(
            f"{path}: record version {version!r}; this verl-mm-tools reads versions 1 to {RECORD_VERSION}: "
            "upgrade verl-mm-tools to read newer records"
        )
    return record


@dataclass(frozen=True)
class TurnRecord:
    """What a record says about one assistant turn, as the loop recorded it (``agent_loop.state.Turn``)."""

    span: tuple[int, int]  # [start, end) of the generated tokens in its sample's response
    prompt_tokens: int  # tokens before the turn's generation: its prompt
    tool_calls: tuple[str, ...] = ()
    images_added: tuple[int, ...] = ()
    reward: float = 0.0
    sample: int = 0
    text: str = ""  # the decoded generated tokens
    # [first, last] weight versions of the generation (differ where a weight sync interrupted it and verl resumed it)
    weight_versions: tuple[int, int] | None = None


@dataclass(frozen=True)
class SampleRecord:
    """One training sample of the trajectory (an agent-loop output): its token counts."""

    prompt_tokens: int
    response_mask: tuple[int, ...]
    images: int
    images_left_out: int = 0  # the trajectory's first images, rendered as notes (keep_last_images)


def build_record(
    *,
    messages: list[dict],
    images: list,
    samples: list[SampleRecord],
    turns: list[TurnRecord],
    extra_fields: dict,
    sample: dict,
    model: str | None = None,
    request_id: str | None = None,
    timing: dict | None = None,
    chat: dict | None = None,
    videos: list[dict] | None = None,
) -> tuple[dict, list]:
    """The JSON-able record of one trajectory and the image for each image id (None when unavailable); ``chat``
    is ``chat_record``'s; ``videos`` the record's video entries but ``id`` (``video_entry``), in message order."""
    record_messages, message_images = _messages(messages, [turn.text for turn in turns])
    video_entries = _videos(record_messages, messages, videos or [])
    image_entries, pixels = _images(record_messages, message_images, images)
    if chat is not None and (
        chat_image_ids(chat) != [entry["id"] for entry in image_entries]
        or chat_video_ids(chat) != [entry["id"] for entry in video_entries]
    ):
        logger.warning(
            "trajectory record: the rendered conversation's images or videos do not match the messages'; no chat kept"
        )
        chat = None
    stats = _stats(extra_fields)
    record = {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "id": uuid.uuid4().hex,
        "request_id": request_id,
        "model": model,
        "sample": sample_ids(sample),
        "messages": record_messages,
        "images": image_entries,
        "videos": video_entries,
        "tool_calls": _tool_calls(record_messages),
        "turns": _turns(turns, samples),
        "samples": _samples(samples, turns),
        "chat": chat,
        "mask": _mask_summary(samples),
        "masked": bool(stats.get("masked")),
        "stop_reason": stats.get("stop_reason"),
        "error": stats.get("error") or "",
        "stats": stats,
        "timing": jsonable(timing or {}),
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
        records.append(
            {
                "role": "assistant",
                "turn": turn,
                "text": text,
                "image_ids": [],
                "tool_calls": [],
                "note": "generated at a length or turn limit: not parsed for tool calls",
            }
        )
        images_per_message.append([])
    return records, images_per_message


def chat_record(messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None) -> dict:
    """The record's ``chat``: ``messages`` as the chat template rendered them, image and video items numbered in
    order (the orders of the record's ``images`` and ``videos``: the template's)."""
    image_ids, video_ids = itertools.count(1), itertools.count(1)
    return {
        "messages": [_chat_message(message, image_ids, video_ids) for message in messages],
        "tools": jsonable(tools) if tools else None,
        "template_kwargs": jsonable(template_kwargs or {}),
    }


def _chat_message(message: dict, image_ids: Iterator[int], video_ids: Iterator[int]) -> dict:
    entry = {key: jsonable(value) for key, value in message.items() if key != "content"}
    content = message.get("content")
    if content is None or isinstance(content, str):
        entry["content"] = content
        return entry
    parts = []
    for item in content:
        if _is_image(item):
            parts.append({"type": "image", "image_id": next(image_ids)})
        elif is_video_entry(item):
            parts.append({"type": "video", "video_id": next(video_ids)})
        elif isinstance(item, dict) and item.get("type") == "text":
            parts.append({"type": "text", "text": str(item["text"])})
    entry["content"] = parts
    return entry


def chat_image_ids(chat: dict) -> list[int]:
    """The image ids of ``chat``'s messages, in order."""
    return _chat_part_ids(chat, "image")


def chat_video_ids(chat: dict) -> list[int]:
    """The video ids of ``chat``'s messages, in order (none in records before version 8)."""
    return _chat_part_ids(chat, "video")


def _chat_part_ids(chat: dict, kind: str) -> list[int]:
    return [
        part[f"{kind}_id"]
        for message in chat["messages"]
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == kind
    ]


def _is_image(item: object) -> bool:
    return isinstance(item, dict) and (
        item.get("type") in ("image", "image_url") or "image" in item or "image_url" in item
    )


def _split_content(content: str | list[dict] | None) -> tuple[str, list]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts, images = [], []
    for item in content:
        kind = item.get("type") if isinstance(item, dict) else None
        if _is_image(item):
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
    return {"name": function.get("name"), "arguments": jsonable(arguments)}


def _images(records: list[dict], message_images: list[list], images: list) -> tuple[list[dict], list]:
    """Number images in message order (the token order, so the ids tools use); pixels are what the model saw."""
    entries: list[dict] = []
    pixels: list[Image.Image | None] = []
    for record, found in zip(records, message_images, strict=True):
        for item in found:
            image_id = len(entries) + 1
            image = images[image_id - 1] if image_id <= len(images) else item
            image = image if isinstance(image, Image.Image) else None
            record["image_ids"].append(image_id)
            entries.append(
                {
                    "id": image_id,
                    "source": _image_source(record),
                    "turn": record["turn"],
                    "width": image.width if image else None,
                    "height": image.height if image else None,
                    "file": None,
                    "thumb": None,
                }
            )
            pixels.append(image)
    return entries, pixels


def video_entry(path: str | None, times_s: list[float], width: int, height: int, strip: list[float]) -> dict:
    """A video of the record but its id: its file (None: given as frames), its frames' times and shown size, and
    the times of its strip's frames (their thumbnails are written with the record)."""
    times = [round(float(time), 3) for time in times_s]
    shown = [{"time_s": round(float(time), 3), "thumb": None} for time in strip]
    return {
        "source": "prompt",
        "turn": 0,
        "path": path,
        "times_s": times,
        "width": width,
        "height": height,
        "strip": shown,
    }


def _videos(records: list[dict], messages: list[dict], videos: list[dict]) -> list[dict]:
    """Number the messages' videos in order (``video_ids``); an entry for each (``videos``, in that order)."""
    entries: list[dict] = []
    for record, message in zip(records, messages, strict=False):
        content = message.get("content")
        for item in content if isinstance(content, list) else ():
            if is_video_entry(item):
                video_id = len(entries) + 1
                record.setdefault("video_ids", []).append(video_id)
                known = videos[video_id - 1] if video_id <= len(videos) else video_entry(None, [], 1, 1, [])
                # where it was shown: the prompt, or the tool message answering turn j (a ``clip``)
                entries.append({"id": video_id, **known, "source": _image_source(record), "turn": record["turn"]})
    return entries


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
            calls.append(
                {
                    "turn": message["turn"],
                    "name": call["name"],
                    "arguments": call["arguments"],
                    "result": answer["text"] if answer else None,
                    "error": bool(answer and answer["error"]),
                    "image_ids": list(answer["image_ids"]) if answer else [],
                }
            )
    return calls


def _turns(turns: list[TurnRecord], samples: list[SampleRecord]) -> list[dict]:
    records = []
    for index, turn in enumerate(turns):
        following = turns[index + 1] if index + 1 < len(turns) else None
        sample_end = len(samples[turn.sample].response_mask)
        next_start = following.span[0] if following is not None and following.sample == turn.sample else sample_end
        start, end = turn.span
        records.append(
            {
                "turn": index + 1,
                "prompt_tokens": turn.prompt_tokens,
                "trained_tokens": end - start,
                "context_tokens_after": next_start - end,
                "tool_calls": list(turn.tool_calls),
                "images_added": list(turn.images_added),
                "reward": turn.reward,
                "sample": turn.sample,
                "weight_versions": list(turn.weight_versions) if turn.weight_versions is not None else None,
            }
        )
    return records


def _samples(samples: list[SampleRecord], turns: list[TurnRecord]) -> list[dict]:
    return [
        {
            "sample": index,
            "turns": [number for number, turn in enumerate(turns, 1) if turn.sample == index],
            "prompt_tokens": sample.prompt_tokens,
            "response_tokens": len(sample.response_mask),
            "trained_tokens": int(sum(sample.response_mask)),
            "images": sample.images,
            "images_left_out": sample.images_left_out,
        }
        for index, sample in enumerate(samples)
    ]


def _mask_summary(samples: list[SampleRecord]) -> dict:
    response = sum(len(sample.response_mask) for sample in samples)
    trained = int(sum(sum(sample.response_mask) for sample in samples))
    return {
        "prompt_tokens": sum(sample.prompt_tokens for sample in samples),
        "response_tokens": response,
        "trained_tokens": trained,
        "context_tokens": response - trained,
    }


def _stats(extra_fields: dict) -> dict:
    stats = {key: extra_fields[key] for key in STATS_KEYS if key in extra_fields}
    for key, value in extra_fields.items():
        if key.startswith(PREFIX) and key not in (SampleFields.key("dump"), SampleFields.key("judge_context")):
            stats[key.removeprefix(PREFIX)] = value
    return jsonable(stats)


def sample_ids(sample: dict) -> dict:
    extra_info = sample.get("extra_info")
    extra_info = extra_info if isinstance(extra_info, dict) else {}
    reward_model = sample.get("reward_model")
    return jsonable(
        {
            "index": sample.get("index", extra_info.get("index")),
            "uid": sample.get("uid"),
            "data_source": sample.get("data_source"),
            "ground_truth": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            "extra_info": extra_info,
        }
    )


def jsonable(value: object) -> Any:
    """Plain JSON types: numpy scalars and arrays unwrapped, anything else (an image, say) as a short repr."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)[:200]


def trajectory_name(record: dict) -> str:
    """The name a person sees for a trajectory: "step 3 · sample #5 · rollout 2" ("validation step 3 ..."), falling
    back to the dump id's first 8 characters for what it does not know."""
    parts = []
    if record.get("step") is not None:
        parts.append(f"{'validation step' if record.get('validate') else 'step'} {record['step']}")
    index = (record.get("sample") or {}).get("index")
    if index is not None:
        parts.append(f"sample #{index}")
    if record.get("rollout_n") is not None:
        parts.append(f"rollout {record['rollout_n']}")
    return " · ".join(parts) or f"trajectory {str(record.get('id', ''))[:8]}"


def tools_used(record: dict) -> list[str]:
    """The record's ``tools_used``: its names that are text (a record written by others may hold anything there)."""
    names = record.get("tools_used")
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []
