"""The type and range of every field of a trajectory record (``record.py`` describes them): a record is data that
someone else wrote, so nothing downstream (``export-sft``, ``rescore``, ``view``) may meet a string where a reward
was, a negative count, a non-finite number or an image id that names no image. Pure: no verl, no torch.

``check_fields`` raises a ``FieldError`` saying which field is wrong and what it holds; keys a version does not
have may be absent (every field but ``format``, ``version``, ``id``, ``messages`` and ``images`` is optional)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

ID_PATTERN = re.compile(r"[0-9A-Za-z_-]{1,128}")  # ids name site pages and copy folders: no path characters
SHOWN_CHARS = 60
REWARD_LIMIT = 1e9  # a reward beyond it is no reward function's: reports square and sum them


class FieldError(ValueError):
    """A record field of the wrong type or out of range."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _fail(where: str, expected: str, value: object) -> FieldError:
    return FieldError(f"field {where} must be {expected}, found {_shown(value)}")


def count(value: object, where: str, minimum: int = 0, optional: bool = True) -> None:
    """A whole number at least ``minimum`` (bool is not a number here)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(where, f"a whole number >= {minimum}", value)


def number(value: object, where: str, optional: bool = True) -> None:
    """A finite number, a reward's size at most (``REWARD_LIMIT``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, "a finite number", value)
    if abs(value) > REWARD_LIMIT:
        raise _fail(where, f"a number from -{REWARD_LIMIT:g} to {REWARD_LIMIT:g}", value)


def text(value: object, where: str, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise _fail(where, "a string", value)


def flag(value: object, where: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise _fail(where, "true, false or null", value)


def mapping(value: object, where: str, optional: bool = True) -> dict:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def items(value: object, where: str, optional: bool = True) -> list:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise _fail(where, "a list", value)
    return value


def each(value: object, where: str, check: Callable[[object, str], None], optional: bool = True) -> None:
    for position, item in enumerate(items(value, where, optional)):
        check(item, f"{where}[{position}]")


def finite_everywhere(value: object, where: str = "record") -> None:
    """No NaN or infinity anywhere (JSON as Python writes it allows them; no report can average them)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(where, "a finite number", value)
    if isinstance(value, dict):
        for key, item in value.items():
            finite_everywhere(item, f"{where}.{key}")
    elif isinstance(value, list):
        for position, item in enumerate(value):
            finite_everywhere(item, f"{where}[{position}]")


def check_fields(record: dict) -> None:
    """Every field of ``record`` (format and version already read) of its type and in its range."""
    finite_everywhere(record)
    if not isinstance(record.get("id"), str) or not ID_PATTERN.fullmatch(record["id"]):
        raise _fail("id", "1 to 128 letters, digits, '_' or '-'", record.get("id"))
    for key in ("request_id", "model", "stop_reason", "error"):
        text(record.get(key), key)
    count(record.get("step"), "step")
    count(record.get("rollout_n"), "rollout_n")
    flag(record.get("validate"), "validate")
    flag(record.get("masked"), "masked")
    for key in ("stats", "timing", "rescored"):
        mapping(record.get(key), key)
    _sample(record.get("sample"))
    images = items(record.get("images"), "images", optional=False)
    for position, image in enumerate(images):
        _image(image, position)
    image_count = len(images)
    videos = items(record.get("videos"), "videos")
    for position, video in enumerate(videos):
        _video(video, position)
    for position, message in enumerate(items(record.get("messages"), "messages", optional=False)):
        _message(message, f"messages[{position}]", image_count)
        for at, video_id in enumerate(items(message.get("video_ids"), f"messages[{position}].video_ids")):
            count(video_id, f"messages[{position}].video_ids[{at}]", minimum=1, optional=False)
            if video_id > len(videos):
                raise _fail(f"messages[{position}].video_ids[{at}]", f"a video id from 1 to {len(videos)}", video_id)
    for position, call in enumerate(items(record.get("tool_calls"), "tool_calls")):
        _tool_call(call, f"tool_calls[{position}]", image_count)
    each(record.get("tools_used"), "tools_used", text)
    for position, turn in enumerate(items(record.get("turns"), "turns")):
        _turn(turn, f"turns[{position}]", image_count)
    for position, sample in enumerate(items(record.get("samples"), "samples")):
        _training_sample(sample, f"samples[{position}]", image_count)
    _chat(record.get("chat"), image_count, len(videos))
    for key, value in mapping(record.get("mask"), "mask").items():
        count(value, f"mask.{key}")
    for key in ("reward", "reward_before"):
        _reward(record.get(key), key)


def _sample(value: object) -> None:
    sample = mapping(value, "sample")
    index = sample.get("index")
    if index is not None and not isinstance(index, str):
        count(index, "sample.index")
    uid = sample.get("uid")
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, (str, int))):
        raise _fail("sample.uid", "a string, a whole number or null", uid)
    text(sample.get("data_source"), "sample.data_source")
    mapping(sample.get("extra_info"), "sample.extra_info")


def _image_id(value: object, where: str, image_count: int) -> None:
    count(value, where, minimum=1, optional=False)
    if isinstance(value, int) and value > image_count:  # an int once counted
        raise _fail(where, f"an image id from 1 to {image_count}", value)


def _image(value: object, position: int) -> None:
    where = f"images[{position}]"
    image = mapping(value, where, optional=False)
    if image.get("id") != position + 1 or isinstance(image.get("id"), bool):
        raise _fail(f"{where}.id", f"{position + 1} (images are numbered in order)", image.get("id"))
    text(image.get("source"), f"{where}.source", optional=False)
    count(image.get("turn"), f"{where}.turn", optional=False)
    count(image.get("width"), f"{where}.width", minimum=1)
    count(image.get("height"), f"{where}.height", minimum=1)
    text(image.get("file"), f"{where}.file")
    text(image.get("thumb"), f"{where}.thumb")


MAX_VIDEO_FRAMES = 768  # qwen-vl-utils' most frames sampled
MAX_STRIP_FRAMES = 32


def _video(value: object, position: int) -> None:
    where = f"videos[{position}]"
    video = mapping(value, where, optional=False)
    if video.get("id") != position + 1 or isinstance(video.get("id"), bool):
        raise _fail(f"{where}.id", f"{position + 1} (videos are numbered in order)", video.get("id"))
    text(video.get("source"), f"{where}.source", optional=False)
    count(video.get("turn"), f"{where}.turn", optional=False)
    text(video.get("path"), f"{where}.path")
    times = items(video.get("times_s"), f"{where}.times_s", optional=False)
    if len(times) > MAX_VIDEO_FRAMES:
        raise _fail(f"{where}.times_s", f"at most {MAX_VIDEO_FRAMES} frames", f"{len(times)} frames")
    each(times, f"{where}.times_s", lambda time, at: number(time, at, optional=False))
    count(video.get("width"), f"{where}.width", minimum=1)
    count(video.get("height"), f"{where}.height", minimum=1)
    strip = items(video.get("strip"), f"{where}.strip")
    if len(strip) > MAX_STRIP_FRAMES:
        raise _fail(f"{where}.strip", f"at most {MAX_STRIP_FRAMES} frames", f"{len(strip)} frames")
    for position, shown in enumerate(strip):
        frame = mapping(shown, f"{where}.strip[{position}]", optional=False)
        number(frame.get("time_s"), f"{where}.strip[{position}].time_s", optional=False)
        text(frame.get("thumb"), f"{where}.strip[{position}].thumb")


def _message(value: object, where: str, image_count: int) -> None:
    message = mapping(value, where, optional=False)
    text(message.get("role"), f"{where}.role", optional=False)
    count(message.get("turn"), f"{where}.turn", optional=False)
    text(message.get("text"), f"{where}.text", optional=False)
    for position, image_id in enumerate(items(message.get("image_ids"), f"{where}.image_ids")):
        _image_id(image_id, f"{where}.image_ids[{position}]", image_count)
    for position, call in enumerate(items(message.get("tool_calls"), f"{where}.tool_calls")):
        text(mapping(call, f"{where}.tool_calls[{position}]", optional=False).get("name"), f"{where}.name")
    flag(message.get("error"), f"{where}.error")
    text(message.get("note"), f"{where}.note")


def _tool_call(value: object, where: str, image_count: int) -> None:
    call = mapping(value, where, optional=False)
    count(call.get("turn"), f"{where}.turn", optional=False)
    text(call.get("name"), f"{where}.name")
    text(call.get("result"), f"{where}.result")
    flag(call.get("error"), f"{where}.error")
    for position, image_id in enumerate(items(call.get("image_ids"), f"{where}.image_ids")):
        _image_id(image_id, f"{where}.image_ids[{position}]", image_count)


def _turn(value: object, where: str, image_count: int) -> None:
    turn = mapping(value, where, optional=False)
    count(turn.get("turn"), f"{where}.turn", minimum=1, optional=False)
    count(turn.get("trained_tokens"), f"{where}.trained_tokens", optional=False)
    count(turn.get("context_tokens_after"), f"{where}.context_tokens_after", optional=False)
    for key in ("prompt_tokens", "sample"):  # version 1 and 2 records lack them
        count(turn.get(key), f"{where}.{key}")
    each(turn.get("tool_calls"), f"{where}.tool_calls", text)
    for position, image_id in enumerate(items(turn.get("images_added"), f"{where}.images_added")):
        _image_id(image_id, f"{where}.images_added[{position}]", image_count)
    number(turn.get("reward"), f"{where}.reward")
    _weight_versions(turn.get("weight_versions"), f"{where}.weight_versions")


def _weight_versions(value: object, where: str) -> None:
    """Version 5 on: null, or the [first, last] weight versions of the turn's generation."""
    if value is None:
        return
    if not isinstance(value, list) or len(value) != 2:
        raise _fail(where, "null or [first, last] weight versions", value)
    count(value[0], f"{where}[0]", optional=False)
    count(value[1], f"{where}[1]", minimum=value[0], optional=False)


def _training_sample(value: object, where: str, image_count: int) -> None:
    sample = mapping(value, where, optional=False)
    for key in ("sample", "prompt_tokens", "response_tokens", "trained_tokens", "images"):
        count(sample.get(key), f"{where}.{key}", optional=False)
    left_out = sample.get("images_left_out")  # version 6 on
    count(left_out, f"{where}.images_left_out")
    if isinstance(left_out, int) and left_out + sample["images"] > image_count:
        most = image_count - sample["images"]
        raise _fail(f"{where}.images_left_out", f"at most {most} (the record's images less the sample's)", left_out)
    each(sample.get("turns"), f"{where}.turns", lambda turn, at: count(turn, at, minimum=1, optional=False))


def _chat(value: object, image_count: int, video_count: int) -> None:
    chat = mapping(value, "chat")
    for position, message in enumerate(items(chat.get("messages"), "chat.messages", optional=not chat)):
        where = f"chat.messages[{position}]"
        text(mapping(message, where, optional=False).get("role"), f"{where}.role", optional=False)
        _chat_extras(message, where)
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        for part_at, part in enumerate(items(content, f"{where}.content")):
            _chat_part(part, f"{where}.content[{part_at}]", image_count, video_count)
    items(chat.get("tools"), "chat.tools")
    mapping(chat.get("template_kwargs"), "chat.template_kwargs")


def _chat_extras(message: dict, where: str) -> None:
    """The template's keys beside ``content`` (``tool_calls``, ``name``, ...): plain values, and tool calls as
    ``{"function": {"name", "arguments"}}``, so every record's rows fit one SFT table."""
    for key, value in message.items():
        if key == "content":
            continue
        if key == "tool_calls":
            for position, call in enumerate(items(value, f"{where}.tool_calls")):
                function = mapping(mapping(call, f"{where}.tool_calls[{position}]", False).get("function"), "", False)
                text(function.get("name"), f"{where}.tool_calls[{position}].function.name", optional=False)
        elif value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise _fail(f"{where}.{key}", "a string, a number or null", value)


def _chat_part(value: object, where: str, image_count: int, video_count: int) -> None:
    part = mapping(value, where, optional=False)
    if part.get("type") == "image":
        _image_id(part.get("image_id"), f"{where}.image_id", image_count)
    elif part.get("type") == "video":  # version 8 on
        count(part.get("video_id"), f"{where}.video_id", minimum=1, optional=False)
        if part["video_id"] > video_count:
            raise _fail(f"{where}.video_id", f"a video id from 1 to {video_count}", part["video_id"])
    elif part.get("type") == "text":
        text(part.get("text"), f"{where}.text", optional=False)
    else:
        raise _fail(f"{where}.type", "'text', 'image' or 'video'", part.get("type"))


def _reward(value: object, where: str) -> None:
    reward = mapping(value, where)
    number(reward.get("score"), f"{where}.score")
    each(reward.get("turn_rewards"), f"{where}.turn_rewards", lambda item, at: number(item, at, optional=False))
    mapping(reward.get("extra"), f"{where}.extra")
