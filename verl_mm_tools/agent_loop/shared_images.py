"""Each distinct image once per prompt group in TransferQueue (issue #59, step 3): the v1 trainer's samples refer to
an image another sample of their group carries.

verl's v1 worker puts each trajectory's samples into TransferQueue in one put (``_agent_loop_postprocess``), and
TransferQueue stores and sends every tensor of every sample on its own: an image that ``export: per_turn`` shows
again in each later sample, or that a GRPO group's trajectories all read (the prompt image, and mostly the same
crops of it), was stored and read once per sample that shows it. A prompt group runs on one worker (verl's
``_run_prompt``), and its samples are taken into a batch, trained and cleared together (verl's replay buffer and
trainer). So within a group a sample can refer to an image another of its samples carries (``compact_image.ImageRef``):
an earlier sample of the same put, or one of a put of the group that has completed. The trainer's workers read the
referred images where they are (``adaptations/fixes/compact_images.py``).

``GroupPut`` is one put in progress (set by the fix ``adaptations/fixes/shared_images.py`` around verl's
``_agent_loop_postprocess``, read by the sample-inputs fix ``adaptations/fixes/processed_images.py``); ``GROUPS``
holds what each group's completed puts carry. Outside a put (the classic trainer, fully async, ``eval``) every
sample carries its images: a pickle of a worker's output carries each distinct image once anyway
(``compact_image.SharedPixels``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from verl_mm_tools.compact_image import CompactImages, Content, ImageRef, content_key

if TYPE_CHECKING:
    import torch

# groups whose owners are kept (a worker runs far fewer groups at once; a group's entries are a few strings)
KEPT_GROUPS = 4096


class GroupImages:
    """Where the completed puts of this worker's prompt groups carry each image, by group and content."""

    def __init__(self, kept: int = KEPT_GROUPS) -> None:
        self._groups: OrderedDict[str, dict[Content, ImageRef]] = OrderedDict()
        self._kept = kept
        self._lock = threading.Lock()

    def owners(self, group: str) -> dict[Content, ImageRef]:
        with self._lock:
            return dict(self._groups.get(group, {}))

    def add(self, group: str, owners: dict[Content, ImageRef]) -> None:
        """The images a completed put of ``group`` carries (an image already carried keeps its first owner)."""
        with self._lock:
            kept = self._groups.setdefault(group, {})
            self._groups.move_to_end(group)
            for content, ref in owners.items():
                kept.setdefault(content, ref)
            while len(self._groups) > self._kept:
                self._groups.popitem(last=False)


GROUPS = GroupImages()  # one per worker process: verl runs each prompt group on one worker


@dataclass
class GroupPut:
    """One trajectory's put in progress: its group (verl's prompt uid), TransferQueue partition, and each sample's
    key by the sample's output (verl's keys: ``{uid}_{session_id}_{index}``). ``carried``: the images its samples
    carry so far, by content (the first sample showing an image carries it)."""

    group: str
    partition: str
    keys: dict[int, str]  # id(output) -> key: the outputs live as long as the put
    carried: dict[Content, ImageRef] = field(default_factory=dict)
    completed: dict[Content, ImageRef] = field(default_factory=dict)  # the group's completed puts', when it began

    def referring(self, output: object, compact: CompactImages) -> CompactImages:
        """``compact`` with each image that an earlier sample of this put, or of a completed put of the group,
        carries as a reference to it; images first shown here are carried (and noted as carried here)."""
        key = self.keys.get(id(output))
        if key is None:  # not one of this put's outputs
            return compact
        images: list[torch.Tensor | ImageRef] = []
        for index, pixels in enumerate(compact.pixels):
            if isinstance(pixels, ImageRef):
                images.append(pixels)
                continue
            content = content_key(pixels)
            owner = self.completed.get(content) or self.carried.setdefault(
                content, ImageRef(self.partition, key, index, content)
            )
            images.append(pixels if (owner.key, owner.image) == (key, index) else owner)
        return CompactImages(compact.header, tuple(images))


CURRENT_PUT: contextvars.ContextVar[GroupPut | None] = contextvars.ContextVar("vmt_current_put", default=None)


@contextlib.contextmanager
def putting(group: str, session: object, partition: str, outputs: Sequence[object]) -> Iterator[GroupPut]:
    """Within: the put of a trajectory's samples ``outputs`` (session ``session`` of prompt group ``group``) into
    TransferQueue's ``partition``, under verl's keys ``{group}_{session}_{index}``. On a normal exit the worker notes
    what the put carries for the group's later puts; a put that failed may have stored part of its samples, so
    nothing refers to them."""
    put = GroupPut(
        group=group,
        partition=partition,
        keys={id(output): f"{group}_{session}_{index}" for index, output in enumerate(outputs)},
        completed=GROUPS.owners(group),
    )
    token = CURRENT_PUT.set(put)
    try:
        yield put
    finally:
        CURRENT_PUT.reset(token)
    GROUPS.add(group, put.carried)
