"""What the compact forms of a sample's images (``compact_image``) and prompt videos (``compact_video``) share: their
errors, a processor as data (``ProcessorSpec``), identity by content, one tensor per distinct content in a process
(``SharedPixels``) and headers as UTF-8 JSON tensors (verl's ``multi_modal_inputs`` hold tensors only)."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from verl_mm_tools.errors import VerlMMToolsError

if TYPE_CHECKING:
    import torch
    from transformers import BaseImageProcessor

# an image processor's output for some images, without its pixel values or with them: tensors and lists, by key
Output = dict[str, Any]


VIDEO_PIXELS = "pixel_values_videos"  # a video processor's: a sample's video frames, never compact


class NotCompactable(ValueError):
    """This processor's output cannot be rebuilt from resized pixels here: keep its float output."""


class CompactImageError(VerlMMToolsError, ValueError):
    """A sample's compact images cannot be expanded exactly: the step stops rather than train on a guessed tensor."""


@dataclass(frozen=True)
class ProcessorSpec:
    """An image processor as its class name and its own config (``to_dict``, as JSON): what rebuilds the same
    processor in another process (``image_processor``)."""

    class_name: str
    config: str

    @classmethod
    def of(cls, image_processor: BaseImageProcessor) -> ProcessorSpec:
        return cls(type(image_processor).__name__, json.dumps(image_processor.to_dict(), sort_keys=True, default=str))


# a compact image's identity by content (``content_key``): its dtype, its shape and a digest of its bytes
Content = tuple[str, tuple[int, ...], str]


def content_key(pixels: torch.Tensor) -> Content:
    """A compact image's identity by content: its dtype, its shape and a digest of its bytes."""
    digest = hashlib.blake2b(pixels.contiguous().numpy().data, digest_size=16).hexdigest()
    return str(pixels.dtype), tuple(pixels.shape), digest


class SharedPixels:
    """Identical compact images as one tensor in this process (issue #59, step 3). A GRPO group's trajectories each
    read the prompt image and mostly make the same crops of it; ``export: per_turn`` samples show the history again.
    Where the samples of a worker's output share each distinct image's tensor, one pickle of them carries it once:
    Ray's, that takes the classic trainer's DataProto and fully async's samples (pickle keeps an object it has
    written once). Holds the tensors weakly: an image no sample or store holds any more is gone. ``hits`` counts
    the images that were already here."""

    def __init__(self) -> None:
        self._by_content: weakref.WeakValueDictionary[Content, torch.Tensor] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()  # the worker's coroutines share one thread; its pool threads may call too
        self.hits = 0

    def shared(self, pixels: torch.Tensor) -> torch.Tensor:
        """The tensor this process holds for ``pixels``' content: one already here (equal, checked) or ``pixels``."""
        import torch

        key = content_key(pixels)
        with self._lock:
            kept = self._by_content.get(key)
            if kept is not None and torch.equal(kept, pixels):
                self.hits += 1
                return kept
            self._by_content[key] = pixels
            return pixels


def json_tensor(fields: Mapping[str, Any]) -> torch.Tensor:
    """``fields`` as a sample carries them: UTF-8 JSON in a uint8 tensor (verl's inputs hold tensors only)."""
    import torch

    return torch.frombuffer(bytearray(json.dumps(fields, sort_keys=True).encode()), dtype=torch.uint8)


def json_fields(tensor: object, name: str, kinds: Mapping[str, type]) -> dict[str, Any]:
    """The fields ``json_tensor`` made, each of its kind; ``CompactImageError`` naming ``name`` otherwise."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.ndim != 1:
        raise CompactImageError(f"{name} is not a 1-D uint8 tensor: {described(tensor)}")
    try:
        fields = json.loads(bytes(tensor.tolist()).decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise CompactImageError(f"{name} is not UTF-8 JSON: {error}") from None
    if not isinstance(fields, dict) or sorted(fields) != sorted(kinds):
        raise CompactImageError(f"{name} holds {fields!r:.200}; expected the fields {sorted(kinds)}")
    wrong = [field for field, kind in kinds.items() if not isinstance(fields[field], kind)]
    if wrong:
        raise CompactImageError(f"{name}: the fields {wrong} have the wrong types")
    return fields


def described(value: object) -> str:
    import torch

    return f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__


# the images (and videos: their frames' contents) expanded for one batch of samples, each distinct one once
Expansions = dict[tuple[ProcessorSpec, str, Content | tuple[Content, ...]], Output]


Ref = TypeVar("Ref", bound="ImageRef")


@dataclass(frozen=True)
class ImageRef:
    """An image a sample shows but does not carry: image ``image`` of the sample stored under ``key`` in
    TransferQueue's ``partition`` carries it (the v1 trainer: a prompt group's samples are put, trained and cleared
    together, so the sample that carries it is there while this one is read). ``content`` is the image's identity,
    checked when it is read."""

    partition: str
    key: str
    image: int
    content: Content

    @functools.cached_property
    def tensor(self) -> torch.Tensor:
        dtype, shape, digest = self.content
        fields = {"partition": self.partition, "key": self.key, "image": self.image, "dtype": dtype}
        return json_tensor({**fields, "shape": list(shape), "digest": digest})

    @classmethod
    def parse(cls: type[Ref], tensor: object, name: str) -> Ref:
        kinds = {"partition": str, "key": str, "image": int, "dtype": str, "shape": list, "digest": str}
        fields = json_fields(tensor, name, kinds)
        if fields["image"] < 0 or not all(isinstance(side, int) and side > 0 for side in fields["shape"]):
            raise CompactImageError(f"{name}: the fields ['image', 'shape'] are wrong: {fields!r:.200}")
        content = (fields["dtype"], tuple(fields["shape"]), fields["digest"])
        return cls(fields["partition"], fields["key"], fields["image"], content)

    def __str__(self) -> str:
        return f"image {self.image} of the sample {self.key!r} in TransferQueue's partition {self.partition!r}"


# the pixels of an image a sample refers to (``ImageRef``), read where the sample carrying it is
Resolve = Callable[[ImageRef], "torch.Tensor"]


def resolved(ref: ImageRef, resolve: Resolve | None, sample: str) -> torch.Tensor:
    """The pixels ``ref`` names, read by ``resolve``; ``CompactImageError`` where nothing reads them or they are
    another image's."""
    if resolve is None:
        raise CompactImageError(
            f"sample {sample} refers to {ref}, and nothing here reads TransferQueue: such samples are read by the "
            "trainer's workers of verl's v1 trainer"
        )
    pixels = resolve(ref)
    if content_key(pixels) != ref.content:
        raise CompactImageError(f"sample {sample} refers to {ref}, which holds another image; it is not trained on")
    return pixels


def carried_bytes(tensors: Sequence[torch.Tensor | ImageRef]) -> int:
    """The bytes of the tensors a sample carries (a reference carries none)."""
    return sum(int(each.numel() * each.element_size()) for each in tensors if not isinstance(each, ImageRef))


def entries(tensors: Sequence[torch.Tensor | ImageRef], carried: str, referred: str) -> dict[str, torch.Tensor]:
    """A sample's ``multi_modal_inputs`` entries for its tensors, in order: tensor i under ``carried`` + i, or its
    reference under ``referred`` + i."""
    return {
        f"{referred}{i}" if isinstance(each, ImageRef) else f"{carried}{i}": (
            each.tensor if isinstance(each, ImageRef) else each
        )
        for i, each in enumerate(tensors)
    }


def entry_names(inputs: Mapping[str, Any], count: int, carried: str, referred: str) -> list[str]:
    """The names of ``count`` entries ``entries`` made: each its reference's where the inputs hold one."""
    return [f"{referred}{i}" if f"{referred}{i}" in inputs else f"{carried}{i}" for i in range(count)]
