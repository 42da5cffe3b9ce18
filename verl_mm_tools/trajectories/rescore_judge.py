"""What a judge sees of a recorded trajectory (``rescore --judge``): the ``JudgeContext`` the mm_tool loop hands a
judge reward in training and eval (``agent_loop.judge_view``), rebuilt from the record.

- the question: the text of the prompt's user messages in the record's rendered conversation (``chat``, before the
  first assistant message), joined as the loop joins the dataset prompt's (``judge.context.prompt_question``: the
  record keeps the prompt's text parts as the loop had them);
- the images: the record's PNGs (the pixels the model saw) in id order, its prompt images (``source`` prompt, ids 1
  to P) always, its tool and environment images as the ``ImageChoice`` chooses them with the final answer's text;
  only the chosen ones are read.

A record is untrusted: an image without a file, a file that no longer decodes, or prompt images that are not the
first ids is a RecordError naming the record, which costs that record only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from PIL import Image

from verl_mm_tools.judge.context import ImageChoice, JudgeContext, prompt_question
from verl_mm_tools.record import RecordError
from verl_mm_tools.trajectories.read import LoadedRecord

__all__ = ["record_judge_context", "record_question"]


def record_judge_context(item: LoadedRecord, choice: ImageChoice, answer: str) -> JudgeContext:
    """The judge's view of the recorded trajectory whose final answer is ``answer`` (as the loop decoded it)."""
    images, prompt_images = _record_images(item)
    return choice.context(record_question(item.record["chat"]), images, prompt_images, answer)


def record_question(chat: dict) -> str:
    """The text of the prompt's user messages in a record's ``chat`` (the messages before the first assistant
    one), media markers removed, as the loop reads the dataset prompt."""
    messages = chat.get("messages") or []
    first_answer = next(
        (index for index, message in enumerate(messages) if message.get("role") == "assistant"), len(messages)
    )
    return prompt_question(messages[:first_answer])


def _record_images(item: LoadedRecord) -> tuple[_RecordImages, int]:
    """The record's images in id order (decoded from its checked PNGs when the judge sees them), and how many are
    the prompt's."""
    entries = sorted(item.record.get("images") or [], key=lambda entry: entry["id"])
    if [entry["id"] for entry in entries] != list(range(1, len(entries) + 1)):
        raise RecordError(f"{item.path}: its image ids are not 1 to {len(entries)}: the judge's images are unknown")
    prompt_images = sum(entry.get("source") == "prompt" for entry in entries)
    if any(entry.get("source") == "prompt" for entry in entries[prompt_images:]):
        raise RecordError(f"{item.path}: its prompt images are not its first ones: the judge's images are unknown")
    return _RecordImages(item, len(entries)), prompt_images


class _RecordImages(Sequence[Image.Image]):
    """A record's images by position (image id - 1), each decoded when asked for: the judge reads only those it
    sees."""

    def __init__(self, item: LoadedRecord, count: int):
        self.item, self.size = item, count

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> Image.Image: ...
    @overload
    def __getitem__(self, index: slice) -> list[Image.Image]: ...
    def __getitem__(self, index: int | slice) -> Image.Image | list[Image.Image]:
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(self.size))]
        if not -self.size <= index < self.size:
            raise IndexError(f"image position {index} of {self.size}")
        return _decoded(self.item, index % self.size + 1)


def _decoded(item: LoadedRecord, image_id: int) -> Image.Image:
    path = item.image_file(image_id)  # a RecordError when the record has no file for it
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise RecordError(
            f"{item.path}: image {image_id}'s file {path} cannot be read for the judge "
            f"({type(error).__name__}: {error})"
        ) from None
