"""``get_frames`` and ``clip``: look closer at a window of one of the conversation's videos.

The prompt's videos reach the model at qwen-vl-utils' sampling (2 fps by default, resized to its token bounds), so
a moment shorter than the gap between two sampled frames is never seen. ``get_frames(video_id, start_s, end_s, n)``
returns ``n`` frames spread evenly over ``[start_s, end_s]`` (both ends included; one frame: ``start_s``) at the
video's own resolution bounded by ``max_pixels``, each an image with its own id, so every model family can read them
(a frame is an image to the processor). Videos are the prompt's, checked by the mm_tool loop (``Video 1`` is the
first); under another loop there are none and the call is answered as text. Invalid arguments are answered as text.

``clip(video_id, start_s, end_s, fps)`` returns the window as a video: its frames sampled at ``fps`` as
qwen-vl-utils samples a prompt video's range (at least 2 frames, an even count, at most ``max_frames``; the frame
indices spread with ``linspace``), at the video's resolution bounded by ``max_pixels``, in verl's video form
(``ToolResponse(video=[(frames, metadata)])``: float32 T x C x H x W frames of whole numbers 0-255, and the metadata
Qwen's processors time them by: ``fps``, ``frames_indices``, ``total_num_frames``). The mm_tool loop shows it as the
conversation's next video where the model's family renders a video in a tool's answer, and says so by name where it
does not (``agent_loop/tool_videos.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from verl_mm_tools.errors import ConfigError, ToolInputError, VideoInputError
from verl_mm_tools.ops.argument_checks import show
from verl_mm_tools.ops.geometry import fit_pixels
from verl_mm_tools.ops.transform import as_rgb
from verl_mm_tools.tools.base import ImageToolConfig, SchemaFunctionTool
from verl_mm_tools.video import BACKEND, VideoSource
from verl_mm_tools.workspace import videos_of, workspace_of

logger = logging.getLogger(__name__)

MAX_FRAMES_PER_CALL = 32
MAX_CLIP_FPS = 60.0


def get_frames(video_id: int, start_s: float, end_s: float, n: int = 4) -> None:
    """Look closer at part of a video: returns n frames spread evenly from start_s to end_s, each as an image.

    Args:
        video_id: Number of the video (Video 1 is the first video of the conversation).
        start_s: Start of the window in seconds from the video's start.
        end_s: End of the window in seconds (greater than start_s; at most the video's length).
        n: How many frames to return, at least 1.
    """


@dataclasses.dataclass(frozen=True)
class GetFramesConfig(ImageToolConfig):
    max_frames: int = 8  # frames one call may return

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.max_frames <= MAX_FRAMES_PER_CALL:
            raise ConfigError(f"max_frames must be between 1 and {MAX_FRAMES_PER_CALL}, got {self.max_frames}")


class VideoWindowTool(SchemaFunctionTool):
    """A tool that reads a window of one of the conversation's videos: the call is checked, the video found and read
    off the event loop (``read``), then answered (``answer``); bad calls are answered as text."""

    config_cls: ClassVar[type[ImageToolConfig]]

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None):
        self.config = dict(config or {})
        self.settings: Any = self.config_cls.from_dict(self.config)
        self._set_schema(tool_schema)

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs.get("agent_data")
        try:
            arguments = self.arguments.parse(parameters)
            videos = videos_of(agent_data)
            video = _video(videos, arguments["video_id"])
            # reading the header, seeking and decoding: off the event loop the trajectories share
            read = await asyncio.to_thread(self.read, video, arguments)
        except (ToolInputError, VideoInputError) as error:
            return self._refuse(str(error))
        except Exception as error:  # logged; the model must get an answer, never an exception
            logger.exception("%s failed on arguments %s", self.name, show(parameters))
            return self._refuse(f"the tool failed internally ({type(error).__name__}); try other arguments")
        return self.answer(read, arguments, videos, agent_data)

    def read(self, video: VideoSource, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement read(video, arguments)")

    def answer(
        self, read: Any, arguments: dict[str, Any], videos: list[VideoSource], agent_data: Any
    ) -> tuple[ToolResponse, float, dict]:
        raise NotImplementedError(f"{type(self).__name__} must implement answer(read, arguments, videos, agent_data)")


def _checked_window(video: VideoSource, start_s: float, end_s: float) -> float:
    """The window's end within the video; ``ToolInputError`` for a start outside it or an end before the start."""
    duration = video.duration_s
    if not 0 <= start_s < duration:
        raise ToolInputError(f"start_s must be at least 0 and less than the video's {duration:g} s, got {start_s}")
    if end_s <= start_s:
        raise ToolInputError(f"end_s must be greater than start_s={start_s}, got {end_s}")
    return min(end_s, duration)


class GetFramesTool(VideoWindowTool):
    """verl's ``BaseTool`` for ``get_frames`` (config: ``max_frames``, ``max_pixels`` per frame)."""

    schema_fn = get_frames
    config_cls = GetFramesConfig
    example_arguments = {"video_id": 1, "start_s": 0.0, "end_s": 1.0, "n": 2}

    def answer(
        self, read: Any, arguments: dict[str, Any], videos: list[VideoSource], agent_data: Any
    ) -> tuple[ToolResponse, float, dict]:
        times, frames = read
        images = [fit_pixels(as_rgb(frame), self.settings.max_pixels) for frame in frames]
        first, video_id = workspace_of(agent_data).next_id, arguments["video_id"]
        shown = " ".join(
            f"Image {first + index}: Video {video_id} at {time:.2f} s." for index, time in enumerate(times)
        )
        text = f"{shown} ({images[0].width}x{images[0].height} px)"
        return ToolResponse(image=images, text=text), 0.0, {}

    def read(self, video: VideoSource, arguments: dict[str, Any]) -> tuple[list[float], list[Any]]:
        """The times of the frames asked for and the frames."""
        times = self._times(video, arguments["start_s"], arguments["end_s"], arguments["n"])
        return times, video.images([video.frame_at(time) for time in times])

    def _times(self, video: VideoSource, start_s: float, end_s: float, n: int) -> list[float]:
        limit = self.settings.max_frames
        if not 1 <= n <= limit:
            raise ToolInputError(f"n must be between 1 and {limit}, got {n}")
        end_s = _checked_window(video, start_s, end_s)
        if n == 1:
            return [start_s]
        return [start_s + (end_s - start_s) * index / (n - 1) for index in range(n)]


def clip(video_id: int, start_s: float, end_s: float, fps: float = 2.0) -> None:
    """Watch part of a video as a video: returns the frames from start_s to end_s sampled at fps, as a new video.

    Args:
        video_id: Number of the video (Video 1 is the first video of the conversation).
        start_s: Start of the window in seconds from the video's start.
        end_s: End of the window in seconds (greater than start_s; at most the video's length).
        fps: Frames per second to sample the window at (at least 2 frames are returned).
    """


@dataclasses.dataclass(frozen=True)
class ClipConfig(ImageToolConfig):
    max_frames: int = 16  # frames one clip may hold

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= self.max_frames <= MAX_FRAMES_PER_CALL:
            raise ConfigError(f"max_frames must be between 2 and {MAX_FRAMES_PER_CALL}, got {self.max_frames}")


@dataclasses.dataclass(frozen=True)
class ClipWindow:
    """The frames a clip samples: their indices in the video, the frames in the window, the video's rate."""

    indices: list[int]
    window_frames: int
    video_fps: float

    @property
    def times(self) -> list[float]:
        return [index / self.video_fps for index in self.indices]

    def metadata(self) -> dict[str, Any]:
        """qwen-vl-utils' video metadata: the processors time the frames by index / fps and sample them at
        ``len(indices) / total_num_frames * fps``."""
        return {
            "fps": self.video_fps,
            "frames_indices": list(self.indices),
            "total_num_frames": self.window_frames,
            "video_backend": BACKEND,
        }


class ClipTool(VideoWindowTool):
    """verl's ``BaseTool`` for ``clip`` (config: ``max_frames``, ``max_pixels`` per frame)."""

    schema_fn = clip
    config_cls = ClipConfig
    example_arguments = {"video_id": 1, "start_s": 0.0, "end_s": 1.5, "fps": 2.0}
    answers_with = "video"  # check_tool checks its answer as a video, not images

    def answer(
        self, read: Any, arguments: dict[str, Any], videos: list[VideoSource], agent_data: Any
    ) -> tuple[ToolResponse, float, dict]:
        window, frames = read
        text = clip_text(len(videos) + 1, arguments["video_id"], window, frames.shape[-1], frames.shape[-2])
        return ToolResponse(video=[(frames, window.metadata())], text=text), 0.0, {}

    def read(self, video: VideoSource, arguments: dict[str, Any]) -> tuple[ClipWindow, Any]:
        """The window's sampling and its frames as a float32 T x C x H x W tensor (qwen-vl-utils' form)."""
        import numpy as np
        import torch

        window = self._window(video, arguments["start_s"], arguments["end_s"], arguments["fps"])
        images = [fit_pixels(as_rgb(frame), self.settings.max_pixels) for frame in video.images(window.indices)]
        frames = np.stack([np.asarray(image, dtype=np.uint8) for image in images])
        return window, torch.from_numpy(frames).permute(0, 3, 1, 2).float()

    def _window(self, video: VideoSource, start_s: float, end_s: float, fps: float) -> ClipWindow:
        if not 0 < fps <= MAX_CLIP_FPS:
            raise ToolInputError(f"fps must be greater than 0 and at most {MAX_CLIP_FPS:g}, got {fps}")
        end, video_fps = _checked_window(video, start_s, end_s), video.fps_of
        first = math.ceil(start_s * video_fps)  # qwen-vl-utils' range (calculate_video_frame_range)
        last = min(math.floor(end * video_fps), video.frame_count - 1)
        window_frames = last - first + 1
        if window_frames < 2:
            raise ToolInputError(
                f"the window {start_s:g}-{end_s:g} s holds {max(window_frames, 0)} frame(s) of the video "
                f"({video_fps:g} fps); a clip needs 2 or more: widen the window"
            )
        wanted = window_frames / video_fps * fps
        frames = min(max(2, int(wanted) // 2 * 2), window_frames // 2 * 2)  # an even count, as qwen-vl-utils'
        if frames > self.settings.max_frames:
            raise ToolInputError(
                f"{end_s - start_s:g} s at fps={fps:g} is {frames} frames, more than the {self.settings.max_frames} "
                "a clip may hold: lower fps or shorten the window"
            )
        step = (last - first) / (frames - 1)
        return ClipWindow([round(first + step * k) for k in range(frames)], window_frames, video_fps)


def clip_text(new_id: int, video_id: int, window: ClipWindow, width: int, height: int) -> str:
    """What the model reads with a clip: its id, the window and the times of its frames."""
    times = window.times
    shown = ", ".join(f"{time:.2f}" for time in times)
    return (
        f"Video {new_id}: Video {video_id} from {times[0]:.2f} to {times[-1]:.2f} s, {len(times)} frames at "
        f"{shown} s ({width}x{height} px)"
    )


def _video(videos: list[VideoSource], video_id: int) -> VideoSource:
    if not videos:
        raise ToolInputError("there is no video in this conversation, so there are no frames to get")
    if not 1 <= video_id <= len(videos):
        raise ToolInputError(f"video_id must be between 1 and {len(videos)}, got {video_id}")
    return videos[video_id - 1]
