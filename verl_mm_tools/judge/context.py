"""What a judge sees of a trajectory besides the answer: the question and images, handed from the loop to the reward
worker on the trajectory's final sample (``SampleFields.judge_context``).

The loop picks the images (``ImageChoice``, its ``judge_images`` option): every prompt image, plus the tool images
chosen, each as lossless PNG bytes under its id in the conversation ("Image 3"), so the judge sees the pixels the
policy saw. Pure (PIL only): the loop, the reward function and rescore share it.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["ImageChoice", "ImageOrigin", "JudgeContext", "JudgeImage", "named_image_ids", "prompt_question"]

# "Image 3", "image #3", "Image3" in the answer: the ids the loop's tool answers give images ("Image 3: ...")
_NAMED_IMAGE = re.compile(r"\bimage\s*#?\s*(\d{1,4})\b", re.IGNORECASE)


class ImageOrigin(str, Enum):
    PROMPT = "prompt"
    TOOL = "tool"  # added by a tool or an environment turn


@dataclass(frozen=True)
class JudgeImage:
    image_id: int  # its id in the conversation: 1 is the first prompt image
    origin: ImageOrigin
    png: bytes

    @classmethod
    def of(cls, image_id: int, origin: ImageOrigin, image: Image.Image) -> JudgeImage:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return cls(image_id, origin, buffer.getvalue())

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.png).hexdigest()


@dataclass(frozen=True)
class JudgeContext:
    question: str  # the text of the dataset prompt's user messages
    images: tuple[JudgeImage, ...]


_MEDIA_MARKERS = ("<image>", "<video>")  # verl datasets' markers of where a prompt's media go


def prompt_question(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the dataset prompt's user messages, their media markers removed."""
    texts: list[str] = []
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        parts = (
            [content]
            if isinstance(content, str)
            else [
                part.get("text", "") for part in content or [] if isinstance(part, dict) and part.get("type") == "text"
            ]
        )
        texts.extend(str(part) for part in parts)
    question = "\n".join(texts)
    for marker in _MEDIA_MARKERS:
        question = question.replace(marker, "")
    return question.strip()


def named_image_ids(text: str) -> set[int]:
    """The image ids ``text`` names ("Image 3", "image #3")."""
    return {int(match.group(1)) for match in _NAMED_IMAGE.finditer(text)}


@dataclass(frozen=True)
class ImageChoice:
    """Which tool images a judge sees besides the prompt's: ``all``, ``none``, ``named`` (those the final answer
    names, "Image 3"), or ``last:N`` (the last N). Parsed from the loop's ``judge_images`` option."""

    kind: str
    count: int = 0

    KINDS = ("all", "none", "named", "last")

    @classmethod
    def parse(cls, value: str) -> ImageChoice:
        if not isinstance(value, str):
            raise ConfigError(f"mm_tool judge_images must be all, none, named or last:N, got {value!r}")
        kind, _, count = value.strip().partition(":")
        if kind == "last":
            if not count.isdigit() or int(count) < 1:
                raise ConfigError(f"mm_tool judge_images last:N needs a whole N >= 1, got {value!r}")
            return cls(kind, int(count))
        if kind not in cls.KINDS or count:
            raise ConfigError(f"mm_tool judge_images must be all, none, named or last:N, got {value!r}")
        return cls(kind)

    def tool_image_ids(self, tool_ids: Sequence[int], answer: str) -> list[int]:
        """The chosen ones of the trajectory's tool image ids (in order), given the final answer's text."""
        if self.kind == "all":
            return list(tool_ids)
        if self.kind == "last":
            return list(tool_ids[-self.count :])
        if self.kind == "named":
            named = named_image_ids(answer)
            return [image_id for image_id in tool_ids if image_id in named]
        return []

    def context(self, question: str, images: Sequence[Image.Image], prompt_images: int, answer: str) -> JudgeContext:
        """The judge's view of a trajectory whose images are ``images`` (the first ``prompt_images`` the prompt's)."""
        tool_ids = list(range(prompt_images + 1, len(images) + 1))
        chosen = [*range(1, prompt_images + 1), *self.tool_image_ids(tool_ids, answer)]
        return JudgeContext(
            question=question,
            images=tuple(
                JudgeImage.of(
                    image_id,
                    ImageOrigin.PROMPT if image_id <= prompt_images else ImageOrigin.TOOL,
                    images[image_id - 1],
                )
                for image_id in chosen
            ),
        )
