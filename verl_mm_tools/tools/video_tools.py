"""``get_frames``: look closer at a window of one of the conversation's videos, frame by frame, as images.

The prompt's videos reach the model at qwen-vl-utils' sampling (2 fps by default, resized to its token bounds), so
a moment shorter than the gap between two sampled frames is never seen. ``get_frames(video_id, start_s, end_s, n)``
returns ``n`` frames spread evenly over ``[start_s, end_s]`` (both ends included; one frame: ``start_s``) at the
video's own resolution bounded by ``max_pixels``, each an image with its own id, so every model family can read them
(a frame is an image to the processor). Videos are the prompt's, checked by the mm_tool loop (``Video 1`` is the
first); under another loop there are none and the call is answered as text. Invalid arguments are answered as text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from verl_mm_tools.errors import ConfigError, ToolInputError, VideoInputError
from verl_mm_tools.ops.argument_checks import show
from verl_mm_tools.ops.geometry import fit_pixels
from verl_mm_tools.ops.transform import as_rgb
from verl_mm_tools.tools.base import ImageToolConfig, SchemaFunctionTool
from verl_mm_tools.video import VideoSource
from verl_mm_tools.workspace import videos_of, workspace_of

logger = logging.getLogger(__name__)

MAX_FRAMES_PER_CALL = 32


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


class GetFramesTool(SchemaFunctionTool):
    """verl's ``BaseTool`` for ``get_frames`` (config: ``max_frames``, ``max_pixels`` per frame)."""

    schema_fn = get_frames
    example_arguments = {"video_id": 1, "start_s": 0.0, "end_s": 1.0, "n": 2}

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None):
        self.config = dict(config or {})
        self.settings = GetFramesConfig.from_dict(self.config)
        self._set_schema(tool_schema)

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs.get("agent_data")
        try:
            arguments = self.arguments.parse(parameters)
            video = _video(videos_of(agent_data), arguments["video_id"])
            # reading the header, seeking and decoding: off the event loop the trajectories share
            times, frames = await asyncio.to_thread(self._window, video, arguments)
        except (ToolInputError, VideoInputError) as error:
            return self._refuse(str(error))
        except Exception as error:  # logged; the model must get an answer, never an exception
            logger.exception("%s failed on arguments %s", self.name, show(parameters))
            return self._refuse(f"the tool failed internally ({type(error).__name__}); try other arguments")
        images = [fit_pixels(as_rgb(frame), self.settings.max_pixels) for frame in frames]
        first, video_id = workspace_of(agent_data).next_id, arguments["video_id"]
        shown = " ".join(
            f"Image {first + index}: Video {video_id} at {time:.2f} s." for index, time in enumerate(times)
        )
        text = f"{shown} ({images[0].width}x{images[0].height} px)"
        return ToolResponse(image=images, text=text), 0.0, {}

    def _window(self, video: VideoSource, arguments: dict[str, Any]) -> tuple[list[float], list[Any]]:
        """The times of the frames asked for and the frames."""
        times = self._times(video, arguments["start_s"], arguments["end_s"], arguments["n"])
        return times, video.images([video.frame_at(time) for time in times])

    def _times(self, video: VideoSource, start_s: float, end_s: float, n: int) -> list[float]:
        limit = self.settings.max_frames
        if not 1 <= n <= limit:
            raise ToolInputError(f"n must be between 1 and {limit}, got {n}")
        duration = video.duration_s
        if not 0 <= start_s < duration:
            raise ToolInputError(f"start_s must be at least 0 and less than the video's {duration:g} s, got {start_s}")
        if end_s <= start_s:
            raise ToolInputError(f"end_s must be greater than start_s={start_s}, got {end_s}")
        end_s = min(end_s, duration)
        if n == 1:
            return [start_s]
        return [start_s + (end_s - start_s) * index / (n - 1) for index in range(n)]

    def _refuse(self, message: str) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text=f"Error from {self.name}: {message}"), 0.0, {"error": message}


def _video(videos: list[VideoSource], video_id: int) -> VideoSource:
    if not videos:
        raise ToolInputError("there is no video in this conversation, so there are no frames to get")
    if not 1 <= video_id <= len(videos):
        raise ToolInputError(f"video_id must be between 1 and {len(videos)}, got {video_id}")
    return videos[video_id - 1]
