"""A record's prompt videos as entries of verl's multi-turn SFT rows (``export-sft --video-root``).

A record keeps, for each prompt video, the file the loop read, the time of each frame sampled (``times_s``) and the
frames' size as the processor showed them, not the sampling keys of the prompt. A row's entry asks qwen-vl-utils for
exactly those frames: ``nframes`` (their count), ``video_start`` / ``video_end`` (a quarter frame before the first
and after the last, so the range holds the same frames and its frame count, which Qwen's processors time the video
by, is the loop's) and ``resized_height`` / ``resized_width`` (the recorded size); verl's SFT dataset reads it with
this package's fix (``adaptations/fixes/sft_video_sampling.py``). Records are untrusted: a video is named only if its
file resolves inside ``--video-root`` (no symlink out), can be read as a video, the entry passes the loop's own
checks of sampling keys (``agent_loop.prompt_videos``), and the file, probed again, samples the recorded times. A
record with a video that fails is skipped, counted under the reason (``VideoRefused``), and logged with the detail. A
record holding a tool's video (a ``clip``'s answer) is skipped under ``TOOL_VIDEO``: a row names prompt video files
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from verl_mm_tools.agent_loop.prompt_videos import safe_video_item
from verl_mm_tools.errors import ConfigError, FileAccessError, VideoInputError
from verl_mm_tools.files import FileRoots
from verl_mm_tools.trajectories.read import LoadedRecord
from verl_mm_tools.video import VideoInfo, probe_video, sampled_indices

TOOL_VIDEO = "a tool answered it with a video (clip): SFT rows name prompt video files only"
NO_ROOT = "its prompt holds videos: give --video-root (the folder their files are under) to export them"
AS_FRAMES = "its prompt's video was given as frames, not a file (SFT rows name video files)"
OUTSIDE = "its video's file is outside --video-root"
MISSING = "its video's file is missing"
UNREADABLE = "its video's file cannot be read as a video"
BAD_SAMPLING = "its video's recorded frames are not ones a row may ask for"
OTHER_TIMES = "its video's file now samples other frames than the record's times_s"
NO_PROCESSOR = "its model's processor, which shows the video's size, cannot be loaded"
OTHER_SIZE = "its video's recorded frame size is not the one its model's processor shows"
ROW_KEYS = ("video", "nframes", "video_start", "video_end")
TIME_DECIMALS = 3  # the record's times_s are rounded so (record.video_entry)


class VideoRefused(Exception):
    """A record's video no row may name: ``reason`` is what the export counts, the message says what was found."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class VideoRows:
    """The checks of records' videos against the files under ``roots`` (``--video-root``; None: not given), with
    each model's processor loaded once."""

    roots: FileRoots | None
    processors: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def under(cls, video_root: Path | None) -> VideoRows:
        """A ConfigError when ``video_root`` is given but no folder."""
        if video_root is None:
            return cls(None)
        if not video_root.is_dir():
            raise ConfigError(
                f"--video-root {str(video_root)!r} is not an existing folder; give the folder the videos are under"
            )
        return cls(FileRoots.from_config(video_root.absolute()))

    def of(self, item: LoadedRecord) -> list[dict]:
        """The record's videos, in order, as row entries; ``VideoRefused`` when one cannot be."""
        videos = item.record.get("videos") or []
        if not videos:
            return []
        answered = [video.get("id") for video in videos if video.get("source") == "tool"]
        if answered:
            raise VideoRefused(TOOL_VIDEO, f"{item.path}, video(s) {answered}")
        if self.roots is None:
            raise VideoRefused(NO_ROOT, str(item.path))
        return [self._entry(item, video, self.roots, f"{item.path}, video {video.get('id')}") for video in videos]

    def _entry(self, item: LoadedRecord, video: dict, roots: FileRoots, name: str) -> dict:
        if video.get("path") is None:
            raise VideoRefused(AS_FRAMES, name)
        real = _file_inside(video["path"], roots, name)
        try:
            info = probe_video(real, source=f"{name} ({real})")
        except VideoInputError as error:
            raise VideoRefused(UNREADABLE, str(error)) from None
        try:
            entry = safe_video_item(sampling_entry(str(real), video, info), roots, name, _no_frames)
        except VideoInputError as error:
            raise VideoRefused(BAD_SAMPLING, str(error)) from None
        except FileAccessError as error:  # the file changed since it was resolved
            raise VideoRefused(OUTSIDE, str(error)) from None
        _check_times(entry, video, info, name)
        self._check_size(item, entry, video, name)
        return {key: entry[key] for key in ROW_KEYS}

    def _check_size(self, item: LoadedRecord, entry: dict, video: dict, name: str) -> None:
        """The model's processor shows the entry's frames (qwen-vl-utils' default size) at the recorded size."""
        processor = self._processor(str(item.record.get("model")), name)
        shown = shown_size(processor, entry)
        if shown != (video.get("width"), video.get("height")):
            raise VideoRefused(
                OTHER_SIZE,
                f"{name}: recorded as {video.get('width')}x{video.get('height')} px, but {item.record.get('model')}'s "
                f"processor shows the file's frames at {shown[0]}x{shown[1]} px (a prompt whose video entry asked "
                "for a size, min_pixels or max_pixels, which the record does not keep, or a changed record)",
            )

    def _processor(self, model: str, name: str) -> Any:
        if model not in self.processors:
            from transformers import AutoProcessor

            try:
                self.processors[model] = AutoProcessor.from_pretrained(model)
            except (OSError, ValueError) as error:
                raise VideoRefused(NO_PROCESSOR, f"{name}: {model!r}: {error}") from None
        return self.processors[model]


def shown_size(processor: Any, entry: dict) -> tuple[int, int]:
    """(width, height) at which ``processor`` shows the frames qwen-vl-utils samples for ``entry``, as the loop and
    verl's SFT dataset call them (the frames decoded and resized as there)."""
    from qwen_vl_utils import fetch_video

    from verl_mm_tools.tokens import video_frame_sizes

    frames, metadata = fetch_video(
        entry, image_patch_size=processor.image_processor.patch_size, return_video_metadata=True
    )
    grids = processor.video_processor(
        videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt"
    )["video_grid_thw"]
    ((width, height),) = video_frame_sizes(processor, grids)
    return width, height


def _file_inside(path: str, roots: FileRoots, name: str) -> Path:
    try:
        real = roots.confined(path)
    except FileAccessError as error:
        raise VideoRefused(OUTSIDE, f"{name}: {error}") from None
    if not real.is_file():
        raise VideoRefused(MISSING, f"{name}: {str(real)!r} is not a file")
    return real


def sampling_entry(path: str, video: dict, info: VideoInfo) -> dict:
    """The qwen-vl-utils entry that samples the recorded frames of the file at ``path`` (``info``: its header)."""
    times = video.get("times_s") or []
    indices = [round(float(time) * info.fps) for time in times] or [0]
    return {
        "video": path,
        "nframes": len(times),
        "video_start": max(0.0, round((indices[0] - 0.25) / info.fps, 6)),
        "video_end": round((indices[-1] + 0.25) / info.fps, 6),
    }


def _check_times(entry: dict, video: dict, info: VideoInfo, name: str) -> None:
    """The entry, sampled from the file as it is now, gives the recorded times."""
    try:
        indices, _ = sampled_indices(entry, info)
    except ValueError as error:
        raise VideoRefused(BAD_SAMPLING, f"{name}: {error}") from None
    times = [round(index / info.fps, TIME_DECIMALS) for index in indices]
    recorded = [round(float(time), TIME_DECIMALS) for time in video.get("times_s") or []]
    if times != recorded:
        raise VideoRefused(
            OTHER_TIMES,
            f"{name}: the record's times_s {_shown(recorded)} but {entry['video']} ({info.frames} frames at "
            f"{info.fps:g} fps) samples {_shown(times)}: the file changed since the rollout; export the record with "
            "the file it was recorded with",
        )


def _shown(times: list[float]) -> str:
    return str(times) if len(times) <= 8 else f"[{times[0]}, {times[1]}, ..., {times[-1]}] ({len(times)})"


def _no_frames(frame: object, name: str) -> Image.Image:
    raise VideoInputError(f"{name}: a video given as frames has no file to name")
