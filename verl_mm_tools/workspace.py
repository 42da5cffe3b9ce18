"""The image workspace of one trajectory: every image gets a stable 1-based id in arrival order.

Ids count the prompt's images first, then every image a tool or environment added, in exactly the order their
placeholder tokens appear in the token stream. The workspace wraps the trajectory's image list by reference
(``agent_data.image_data`` in verl), so appending here is appending there. No verl import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from verl_mm_tools.errors import ToolInputError
from verl_mm_tools.files import STATE_ATTR, FileRoots
from verl_mm_tools.video import VideoSource


class ImageWorkspace:
    """Stable ids over a trajectory's image list (1 = first prompt image)."""

    def __init__(self, images: list[Image.Image] | None = None):
        self.images: list[Image.Image] = images if images is not None else []

    def __len__(self) -> int:
        return len(self.images)

    @property
    def latest_id(self) -> int | None:
        return len(self.images) or None

    @property
    def next_id(self) -> int:
        """The id the next added image will get."""
        return len(self.images) + 1

    def add(self, image: Image.Image) -> int:
        self.images.append(image)
        return len(self.images)

    def truncate(self, count: int) -> None:
        """Forget every image after the first ``count`` (used to roll back a tool turn that was dropped)."""
        del self.images[count:]

    def get(self, image_id: int | None = None) -> Image.Image:
        """The image with this id (None: the latest). Raises ToolInputError with a message for the model."""
        if not self.images:
            raise ToolInputError("there is no image in this conversation yet, so there is nothing to operate on")
        if image_id is None:
            return self.images[-1]
        if isinstance(image_id, bool) or not isinstance(image_id, int):
            raise ToolInputError(f"image_id must be an integer image number, got {image_id!r}")
        if not 1 <= image_id <= len(self.images):
            raise ToolInputError(f"image_id must be between 1 and {len(self.images)}, got {image_id}")
        return self.images[image_id - 1]


@dataclass
class ToolContext:
    """What a tool may use of its trajectory, attached to an AgentData-like object where no mm_tool loop runs (a
    remote tool's host, tests); the loop attaches its ``TrajectoryState``, which has the same two attributes."""

    workspace: ImageWorkspace
    files: FileRoots
    videos: list[VideoSource] = field(default_factory=list)  # the prompt's videos: Video 1 is the first


def attach_tool_context(agent_data: object, context: object) -> None:
    """Attach a ``ToolContext`` (or the loop's ``TrajectoryState``) to verl's AgentData."""
    setattr(agent_data, STATE_ATTR, context)


def workspace_of(agent_data: Any) -> ImageWorkspace:  # what verl hands a tool (its kwargs are Any), or None
    """The workspace of a verl AgentData: the mm_tool loop's own, or (under verl's plain ``tool_agent`` loop) a
    view over ``agent_data.image_data`` so tools still resolve ids there."""
    workspace = getattr(getattr(agent_data, STATE_ATTR, None), "workspace", None)
    if workspace is not None:
        return workspace
    images = getattr(agent_data, "image_data", None)
    if images is None:
        images = []
        if agent_data is not None:
            agent_data.image_data = images
    return ImageWorkspace(images)


def videos_of(agent_data: Any) -> list[VideoSource]:  # what verl hands a tool (its kwargs are Any), or None
    """The prompt's videos of a trajectory, as the mm_tool loop checked them (none under other loops)."""
    videos = getattr(getattr(agent_data, STATE_ATTR, None), "videos", None)
    return videos if isinstance(videos, list) else []
