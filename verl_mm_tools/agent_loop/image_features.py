"""Each image through the HF image processor once per trajectory, kept in its compact form.

verl runs the model's processor over every image of the conversation wherever it renders it: the first prompt, each
tool turn's new images (verl's Continuous-Token builder), every render of the whole history (``export: per_turn`` /
``auto``), and once more per training sample in its worker's postprocess (``_compute_multi_modal_inputs``, for the
``multi_modal_inputs`` and position ids the trainer reads). The image processor (resize, rescale, normalise, patchify)
is the costly part, and its output for an image depends only on the image and the processor's arguments.

``ImageFeatureStore`` is a trajectory's images as the image processor saw them, each from the render that admitted
it: the keys the token ids need (grids, token counts, positions) and the image's compact form (``compact_image``:
the resized uint8 pixels, 1 byte per byte against the float output's 4 to 8). A family whose output cannot be rebuilt
from its resized pixels keeps its float output instead (``floats`` counts those images). Its ``processor`` is a
shallow copy of the model's processor whose image processor is ``CachedImageProcessor``: called with a list of
images, it runs the real image processor on each image it has not seen (one image per call) and returns the listed
images' outputs joined along the first dimension (lists joined), without the pixel values: a render needs only the
token ids (verl 0.9.1's builder reads a render's image outputs nowhere; ``mm_inputs_out`` serves SGLang's video
payload). Within ``with_pixels()`` it returns the pixel values too, expanded from the compact forms: what the real one
returns for the list, bit for bit, on every family the package supports
(``tests/agent_loop/test_image_features_on_cpu.py``). The processor's own work on the text (placeholder expansion,
tokenizing, its token check) runs as before, so the token ids are the processor's own.

The loop hands the store's processor to verl's builder, and the store itself to each of the trajectory's outputs
(``loop_output.MMToolOutput``), where the worker's postprocess reads it (``adaptations/fixes/processed_images.py``) and
gives each sample its images' compact forms (``compact_images``) in place of their pixel values; when the last of
those outputs is gone (verl has made its training samples), the store drops what it kept (``release``). Images are
matched by identity (the same ``PIL.Image`` objects travel from the tools to ``multi_modal_data``); an image the store
has not seen, another argument set, or an input that is not a list of PIL images goes to the real image processor, as
before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from verl_mm_tools.agent_loop.heap import TRIMMER
from verl_mm_tools.compact_form import NotCompactable, ProcessorSpec, SharedPixels
from verl_mm_tools.compact_image import (
    PIXEL_PREFIX,
    CompactHeader,
    CompactImage,
    CompactImages,
    compact_image,
    concatenated,
    expanded,
)

if TYPE_CHECKING:
    from transformers import BatchFeature, ProcessorMixin

logger = logging.getLogger(__name__)

# one per process: a worker's trajectories share each distinct image's compact tensor (so its output's pickle
# carries it once)
SHARED_PIXELS = SharedPixels()


@dataclass(frozen=True)
class ImageFeatures:
    """One image as the image processor saw it: ``values``, every key it returns for the image alone but the pixel
    values (Qwen-VL / GLM-V: one ``image_grid_thw`` row; Gemma 4: ``image_position_ids`` and
    ``num_soft_tokens_per_image``), and the pixels as their ``compact`` form, or as the float ``pixels`` output for a
    family that has no compact form."""

    values: dict[str, Any]
    compact: CompactImage | None = None
    pixels: dict[str, Any] | None = None


class ImageFeatureStore:
    """A trajectory's images as the image processor saw them, keyed by image identity, and ``processor``: the model's
    processor reading them (see the module docstring). ``runs`` counts the images the real image processor
    processed, ``floats`` those kept as float outputs (no compact form), ``expansions`` those expanded from their
    compact form for a caller that asked for pixel values (``with_pixels``). ``sample`` names the trajectory's row in
    the errors of its compact images."""

    def __init__(self, processor: ProcessorMixin, sample: str = "<unknown>"):
        self.source = processor
        self.sample = sample
        self.runs = self.floats = self.expansions = 0
        self._outputs = 0  # the trajectory's outputs tied to the store (``tie``) and not gone yet
        self._features: dict[int, tuple[weakref.ref, ImageFeatures]] = {}
        self._arguments: dict[str, Any] | None = None  # the arguments the kept outputs were made with
        self._with_pixels = False
        self._header: CompactHeader | None = None  # made once: the trajectory's samples share its tensor
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
                kept = (weakref.ref(image), self._processed(image, arguments, run))
                self._features[id(image)] = kept
                self.runs += 1
            found.append(kept[1])
        return found

    def _processed(self, image: Image.Image, arguments: dict[str, Any], run: Any) -> ImageFeatures:
        """The image through the real image processor ``run``: its token keys and its compact form (its float pixel
        output dropped at once), or its whole output where its family has no compact form."""
        try:
            compact, output = compact_image(run, image, **arguments)
        except NotCompactable as reason:
            logger.debug("kept as float pixel values: %s", reason)
            output = run(images=[image], **arguments)
            self.floats += 1
            return ImageFeatures(_without_pixels(output), pixels=_pixels(output))
        compact = CompactImage(SHARED_PIXELS.shared(compact.pixels), compact.arguments)
        features = ImageFeatures(_without_pixels(output), compact=compact)
        del output  # the float pixel values: their pages go back to the kernel (heap.py)
        TRIMMER.image_processed()
        return features

    @property
    def arguments(self) -> dict[str, Any]:
        """The image-processor arguments the kept outputs were made with (the row's ``mm_processor_kwargs``)."""
        return dict(self._arguments or {})

    @property
    def kept(self) -> list[ImageFeatures]:
        """The outputs kept now, one per image (none once released)."""
        return [features for _, features in self._features.values()]

    @contextlib.contextmanager
    def with_pixels(self) -> Iterator[None]:
        """Within: the image processor's output includes the pixel values: kept float outputs, and the compact forms
        expanded (exact, ~60 ms per 1024 px image on a CPU core). Outside, the keys the token ids need only."""
        self._with_pixels = True
        try:
            yield
        finally:
            self._with_pixels = False

    def joined(self, features: list[ImageFeatures]) -> BatchFeature | None:
        """The image processor's output for these images (``concatenated``): with their pixel values only within
        ``with_pixels``."""
        if not self._with_pixels:
            return concatenated([each.values for each in features])
        outputs = []
        for each in features:
            pixels = each.pixels
            if pixels is None:
                assert each.compact is not None  # ImageFeatures holds one or the other
                pixels = _pixels(expanded(self.source.image_processor, [each.compact]))
                self.expansions += 1
            outputs.append({**each.values, **pixels})
        return concatenated(outputs)

    def compact_images(self, images: list) -> CompactImages | None:
        """A sample's images (the kept ones, in order) as their compact forms; None when one of them is not kept
        or has no compact form, or the call's arguments cannot travel with them."""
        pixels = []
        for image in images:
            kept = self._features.get(id(image))
            if kept is None or kept[0]() is not image or kept[1].compact is None:
                return None
            pixels.append(kept[1].compact.pixels)
        if self._header is None:
            header = CompactHeader(ProcessorSpec.of(self.source.image_processor), self.arguments, self.sample)
            try:
                header.tensor  # noqa: B018 (made once here, where an argument that is not JSON can be refused)
            except NotCompactable as reason:
                logger.warning("sample %s: its images go as float pixel values: %s", self.sample, reason)
                return None
            self._header = header
        return CompactImages(self._header, tuple(pixels))

    def payload_bytes(self, images: list) -> int:
        """The bytes of image inputs a sample showing ``images`` carries to the trainer: each kept image's compact
        form, or its float pixel values (images the store has not seen are not counted: the mm_tool loop has none)."""
        total = 0
        for image in images:
            kept = self._features.get(id(image))
            if kept is None or kept[0]() is not image:
                continue
            features = kept[1]
            if features.compact is not None:
                total += features.compact.nbytes
            else:
                total += sum(value.numel() * value.element_size() for value in (features.pixels or {}).values())
        return total

    def counted(self, images: object) -> None:
        """The real image processor ran on ``images`` outside the store."""
        logger.debug("the image processor ran outside the trajectory's store (%s)", type(images).__name__)
        self.runs += len(images) if isinstance(images, (list, tuple)) else 1

    def tie(self, output: object) -> None:
        """Keep the kept outputs while ``output`` (one of the trajectory's samples, handed this store) lives; once
        every output it was tied to is gone, release them."""
        self._outputs += 1
        weakref.finalize(output, self._untie)

    def _untie(self) -> None:
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


def _pixels(output: Any) -> dict[str, Any]:
    return {key: value for key, value in output.items() if key.startswith(PIXEL_PREFIX)}


def _without_pixels(output: Any) -> dict[str, Any]:
    return {key: value for key, value in output.items() if not key.startswith(PIXEL_PREFIX)}


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
