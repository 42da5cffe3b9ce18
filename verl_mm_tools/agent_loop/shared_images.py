"""Each distinct image and prompt video once per prompt group in TransferQueue (issue #59, step 3): the v1 trainer's
samples refer to an image (or a video's frames) another sample of their group carries.

verl's v1 worker puts each trajectory's samples into TransferQueue in one put (``_agent_loop_postprocess``), and
TransferQueue stores and sends every tensor of every sample on its own: an image that ``export: per_turn`` shows
again in each later sample, or that a GRPO group's trajectories all read (the prompt image, and mostly the same
crops of it), was stored and read once per sample that shows it. A prompt group runs on one worker (verl's
``_run_prompt``), and its samples are taken into a batch, trained and cleared together (verl's replay buffer and
trainer). So within a group a sample can refer to an image another of its samples carries (``compact_image.ImageRef``):
the first sample of the group's puts to show it. The trainer's workers read the referred images where they are
(``adaptations/fixes/compact_images.py``).

The group's trajectories often finish together, and verl builds a put's samples, then awaits the put: a sample may
refer to a put still in flight. Such a put waits, once its own put is done, for the puts it refers to; if one of them
failed, nothing carries its images, and it fails too (its caller removes its samples). A failed put's images are
carried again by the group's later puts.

``GroupPut`` is one put (set by the fix ``adaptations/fixes/shared_images.py`` around verl's ``_agent_loop_postprocess``
with ``putting``, read by the sample-inputs fix ``adaptations/fixes/processed_images.py``); ``GROUPS`` holds each
group's carried images and puts. Outside a put (the classic trainer, fully async, ``eval``) every sample carries its
images: a pickle of a worker's output carries each distinct image once anyway (``compact_image.SharedPixels``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from verl_mm_tools.compact_form import Content, ImageRef, Ref, content_key
from verl_mm_tools.compact_image import CompactImages
from verl_mm_tools.compact_video import CompactVideos, VideoRef
from verl_mm_tools.errors import VerlMMToolsError

if TYPE_CHECKING:
    import torch

# groups whose records are kept (a worker runs far fewer groups at once; a record is a few strings per image)
KEPT_GROUPS = 4096


class ImagesLost(VerlMMToolsError, RuntimeError):
    """A put's samples refer to images of a put of their group that failed: nothing carries them. ``keys``: the
    samples to remove from TransferQueue's ``partition``."""

    def __init__(self, put: GroupPut, failed: list[GroupPut]) -> None:
        self.keys, self.partition = sorted(put.keys.values()), put.partition
        lost = sorted(key for each in failed for key in each.keys.values())
        super().__init__(
            f"the samples {self.keys} refer to images the samples {lost} carry, whose put into TransferQueue failed; "
            "they are removed and their trajectory fails (its group trains on the rest)"
        )


@dataclass(eq=False)
class GroupPut:
    """One trajectory's put of samples: its group (verl's prompt uid), TransferQueue partition, and each sample's key
    by the sample's output (verl's keys: ``{uid}_{session_id}_{index}``). ``refers_to``: the group's puts in flight
    that its samples refer to."""

    group: _Group
    partition: str
    keys: dict[int, str]  # id(output) -> key: the outputs live as long as the put
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failed: bool = False
    refers_to: set[GroupPut] = field(default_factory=set)
    # each image tensor's content, hashed once: the samples of a put share their images' tensors, and verl builds
    # each sample's inputs twice (its streamed reward, then the put); the store holds the tensors meanwhile
    _contents: dict[int, Content] = field(default_factory=dict)

    def referring(self, output: object, compact: CompactImages) -> CompactImages:
        """``compact`` with each image a sample of the group's puts showed first as a reference to it; the images it
        shows first are carried, and noted as carried here."""
        key = self.keys.get(id(output))
        return compact if key is None else CompactImages(compact.header, self._referred(key, compact.pixels, ImageRef))

    def referring_videos(self, output: object, compact: CompactVideos) -> CompactVideos:
        """``compact`` with each prompt video a sample of the group's puts showed first as a reference to it."""
        key = self.keys.get(id(output))
        return compact if key is None else CompactVideos(compact.header, self._referred(key, compact.frames, VideoRef))

    def _referred(
        self, key: str, tensors: Sequence[torch.Tensor | Ref], kind: type[Ref]
    ) -> tuple[torch.Tensor | Ref, ...]:
        """Each of the sample's tensors (under ``key``) as carried, or as a ``kind`` of reference to the put that
        carries it."""
        found: list[torch.Tensor | Ref] = []
        for index, pixels in enumerate(tensors):
            if isinstance(pixels, ImageRef):
                found.append(pixels)
                continue
            content = self._contents.get(id(pixels)) or self._contents.setdefault(id(pixels), content_key(pixels))
            owner, carrier = self.group.carrier(content, kind(self.partition, key, index, content), self)
            if (owner.key, owner.image) == (key, index):
                found.append(pixels)
                continue
            if carrier is not self and not carrier.done.is_set():
                self.refers_to.add(carrier)
            found.append(owner)  # type: ignore[arg-type]  # the content's owner was offered as a ``kind``
        return tuple(found)


class _Group:
    """A prompt group's images by content, each with the put that carries it."""

    def __init__(self) -> None:
        self.carriers: dict[Content, tuple[ImageRef, GroupPut]] = {}

    def carrier(self, content: Content, offered: ImageRef, put: GroupPut) -> tuple[ImageRef, GroupPut]:
        """The image's carrier: the first put to offer it (``offered``, by ``put``)."""
        return self.carriers.setdefault(content, (offered, put))

    def forget(self, put: GroupPut) -> None:
        """``put`` failed: the images it carried are carried again by later puts."""
        self.carriers = {content: pair for content, pair in self.carriers.items() if pair[1] is not put}


class GroupImages:
    """The prompt groups of this worker's puts, the last ``kept``."""

    def __init__(self, kept: int = KEPT_GROUPS) -> None:
        self._groups: OrderedDict[str, _Group] = OrderedDict()
        self._kept = kept
        self._lock = threading.Lock()

    def group(self, uid: str) -> _Group:
        with self._lock:
            group = self._groups.setdefault(uid, _Group())
            self._groups.move_to_end(uid)
            while len(self._groups) > self._kept:
                self._groups.popitem(last=False)
            return group


GROUPS = GroupImages()  # one per worker process: verl runs each prompt group on one worker
CURRENT_PUT: contextvars.ContextVar[GroupPut | None] = contextvars.ContextVar("vmt_current_put", default=None)


@contextlib.asynccontextmanager
async def putting(uid: str, session: object, partition: str, outputs: Sequence[object]) -> AsyncIterator[GroupPut]:
    """Within: the put of a trajectory's samples ``outputs`` (session ``session`` of prompt group ``uid``) into
    TransferQueue's ``partition``, under verl's keys ``{uid}_{session}_{index}``. After it, the puts its samples refer
    to are awaited; ``ImagesLost`` where one of them failed."""
    keys = {id(output): f"{uid}_{session}_{index}" for index, output in enumerate(outputs)}
    put = GroupPut(GROUPS.group(uid), partition, keys)
    token = CURRENT_PUT.set(put)
    try:
        try:
            yield put
        finally:
            CURRENT_PUT.reset(token)
        for carrier in put.refers_to:
            await carrier.done.wait()
        failed = [carrier for carrier in put.refers_to if carrier.failed]
        if failed:
            raise ImagesLost(put, failed)
    except BaseException:
        put.failed = True
        put.group.forget(put)
        raise
    finally:
        put.done.set()  # only now: a put referring to this one learns whether its images are carried
