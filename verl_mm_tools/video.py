"""Untrusted video files read with PyAV (its wheels carry FFmpeg: no ffmpeg binary or system library needed).

``probe_video`` reads a file's header only: its first video stream's size, frame rate, frame count and duration, each
checked (no video stream, zero frames, a frame over ``MAX_DECODE_PIXELS``, longer than ``MAX_DURATION_S``: a
``VideoInputError`` that names the file). ``decode_frames`` decodes only the frames asked for, by their index in the
stream, seeking over long gaps (a uniform sample of an hour-long video decodes a few frames per sample, not the hour),
and bounds memory: a frame over ``DECODE_MAX_PIXELS`` (above 1440p) is scaled down, aspect kept, while it is
converted (a 4K frame costs 25 MiB as RGB, and qwen-vl-utils samples up to 768 of them).

``read_video_sampled`` is qwen-vl-utils' reader contract (``VIDEO_READER_BACKENDS``): the frame range of
``video_start`` / ``video_end``, ``smart_nframes`` frames spread with ``linspace``, and the metadata Qwen's processors
read (``fps``, ``frames_indices``, ``total_num_frames``). ``write_video`` writes frames as H.264 in MP4 (the synthetic
clips of ``make-data video`` and the tests). No verl import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from verl_mm_tools.errors import VideoInputError
from verl_mm_tools.files import MAX_DECODE_PIXELS, is_url

if TYPE_CHECKING:
    import av.container
    import av.video.stream

MAX_DURATION_S = 4 * 3600.0
"""Longest video accepted (4 h); what the model sees of it is the budget's to bound (its frames times their tokens)."""
DECODE_MAX_PIXELS = 2560 * 1440
"""Frames above this (1440p) are scaled down while they are decoded; qwen-vl-utils then resizes to at most 768
tokens' worth (602,112 px at patch 14), so only videos above 1440p see a second resize."""
SEEK_GAP_S = 2.0
"""A wanted frame this far past the last decoded one is reached by seeking (to the keyframe before it)."""
BACKEND = "pyav"


@dataclass(frozen=True)
class VideoInfo:
    """A video file's first video stream as its header describes it."""

    source: str
    width: int
    height: int
    fps: float
    frames: int
    duration_s: float
    codec: str


def is_video_entry(item: object) -> bool:
    """What qwen-vl-utils takes for a video entry of a message's content."""
    return isinstance(item, dict) and ("video" in item or item.get("type") == "video")


@dataclass(frozen=True)
class VideoSource:
    """One of a trajectory's videos as a tool reads it: a checked file (``path``; its header read when first needed)
    or frames given as images (``frames``, shown ``fps`` apart: the entry's ``sample_fps``, as qwen-vl-utils reads
    it)."""

    path: str | None = None
    frames: tuple[Any, ...] = ()  # PIL images
    fps: float = 2.0

    @cached_property
    def info(self) -> VideoInfo | None:
        return probe_video(self.path) if self.path is not None else None

    @property
    def duration_s(self) -> float:
        return self.info.duration_s if self.info is not None else len(self.frames) / self.fps

    @property
    def fps_of(self) -> float:
        """The rate its frames are shown at: the file's, or the frames' ``fps``."""
        return self.info.fps if self.info is not None else self.fps

    @property
    def frame_count(self) -> int:
        return self.info.frames if self.info is not None else len(self.frames)

    def frame_at(self, seconds: float) -> int:
        """The index of the frame shown at ``seconds`` (clamped to the video)."""
        return min(self.frame_count - 1, max(0, int(seconds * self.fps_of)))

    def images(self, indices: list[int]) -> list[Any]:
        """The frames at ``indices`` as RGB PIL images (decoded from the file, bounded like every decode)."""
        from PIL import Image

        if self.path is None:
            return [self.frames[index] for index in indices]
        return [Image.fromarray(frame) for frame in decode_frames(self.path, indices)]


def probe_video(path: str | Path, *, source: str | None = None) -> VideoInfo:
    """The header of the video at ``path``, checked; ``source`` names it in errors (default: the path)."""
    name = source or str(path)
    with _opened(path, name) as container:
        return _stream_info(_video_stream(container, name), container, name)


def decode_frames(path: str | Path, indices: list[int], *, source: str | None = None) -> np.ndarray:
    """The frames at ``indices`` (ascending or not, repeats allowed) as a uint8 array (len(indices), H, W, 3)."""
    name = source or str(path)
    if not indices:
        raise VideoInputError(f"{name}: no frames asked for")
    with _opened(path, name) as container:
        stream = _video_stream(container, name)
        return _frames_at(container, stream, _stream_info(stream, container, name), indices, name)


def read_video_sampled(element: dict[str, Any]) -> tuple[Any, dict[str, Any], float]:
    """qwen-vl-utils' reader contract: (frames as a uint8 tensor T x C x H x W, metadata, the sampled fps)."""
    import torch

    path = str(element["video"]).removeprefix("file://")
    if is_url(path):
        raise VideoInputError(f"refused to fetch {path[:200]!r}: videos are read from local files only")
    with _opened(path, path) as container:
        stream = _video_stream(container, path)
        info = _stream_info(stream, container, path)
        indices, total = sampled_indices(element, info)
        frames = torch.from_numpy(_frames_at(container, stream, info, indices, path)).permute(0, 3, 1, 2)
    metadata = {"fps": info.fps, "frames_indices": indices, "total_num_frames": total, "video_backend": BACKEND}
    return frames, metadata, len(indices) / max(total, 1e-6) * info.fps


def sampled_indices(element: dict[str, Any], info: VideoInfo) -> tuple[list[int], int]:
    """The frames qwen-vl-utils samples of a video entry (``nframes`` or ``fps``, ``video_start``, ``video_end``) in
    a video ``info`` describes, by index, and the frames in its range; qwen-vl-utils' ValueError on a bad range."""
    import torch
    from qwen_vl_utils.vision_process import calculate_video_frame_range, smart_nframes

    start, end, total = calculate_video_frame_range(element, info.frames, info.fps)
    count = smart_nframes(element, total_frames=total, video_fps=info.fps)
    return torch.linspace(start, end, count).round().long().tolist(), total


def _frames_at(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    info: VideoInfo,
    indices: list[int],
    name: str,
) -> np.ndarray:
    wanted = sorted(set(indices))
    if wanted[0] < 0 or wanted[-1] >= info.frames:
        raise VideoInputError(
            f"{name}: frames {wanted[0]}..{wanted[-1]} asked for, but the video has {info.frames} (0.."
            f"{info.frames - 1})"
        )
    frames = _decode_wanted(container, stream, info, wanted, name)
    return np.stack([frames[index] for index in indices])


def _opened(path: str | Path, name: str) -> av.container.InputContainer:
    import av

    try:
        return av.open(str(path), mode="r", metadata_errors="replace")
    except (av.FFmpegError, OSError, UnicodeDecodeError) as error:
        raise VideoInputError(f"{name}: cannot be opened as a video ({type(error).__name__}: {error})") from None


def _video_stream(container: av.container.InputContainer, name: str) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise VideoInputError(f"{name}: holds no video stream (streams: {[s.type for s in container.streams]})")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return stream


def _stream_info(stream: av.video.stream.VideoStream, container: av.container.InputContainer, name: str) -> VideoInfo:
    width, height = stream.codec_context.width, stream.codec_context.height
    if width < 1 or height < 1 or width * height > MAX_DECODE_PIXELS:
        raise VideoInputError(f"{name}: {width}x{height} px frames are outside 1..{MAX_DECODE_PIXELS} px")
    rate = stream.average_rate or stream.guessed_rate
    fps = float(rate) if rate else 0.0
    if not math.isfinite(fps) or fps <= 0 or fps > 1000:
        raise VideoInputError(f"{name}: its frame rate {rate} is not a rate in (0, 1000] fps")
    duration_s = _duration_s(stream, container)
    frames = stream.frames or int(round(duration_s * fps))
    if frames < 1:
        raise VideoInputError(f"{name}: holds no frames")
    duration_s = duration_s or frames / fps
    if duration_s > MAX_DURATION_S:
        raise VideoInputError(f"{name}: {duration_s:.0f} s long, more than the {MAX_DURATION_S:.0f} s accepted")
    return VideoInfo(name, width, height, fps, frames, duration_s, stream.codec_context.name)


def _duration_s(stream: av.video.stream.VideoStream, container: av.container.InputContainer) -> float:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return container.duration / 1_000_000 if container.duration else 0.0


def _decode_wanted(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    info: VideoInfo,
    wanted: list[int],
    name: str,
) -> dict[int, np.ndarray]:
    """Decode forward from the start (or a seek before the next wanted frame) and keep the wanted frames; a frame's
    index is its presentation time times the rate (streams' timestamps, not the decode order)."""
    import av

    size = _decoded_size(info)
    first_pts = stream.start_time or 0
    base = float(stream.time_base) if stream.time_base else 1 / info.fps
    found: dict[int, np.ndarray] = {}
    position = -1  # the index of the last frame decoded
    pending, sought = list(wanted), set[int]()  # sought: the targets a seek was made for (it may land far before)
    try:
        while pending:
            if _worth_a_seek(pending[0], position, info.fps, sought):
                sought.add(pending[0])
                container.seek(first_pts + int(pending[0] / info.fps / base), stream=stream, backward=True)
            for frame in container.decode(stream):
                position = round(((frame.pts or 0) - first_pts) * base * info.fps)
                while pending and pending[0] <= position:
                    # a wanted index the stream skipped (variable rate) takes the next frame shown
                    found[pending.pop(0)] = frame.to_ndarray(format="rgb24", width=size[0], height=size[1])
                if not pending or _worth_a_seek(pending[0], position, info.fps, sought):
                    break
            else:
                break  # the stream ended
    except (av.FFmpegError, ValueError) as error:
        raise VideoInputError(f"{name}: cannot be decoded ({type(error).__name__}: {error})") from None
    if pending:
        raise VideoInputError(
            f"{name}: its header promises {info.frames} frames but frame {pending[0]} could not be decoded (the "
            f"stream ends or is damaged after frame {position})"
        )
    return found


def _worth_a_seek(target: int, position: int, fps: float, sought: set[int]) -> bool:
    return target - position > SEEK_GAP_S * fps and target not in sought


def _decoded_size(info: VideoInfo) -> tuple[int, int]:
    """The frame size decoded: the stream's, scaled down to DECODE_MAX_PIXELS (even sides) when above it."""
    pixels = info.width * info.height
    if pixels <= DECODE_MAX_PIXELS:
        return info.width, info.height
    scale = math.sqrt(DECODE_MAX_PIXELS / pixels)
    return max(2, int(info.width * scale) // 2 * 2), max(2, int(info.height * scale) // 2 * 2)


def write_video(path: str | Path, frames: Iterable[np.ndarray], fps: float | Fraction, *, crf: int = 12) -> Path:
    """Write uint8 RGB frames (H x W x 3, even sides) as H.264 (yuv420p) in an MP4 file at ``fps``; ``crf``: the
    quality (lower keeps colours closer; 12 keeps a flat colour within a few levels)."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = None
        for frame in frames:
            if stream is None:
                stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
                stream.height, stream.width = frame.shape[:2]
                stream.pix_fmt = "yuv420p"
                stream.options = {"crf": str(crf), "preset": "ultrafast"}
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        if stream is None:
            raise ValueError(f"write_video({path}): no frames given")
        for packet in stream.encode():
            container.mux(packet)
    return path
