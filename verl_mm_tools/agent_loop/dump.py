"""Opt-in trajectory dumps of the mm_tool loop, read by ``verl-mm-tools view``.

Each half of a trajectory is known to a different process, so a dump is written in two phases:

1. the loop (``stage_trajectory``, in the agent-loop worker) knows the messages, images, tokens and mask. It writes
   every image (PNG, exactly the pixels the model saw, plus a JPEG thumbnail) and a record without step or rewards
   to ``<dump_dir>/_staging/<id>/`` and puts a small reference in ``extra_fields["mm_tool/dump"]``;
2. the trainer side (``step_hook.dump.finalize_step_dumps``, called by ``step_hook.step.process_step`` from
   verl-mm-tools' v1 replay buffer or classic manager) knows the step and the rewards. It moves the first
   ``dump_max_per_step`` staged trajectories of the batch (batch order, so whole GRPO groups stay together) to
   ``<dump_dir>/step_<NNNNNN>/<id>/`` (``val_step_<NNNNNN>`` for validation), completes their records, deletes the
   others, and stops dumping for good once the dump holds ``dump_max_mb`` (it then writes ``<dump_dir>/_FULL``, which
   the loops check so they stop writing images too). What was skipped is counted in ``step_<NNNNNN>/_step.json``
   (``written``, ``per_step_cap``, ``disk_cap``, ``error``: staging failed, ``not_found``: the driver cannot see the
   workers' staged folder) and in the step metrics ``mm_tool/dump/*``, and logged once per reason.

``dump_dir`` is resolved to an absolute path by the loop; on several nodes it must be on a file system the rollout
workers and the trainer's driver share. A failing dump never costs a trajectory or stops training.

A finished trajectory is ``<step dir>/<id>/trajectory.json`` plus ``images/<image id>.png`` and
``images/<image id>.thumb.jpg``, and ``videos/<video id>_<k>.thumb.jpg`` for each prompt video's strip of frames; the
record's keys: ``verl_mm_tools.record``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from PIL import Image

from verl_mm_tools.agent_loop.context import LoopContext
from verl_mm_tools.agent_loop.export import rendered_history
from verl_mm_tools.agent_loop.state import TrajectoryState, state_of
from verl_mm_tools.handoff import SampleFields, StopReason
from verl_mm_tools.record import (
    FULL_MARKER,
    STAGED_RECORD_FILE,
    STAGING_DIR,
    SampleRecord,
    TurnRecord,
    build_record,
    chat_record,
    sample_ids,
    video_entry,
)

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.agent_data import LoopAgentData
    from verl_mm_tools.agent_loop.loop_output import MMToolOutput

logger = logging.getLogger(__name__)

THUMBNAIL_SIZE = (160, 160)
STRIP_FRAMES = 8  # a video's frames shown in its record's strip, spread over the frames the model saw


# ----- phase 1: the loop stages one trajectory (phase 2: step_hook/dump.py) -----------------------------------------


async def stage_trajectory(
    context: LoopContext, agent_data: LoopAgentData | None, outputs: list[MMToolOutput], sample: dict
) -> dict:
    """Stage one finished trajectory of the loop of ``context``, its training samples ``outputs`` (the final one
    last); returns the reference for the final output's ``extra_fields``.

    A dump must never cost a trajectory: any failure here is logged and reported in the reference instead."""
    config = context.options
    # Absolute, so the manager (another process, maybe another working directory) finds the same folder.
    dump_dir = Path(cast(str, config.dump_dir)).expanduser().resolve()  # the loop stages only with a dump_dir
    reference = {
        "dump_dir": str(dump_dir),
        "max_per_step": config.dump_max_per_step,
        "max_mb": config.dump_max_mb,
        "sample_index": sample_ids(sample)["index"],
    }
    if (dump_dir / FULL_MARKER).exists():
        return {**reference, "skipped": "disk_cap"}
    try:
        record, images, strips = _loop_record(context, agent_data, outputs, sample)
        # Encoding images is the slow part: off the event loop, which other trajectories share.
        written = await asyncio.to_thread(write_staged, dump_dir, record, images, strips)
    except Exception as error:
        logger.warning("mm_tool dump: could not stage a trajectory under %s", dump_dir, exc_info=True)
        return {**reference, "skipped": "error", "error": f"{type(error).__name__}: {error}"}
    return {**reference, **written}


def _loop_record(
    context: LoopContext, agent_data: LoopAgentData | None, outputs: list[MMToolOutput], sample: dict
) -> tuple[dict, list, list]:
    """The record, its images and its videos' strip frames."""
    videos, strips = _video_entries(agent_data, state_of(agent_data))
    record, images = _loop_record_images(context, agent_data, outputs, sample, videos)
    return record, images, strips


def _loop_record_images(
    context: LoopContext, agent_data: LoopAgentData | None, outputs: list[MMToolOutput], sample: dict, videos: list
) -> tuple[dict, list]:
    messages = list(getattr(agent_data, "messages", None) or sample.get("raw_prompt") or [])
    state = state_of(agent_data)
    images = list(getattr(agent_data, "image_data", None) or [])
    output = outputs[-1]
    return build_record(
        messages=messages,
        images=images,
        samples=[
            SampleRecord(
                len(o.prompt_ids), tuple(o.response_mask), len((o.multi_modal_data or {}).get("images") or []), left_out
            )
            for o, left_out in zip(outputs, _images_left_out(state, len(outputs)), strict=True)
        ],
        turns=_turn_records(agent_data, outputs, lambda ids: context.decode(ids, skip_special_tokens=True)),
        extra_fields=output.extra_fields,
        sample=sample,
        model=context.model_path,
        request_id=getattr(agent_data, "request_id", None),
        timing=output.metrics.model_dump() if hasattr(output.metrics, "model_dump") else dict(output.metrics or {}),
        # a state is attached to agent data only
        chat=_chat(context, agent_data, state) if agent_data is not None and state is not None and messages else None,
        videos=videos,
    )


def _video_entries(
    agent_data: LoopAgentData | None, state: TrajectoryState | None
) -> tuple[list[dict], list[list[Image.Image]]]:
    """The prompt's videos as the model saw them (the frames qwen-vl-utils sampled: verl's (frames, metadata), at
    the size the processor showed them), and each one's strip frames (qwen-vl-utils' resize, before the processor's)."""
    sampled = getattr(agent_data, "video_data", None) or []
    sources = state.videos if state is not None else []
    sizes = state.video_sizes if state is not None else []
    entries, strips = [], []
    for index, (frames, metadata) in enumerate(sampled):
        fps = float(metadata.get("fps") or 1.0)
        times = [float(frame) / fps for frame in metadata.get("frames_indices", [])]
        path = sources[index].path if index < len(sources) else None
        width, height = sizes[index] if index < len(sizes) else (int(frames.shape[-1]), int(frames.shape[-2]))
        picks = _spread(len(frames), STRIP_FRAMES)
        entries.append(video_entry(path, times, width, height, [times[pick] for pick in picks if pick < len(times)]))
        strips.append([_frame_image(frames[pick]) for pick in picks if pick < len(times)])
    return entries, strips


def _spread(count: int, most: int) -> list[int]:
    """At most ``most`` indices of ``count`` spread evenly, first and last included."""
    if count <= most:
        return list(range(count))
    return [round(position * (count - 1) / (most - 1)) for position in range(most)]


def _frame_image(frame: object) -> Image.Image:
    """A frame of verl's video tensor (C x H x W, 0-255, float after qwen-vl-utils' resize) as an RGB image."""
    import numpy as np

    pixels = np.asarray(frame, dtype=np.float32).clip(0, 255).round().astype(np.uint8)
    return Image.fromarray(pixels.transpose(1, 2, 0))


def _images_left_out(state: TrajectoryState | None, outputs: int) -> list[int]:
    """Each output's images the window left out (``keep_last_images``); none for a masked trajectory's stand-in."""
    if state is None or state.stats.masked:
        return [0] * outputs
    return [cut.first_image for cut in state.samples] + [state.first_image]


def _chat(context: LoopContext, agent_data: LoopAgentData, state: TrajectoryState) -> dict:
    schemas = getattr(agent_data, "_active_tool_schemas", None) or []
    return chat_record(
        rendered_history(context, agent_data, state) + _final_turn_outside_messages(state),
        context.tool_format.template_tools(schemas),
        context.apply_chat_template_kwargs,
    )


def _final_turn_outside_messages(state: TrajectoryState) -> list[dict]:
    """The last turn when it is a finished message verl never added: generated at max_assistant_turns or
    max_user_turns, where verl stops before parsing it (an answer there is the trajectory's answer). A turn cut by
    the length limit is no finished message and stays out."""
    last = state.turns[-1] if state.turns else None
    finished = state.stop_reason in (StopReason.ANSWERED, StopReason.TURN_LIMIT)
    if last is None or last.message is not None or not finished:
        return []
    return [{"role": "assistant", "content": last.text}]


def _turn_records(
    agent_data: LoopAgentData | None, outputs: list[MMToolOutput], decode: Callable[[list[int]], str]
) -> list[TurnRecord]:
    """The turns the loop recorded that the outputs hold, with their spans in their own sample's response."""
    state = state_of(agent_data)
    turns = state.output_turns if state is not None else []
    records = []
    for index, output in enumerate(outputs):
        spans = output.extra_fields.get(SampleFields.key("turn_spans")) or []
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
                    (turn.versions.first, turn.versions.last) if turn.versions is not None else None,
                )
            )
    return records


def write_staged(dump_dir: str | os.PathLike, record: dict, images: list, strips: list | None = None) -> dict:
    """Write the images, the videos' strip frames and the record under ``<dump_dir>/_staging/<id>/``; returns
    ``id``, ``dir`` and ``bytes``."""
    folder = Path(dump_dir) / STAGING_DIR / record["id"]
    (folder / "images").mkdir(parents=True)
    for entry, image in zip(record["images"], images, strict=True):
        if image is not None:
            entry["file"], entry["thumb"] = _write_image(folder, entry["id"], image)
    for video, frames in zip(record.get("videos") or [], strips or [], strict=False):
        for position, (shown, frame) in enumerate(zip(video["strip"], frames, strict=True)):
            shown["thumb"] = _write_thumbnail(folder, f"videos/{video['id']}_{position + 1}.thumb.jpg", frame)
    write_json(folder / STAGED_RECORD_FILE, record)
    return {"id": record["id"], "dir": str(folder), "bytes": folder_bytes(folder)}


def _write_image(folder: Path, image_id: int, image: Image.Image) -> tuple[str, str]:
    file = f"images/{image_id}.png"
    image.save(folder / file, format="PNG")
    return file, _write_thumbnail(folder, f"images/{image_id}.thumb.jpg", image)


def _write_thumbnail(folder: Path, name: str, image: Image.Image) -> str:
    (folder / name).parent.mkdir(exist_ok=True)
    small = image.convert("RGB")
    small.thumbnail(THUMBNAIL_SIZE)
    small.save(folder / name, format="JPEG", quality=80)
    return name


def write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(temporary, path)  # a reader never sees half a record


def folder_bytes(folder: str | os.PathLike[str], skip: frozenset[str] = frozenset()) -> int:
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
