"""Each image through the HF image processor once per trajectory.

verl runs the model's processor over every image of the conversation wherever it renders it: the first prompt, each
tool turn's new images (verl's Continuous-Token builder), every render of the whole history (``export: per_turn`` /
``auto``), and once more per training sample in its worker's postprocess (``_compute_multi_modal_inputs``, for the
``multi_modal_inputs`` and position ids the trainer reads). The image processor (resize, rescale, normalise, patchify)
is the costly part, and its output for an image depends only on the image and the processor's arguments.

``ImageFeatureStore`` is a trajectory's per-image processor outputs, kept from the render that admitted each image.
Its ``processor`` is a shallow copy of the model's processor whose image processor is ``CachedImageProcessor``: called
with a list of images, it runs the real image processor on each image it has not seen (one image per call) and returns
the concatenation of every listed image's output, along the first dimension (lists joined): what the real one returns
for the list, bit for bit, on every family the package supports (``tests/agent_loop/test_image_features_on_cpu.py``).
The processor's own work on the text (placeholder expansion, tokenizing, its token check) runs as before, so the
token ids are the processor's own.

The loop hands the store's processor to verl's builder; ``attach`` ties the store to the trajectory's outputs, where
the worker's postprocess finds it (``adaptations/fixes/processed_images.py``); when the last of those outputs is gone
(verl has made its training samples), the store drops what it kept (``release``). Images are matched by identity (the
same ``PIL.Image`` objects travel from the tools to ``multi_modal_data``); an image the store has not seen, another
argument set, or an input that is not a list of PIL images goes to the real image processor, as before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from PIL import Image

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageFeatures:
    """One image's image-processor output: every key the image processor returns for it alone (Qwen-VL / GLM-V:
    ``pixel_values`` rows and one ``image_grid_thw`` row; Gemma 4: ``pixel_values``, ``image_position_ids`` and
    ``num_soft_tokens_per_image``)."""

    values: dict[str, Any]


class ImageFeatureStore:
    """A trajectory's per-image processor outputs, keyed by image identity, and ``processor``: the model's processor
    reading them (see the module docstring). ``runs`` counts the images the real image processor processed."""

    def __init__(self, processor: Any):
        self.source = processor
        self.runs = 0
        self._outputs = 0  # the trajectory's outputs tied to the store (``attach``) and not gone yet
        self._features: dict[int, tuple[weakref.ref, ImageFeatures]] = {}
        self._arguments: dict[str, Any] | None = None  # the arguments the kept outputs were made with
        self._tokens_only = False
        self.processor = copy.copy(processor)
        self.processor.image_processor = CachedImageProcessor(processor.image_processor, self)

    def features(self, images: list, arguments: dict[str, Any], run: Any) -> list[ImageFeatures] | None:
        """Each image's output, running ``run`` (the real image processor) on those not kept yet; None when the
        store cannot answer for these images and arguments (the caller runs the real image processor)."""
        if not all(isinstance(image, Image.Image) for image in images):
            return None
        if self._arguments is None:
            self._arguments = dict(arguments)
        elif not _same(arguments, self._arguments):
            return None
        found = []
        for image in images:
            kept = self._features.get(id(image))
            if kept is None or kept[0]() is not image:
                kept = (weakref.ref(image), ImageFeatures(dict(run(images=[image], **arguments))))
                self._features[id(image)] = kept
                self.runs += 1
            found.append(kept[1])
        return found

    @property
    def arguments(self) -> dict[str, Any]:
        """The image-processor arguments the kept outputs were made with (the row's ``mm_processor_kwargs``)."""
        return dict(self._arguments or {})

    @property
    def kept(self) -> list[ImageFeatures]:
        """The outputs kept now, one per image (none once released)."""
        return [features for _, features in self._features.values()]

    @contextlib.contextmanager
    def tokens_only(self) -> Iterator[None]:
        """Within: a render that needs only the token ids (the images' grids and token counts), not their pixel
        values, gets the kept outputs without the ``pixel_values*`` keys (no copy of every image's pixels)."""
        self._tokens_only = True
        try:
            yield
        finally:
            self._tokens_only = False

    def joined(self, features: list[ImageFeatures]) -> Any:
        """The image processor's output for these images (``concatenated``), without pixel values in
        ``tokens_only``."""
        if self._tokens_only:
            features = [
                ImageFeatures({key: value for key, value in each.values.items() if not key.startswith(PIXELS)})
                for each in features
            ]
        return concatenated(features)

    def counted(self, images: Any) -> None:
        """The real image processor ran on ``images`` outside the store."""
        logger.debug("the image processor ran outside the trajectory's store (%s)", type(images).__name__)
        self.runs += len(images) if isinstance(images, (list, tuple)) else 1

    def attach(self, output: Any) -> None:
        """Tie the store to one of the trajectory's outputs until that output is gone (verl's postprocess reads it);
        once every output it was tied to is gone, the kept outputs are released."""
        key = id(output)
        _ATTACHED[key] = (weakref.ref(output), self)
        self._outputs += 1
        weakref.finalize(output, self._detach, key)

    def _detach(self, key: int) -> None:
        _ATTACHED.pop(key, None)
        self._outputs -= 1
        if not self._outputs:
            self.release()

    def release(self) -> None:
        """Drop every kept output. Not left to the store's own end: the store outlives its trajectory, reachable
        from the loop objects verl builds per trajectory, which reference cycles keep until a full garbage
        collection (measured: every store of a 16-trajectory batch still alive after it). Meanwhile a worker held
        each finished trajectory's pixel values twice, here and in its samples' ``multi_modal_inputs``: for 64
        trajectories at once, a peak of 1.9 times the bytes they hand the trainer, 1.045 with this (measured with
        glibc's mmap threshold fixed, so that freed blocks leave the process; ``bench`` figure 4)."""
        self._features.clear()


def _same(arguments: dict[str, Any], kept: dict[str, Any]) -> bool:
    try:
        return bool(arguments == kept)
    except (TypeError, ValueError):  # e.g. an array among them: compared as different
        return False


_ATTACHED: dict[int, tuple[weakref.ref, ImageFeatureStore]] = {}
PIXELS = "pixel_values"  # the prefix of the keys holding pixels (the rest: grids, positions, token counts)


def attached_store(output: Any) -> ImageFeatureStore | None:
    """The store ``ImageFeatureStore.attach`` tied to ``output``, if any."""
    found = _ATTACHED.get(id(output))
    return found[1] if found is not None and found[0]() is output else None


class CachedImageProcessor:
    """The image processor of ``ImageFeatureStore.processor``: every other attribute is the real one's."""

    def __init__(self, image_processor: Any, store: ImageFeatureStore):
        self._image_processor = image_processor
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name in ("_image_processor", "_store"):  # not set yet (a copy or an unpickling in progress)
            raise AttributeError(name)
        return getattr(self._image_processor, name)

    def __call__(self, images: Any = None, *args: Any, **kwargs: Any) -> Any:
        found = None
        if not args and isinstance(images, list) and images:
            found = self._store.features(images, kwargs, self._image_processor)
        joined = self._store.joined(found) if found is not None else None
        if joined is None:
            self._store.counted(images)
            return self._image_processor(images, *args, **kwargs)
        return joined


def concatenated(features: list[ImageFeatures]) -> Any:
    """The image processor's output for the images whose outputs these are: tensors joined along the first
    dimension, lists joined; None for an output holding anything else."""
    import torch
    from transformers.feature_extraction_utils import BatchFeature

    data: dict[str, Any] = {}
    for key in features[0].values:
        parts = [each.values[key] for each in features]
        if isinstance(parts[0], torch.Tensor):
            data[key] = torch.cat(parts) if len(parts) > 1 else parts[0]
        elif isinstance(parts[0], list):
            data[key] = [item for part in parts for item in part]
        else:
            return None
    return BatchFeature(data=data)
