"""The prompt's videos, made safe before verl reads them.

verl hands a sample's messages to qwen-vl-utils, which opens any path or fetches any URL a video entry names, and
takes its sampling keys as they come (``resized_height: 100000`` allocates 10^10 px per frame). Here each video entry
becomes one qwen-vl-utils reads without surprises, or the sample is refused with a ``VideoInputError`` (or
``FileAccessError``) naming it and the video:

- a path or ``file://`` URL is read through the file roots and probed (``verl_mm_tools.video``: a video stream,
  frames, at most 4 h); the entry then names the real path, which qwen-vl-utils decodes with the PyAV reader;
- a list of frames (images, paths or bytes) is checked frame by frame like a prompt image;
- the sampling keys qwen-vl-utils reads must be numbers in the ranges below, and a time range must hold a frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from PIL import Image

from verl_mm_tools.errors import FileAccessError, VideoInputError
from verl_mm_tools.files import FileRoots
from verl_mm_tools.video import VideoInfo, VideoSource, is_video_entry, probe_video

MAX_FRAMES = 768
"""qwen-vl-utils' own ceiling on sampled frames (FPS_MAX_FRAMES)."""
MAX_FRAME_PIXELS = 1024 * 1024
"""The largest frame size a row may ask for (``resized_height`` x ``resized_width``); qwen-vl-utils' own ceiling is
768 tokens a frame (602,112 px at patch 14)."""
MAX_FRAME_SIDE = 4096
# key: (smallest, largest, whole numbers only)
SAMPLING_KEYS: dict[str, tuple[float, float, bool]] = {
    "fps": (1e-3, 60.0, False),
    "nframes": (2, MAX_FRAMES, True),
    "min_frames": (1, MAX_FRAMES, True),
    "max_frames": (2, MAX_FRAMES, True),
    "video_start": (0.0, math.inf, False),
    "video_end": (0.0, math.inf, False),
    "min_pixels": (1, MAX_FRAME_PIXELS, True),
    "max_pixels": (1, MAX_FRAME_PIXELS, True),
    "total_pixels": (1, MAX_FRAMES * MAX_FRAME_PIXELS, True),
    "resized_height": (1, MAX_FRAME_SIDE, True),
    "resized_width": (1, MAX_FRAME_SIDE, True),
    "sample_fps": (1e-3, 60.0, False),
    "raw_fps": (1e-3, 1000.0, False),
}


def safe_video_item(item: dict, files: FileRoots, name: str, safe_frame: Callable[[object, str], Image.Image]) -> dict:
    """The entry with its video checked: a real path inside the roots, or frames each checked by ``safe_frame(frame,
    name)`` (as a prompt image); its sampling keys valid."""
    _check_sampling(item, name)
    source = item.get("video")
    if isinstance(source, (list, tuple)):
        if not source:
            raise VideoInputError(f"{name}: a video given as frames holds none")
        frames = [safe_frame(frame, f"{name}, frame {index + 1}") for index, frame in enumerate(source)]
        return {**item, "type": "video", "video": frames}
    if not isinstance(source, str):
        raise VideoInputError(f"{name}: expected a video path or a list of frames, got {type(source).__name__}")
    try:
        real = files.resolve(source)
    except FileAccessError as error:
        raise FileAccessError(f"{name}: {error}") from None
    _check_range(item, probe_video(real, source=f"{name} ({source})"), name)
    return {**item, "type": "video", "video": str(real)}


def _check_sampling(item: dict, name: str) -> None:
    for key, (smallest, largest, whole) in SAMPLING_KEYS.items():
        if key not in item:
            continue
        value = item[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not smallest <= value <= largest or (whole and value % 1):
            kind = "a whole number" if whole else "a number"
            raise VideoInputError(f"{name}: {key}={value!r} must be {kind} in [{smallest:g}, {largest:g}]")
    if "fps" in item and "nframes" in item:
        raise VideoInputError(f"{name}: give fps or nframes, not both (fps={item['fps']}, nframes={item['nframes']})")
    if item.get("resized_height", 1) * item.get("resized_width", 1) > MAX_FRAME_PIXELS:
        raise VideoInputError(
            f"{name}: resized_height x resized_width = {item['resized_height']} x {item['resized_width']} px is more "
            f"than the {MAX_FRAME_PIXELS} px a frame may have"
        )
    for low, high in (("min_frames", "max_frames"), ("min_pixels", "max_pixels"), ("video_start", "video_end")):
        if low in item and high in item and item[low] >= item[high]:
            raise VideoInputError(f"{name}: {low}={item[low]} must be less than {high}={item[high]}")


def _check_range(item: dict[str, Any], info: VideoInfo, name: str) -> None:
    """The asked time range holds frames, and enough for ``nframes``."""
    start = item.get("video_start", 0.0)
    if start >= info.duration_s:
        raise VideoInputError(f"{name}: video_start={start} s is at or after its end ({info.duration_s:g} s)")
    end = min(item.get("video_end", info.duration_s), info.duration_s)
    frames = min(info.frames, math.floor(end * info.fps) + 1) - math.ceil(start * info.fps)
    if frames < 2:
        raise VideoInputError(f"{name}: its {start:g}-{end:g} s hold {frames} frame(s); qwen-vl-utils needs 2 or more")
    if item.get("nframes", 0) > frames:
        raise VideoInputError(
            f"{name}: nframes={item['nframes']} asks for more frames than its {start:g}-{end:g} s hold ({frames})"
        )


def video_sources(messages: list[dict]) -> list[VideoSource]:
    """The checked video entries of ``messages`` (``safe_video_item``'s), in order, as tools read them."""
    sources = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for item in content if isinstance(content, list) else ():
            if not is_video_entry(item):
                continue
            if isinstance(item["video"], str):
                sources.append(VideoSource(path=item["video"]))
            else:
                sources.append(VideoSource(frames=tuple(item["video"]), fps=float(item.get("sample_fps", 2.0))))
    return sources
