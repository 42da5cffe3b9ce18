"""An image's compact form: the resized pixels its image-processor output is a pure function of (issue #59).

Every supported family's image processor resizes the image first (the only step that depends on the image's own
size), then rescales, normalises and patchifies the resized pixels; Qwen-VL and GLM-V also repeat each frame for the
temporal patch. Their output is float32, 8 bytes per resized byte for Qwen-VL and GLM-V (two frames), 4 for Gemma 4,
which also pads each image to its soft-token budget. The resized pixels are 1 byte per byte (uint8, channels first).

``compact_image`` runs the processor's own call on one image, on a shallow copy whose resize method keeps what it
returns: the processor's output (grid, token counts: what the token ids need) and the resized pixels come from the
same, unchanged computation. ``expanded`` runs the processor's own call again on the resized pixels with
``do_resize=False``: the rest of its pipeline, so its output equals the original call's tensor for tensor
(``torch.equal``, same keys and dtypes: ``tests/test_compact_image_on_cpu.py`` on every family). A processor whose
resize method is not known here raises ``NotCompactable``: the caller keeps the float output (no approximation).

A training sample carries its images' compact forms in its ``multi_modal_inputs`` in place of the float
``pixel_values`` (``CompactImages.inputs``): plain tensors, as verl's output model and TransferQueue require, one per
image (``vmt_compact_image_<i>``, the store's own tensor: samples that share an image share it) and a header
(``vmt_compact_header``: the image processor's class and config, so the trainer's process rebuilds the same one, the
call's arguments and the sample's name, as UTF-8 JSON). ``expanded_inputs`` gives the trainer the sample's inputs as
verl's own processor pass made them, and refuses (``CompactImageError``) a compact form it cannot expand exactly.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl_mm_tools.compact_form import (
    VIDEO_PIXELS,
    CompactImageError,
    Expansions,
    ImageRef,
    NotCompactable,
    Output,
    ProcessorSpec,
    Resolve,
    carried_bytes,
    content_key,
    described,
    entries,
    entry_names,
    json_fields,
    json_tensor,
    resolved,
)
from verl_mm_tools.compact_video import expanded_videos

if TYPE_CHECKING:
    import torch
    from PIL import Image
    from transformers import BaseImageProcessor, BatchFeature

# each supported image processor's resize step: the method whose output is the compact form
RESIZE_METHODS = {
    "Qwen2VLImageProcessor": "resize",  # Qwen2-VL, Qwen2.5-VL, Qwen3-VL (MoE), Qwen3.5
    "Glm4vImageProcessor": "resize",  # GLM-4.1V, GLM-4.5V
    "Gemma4ImageProcessor": "aspect_ratio_preserving_resize",
}


COMPACT_PREFIX = "vmt_compact_"  # the keys of a sample's compact images in its ``multi_modal_inputs``
HEADER_KEY = f"{COMPACT_PREFIX}header"
IMAGE_KEY = f"{COMPACT_PREFIX}image_"  # + the image's index in the sample
REF_KEY = f"{COMPACT_PREFIX}ref_"  # + the image's index: where another sample carries it (``ImageRef``)
PIXEL_PREFIX = "pixel_values"  # the keys an image processor's pixels go under (the rest: grids, positions, counts)


@dataclass(frozen=True)
class CompactImage:
    """One image as its processor resized it: ``pixels`` (channels, height, width), uint8 for 8-bit images, and the
    keyword arguments of the processor call that made it (the same ones rebuild its output)."""

    pixels: torch.Tensor
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(self.pixels.numel() * self.pixels.element_size())


@dataclass(frozen=True)
class CompactHeader:
    """What every compact image of a trajectory shares: the image processor, the call's arguments and the sample's
    name (its row's index or uid, for errors). ``tensor``: the header as a sample carries it (made once, so the
    samples of a trajectory share it)."""

    processor: ProcessorSpec
    arguments: Mapping[str, Any]
    sample: str = "<unknown>"

    @functools.cached_property
    def tensor(self) -> torch.Tensor:

        fields = {
            "processor": self.processor.class_name,
            "config": self.processor.config,
            "arguments": dict(self.arguments),
            "sample": self.sample,
        }
        try:
            return json_tensor(fields)
        except TypeError as error:
            raise NotCompactable(f"the processor call's arguments are not JSON ({error}): {self.arguments}") from error

    @classmethod
    def parse(cls, tensor: object) -> CompactHeader:
        kinds = {"processor": str, "config": str, "arguments": dict, "sample": str}
        fields = json_fields(tensor, HEADER_KEY, kinds)
        return cls(ProcessorSpec(fields["processor"], fields["config"]), fields["arguments"], fields["sample"])


@dataclass(frozen=True)
class CompactImages:
    """One training sample's images, in order: each as its compact form (a uint8 tensor, channels first) or, where
    another sample carries it, as an ``ImageRef`` to it."""

    header: CompactHeader
    pixels: tuple[torch.Tensor | ImageRef, ...]

    @property
    def nbytes(self) -> int:
        """The bytes of the images it carries (a reference carries none)."""
        return carried_bytes(self.pixels)

    def inputs(self) -> dict[str, torch.Tensor]:
        """The sample's ``multi_modal_inputs`` entries that carry them."""
        return {HEADER_KEY: self.header.tensor, **entries(self.pixels, IMAGE_KEY, REF_KEY)}

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, Any]) -> CompactImages | None:
        """The compact images a sample's ``multi_modal_inputs`` carry; None where it carries none. Raises
        ``CompactImageError`` where they are malformed (naming the sample once its header is read)."""
        keys = [key for key in inputs if isinstance(key, str) and key.startswith(COMPACT_PREFIX)]
        if not keys:
            return None
        if HEADER_KEY not in inputs:
            raise CompactImageError(f"compact images without their {HEADER_KEY}: {sorted(keys)}")
        header = CompactHeader.parse(inputs[HEADER_KEY])
        count = len(keys) - 1
        names = entry_names(inputs, count, IMAGE_KEY, REF_KEY)
        problem = (
            f"its keys are {sorted(keys)}; expected {HEADER_KEY} and, for each image i from 0, {IMAGE_KEY}i or "
            f"{REF_KEY}i"
            if not count or sorted(names) != sorted(key for key in keys if key != HEADER_KEY)
            else _malformed([inputs[name] for name in names if name.startswith(IMAGE_KEY)])
        )
        if problem:
            raise CompactImageError(f"sample {header.sample}: its compact images cannot be expanded: {problem}")
        try:
            pixels = tuple(
                ImageRef.parse(inputs[name], name) if name.startswith(REF_KEY) else inputs[name] for name in names
            )
        except CompactImageError as error:
            raise CompactImageError(f"sample {header.sample}: {error}") from None
        return cls(header, pixels)


def _malformed(pixels: list[object]) -> str | None:
    import torch

    for index, each in enumerate(pixels):
        if not isinstance(each, torch.Tensor) or each.dtype != torch.uint8 or each.ndim != 3:
            return f"image {index} is {described(each)}, not a uint8 tensor (channels, height, width)"
        if each.shape[0] not in (1, 3) or min(each.shape[1:]) < 1:
            return f"image {index} has shape {tuple(each.shape)}; expected (1 or 3, height >= 1, width >= 1)"
    return None


def compact_image(image_processor: Any, image: Image.Image, **arguments: Any) -> tuple[CompactImage, BatchFeature]:
    """The image's compact form and the processor's own output for it (``image_processor(images=[image],
    **arguments)``, unchanged)."""
    name = type(image_processor).__name__
    method = RESIZE_METHODS.get(name)
    if method is None:
        raise NotCompactable(
            f"the image processor {name} has no known resize step (known: {sorted(RESIZE_METHODS)}); its float "
            "output is kept"
        )
    resized: list[torch.Tensor] = []
    resize = getattr(image_processor, method)

    def keeping(*args: Any, **kwargs: Any) -> Any:
        result = resize(*args, **kwargs)
        resized.append(result)
        return result

    capturing = copy.copy(image_processor)  # the processor itself is never changed: it is shared by coroutines
    setattr(capturing, method, keeping)
    output = capturing(images=[image], **arguments)
    if len(resized) != 1 or resized[0].ndim not in (3, 4) or (resized[0].ndim == 4 and len(resized[0]) != 1):
        shapes = [tuple(each.shape) for each in resized]
        raise NotCompactable(f"{name}.{method} ran {len(resized)} times for one image (shapes {shapes})")
    pixels = resized[0][0] if resized[0].ndim == 4 else resized[0]
    return CompactImage(pixels.contiguous(), dict(arguments)), output


def expanded(image_processor: Any, images: list[CompactImage]) -> BatchFeature:
    """The processor's output for the images whose compact forms these are, in order: what it returned for them."""
    if not images:
        raise ValueError("expanded() needs at least one compact image")
    arguments = dict(images[0].arguments)
    if any(dict(image.arguments) != arguments for image in images[1:]):
        raise ValueError(
            f"compact images made with different processor arguments cannot be expanded together "
            f"({[dict(image.arguments) for image in images]})"
        )
    return image_processor(images=[image.pixels for image in images], **{**arguments, "do_resize": False})


@functools.lru_cache(maxsize=8)
def image_processor(spec: ProcessorSpec) -> BaseImageProcessor:
    """The image processor ``spec`` describes, built once per process. Only the classes whose resize step is known
    here: a spec is data from another process, never a way to import anything else."""
    if spec.class_name not in RESIZE_METHODS:
        raise CompactImageError(
            f"compact images made by the image processor {spec.class_name!r}, which this package cannot expand "
            f"(known: {sorted(RESIZE_METHODS)})"
        )
    import transformers

    return getattr(transformers, spec.class_name).from_dict(json.loads(spec.config))


def is_image_pixels(key: str) -> bool:
    """Whether a ``multi_modal_inputs`` key holds images' pixels (a video's frames are not compacted)."""
    return key.startswith(PIXEL_PREFIX) and key != VIDEO_PIXELS


def expanded_inputs(
    inputs: Mapping[str, Any], expansions: Expansions | None = None, resolve: Resolve | None = None
) -> dict[str, Any]:
    """A sample's ``multi_modal_inputs`` as verl's own processor pass made them: its compact images expanded into the
    processor's pixel keys (and its compact videos: ``compact_video.expanded_videos``), every other key as it is.
    Inputs without compact images or videos are returned as they are.
    ``expansions``, shared by the samples of one batch, expands an image that several samples show once (by
    content: per-turn samples, a group's prompt image). ``resolve`` gives the pixels of an image the sample refers
    to. Raises ``CompactImageError`` (naming the sample) where the compact form is malformed, a referred image cannot
    be read or is not the one referred to, or the expansion disagrees with the grids and token counts the sample's
    token ids were made with."""
    expansions = {} if expansions is None else expansions
    inputs = expanded_videos(inputs, expansions, resolve)
    compact = CompactImages.from_inputs(inputs)
    rest = {key: value for key, value in inputs.items() if not str(key).startswith(COMPACT_PREFIX)}
    if compact is None:
        return rest
    sample = compact.header.sample
    carried = sorted(key for key in rest if is_image_pixels(key))
    if carried:
        raise CompactImageError(f"sample {sample}: it carries both compact images and {carried}")
    try:
        processor = image_processor(compact.header.processor)
    except CompactImageError as error:
        raise CompactImageError(f"sample {sample}: {error}") from None
    output = _expanded_each(processor, compact, expansions, resolve)
    disagreeing = [key for key in output if key in rest and not _equal(output[key], rest[key])]
    if disagreeing:
        raise CompactImageError(
            f"sample {sample}: its compact images expand to other {disagreeing} than its token ids were made with; "
            "it is not trained on"
        )
    return {**rest, **{key: value for key, value in output.items() if key.startswith(PIXEL_PREFIX)}}


def _expanded_each(
    processor: BaseImageProcessor, compact: CompactImages, expansions: Expansions, resolve: Resolve | None
) -> Output:
    """The processor's output for the sample's images: each image's own, joined as the processor joins a list
    (``concatenated``; equal to one call on the list on every family, ``tests/test_compact_image_on_cpu.py``)."""
    arguments = json.dumps(dict(compact.header.arguments), sort_keys=True)
    outputs = []
    for each in compact.pixels:
        content = each.content if isinstance(each, ImageRef) else content_key(each)
        key = (compact.header.processor, arguments, content)
        if key not in expansions:
            pixels = resolved(each, resolve, compact.header.sample) if isinstance(each, ImageRef) else each
            image = CompactImage(pixels, compact.header.arguments)
            expansions[key] = dict(expanded(processor, [image]).convert_to_tensors("pt"))
        outputs.append(expansions[key])
    joined = concatenated(outputs)
    if joined is None:
        raise CompactImageError(f"sample {compact.header.sample}: its images' outputs cannot be joined")
    return dict(joined)


def concatenated(outputs: list[Output]) -> BatchFeature | None:
    """The image processor's output for the images whose outputs these are: tensors joined along the first
    dimension, lists joined; None for an output holding anything else."""
    import torch
    from transformers.feature_extraction_utils import BatchFeature

    data: dict[str, Any] = {}
    for key in outputs[0]:
        parts = [each[key] for each in outputs]
        if isinstance(parts[0], torch.Tensor):
            data[key] = torch.cat(parts) if len(parts) > 1 else parts[0]
        elif isinstance(parts[0], list):
            data[key] = [item for part in parts for item in part]
        else:
            return None
    return BatchFeature(data=data)


def _equal(got: object, kept: object) -> bool:
    import torch

    if isinstance(got, torch.Tensor) and isinstance(kept, torch.Tensor):
        return got.dtype == kept.dtype and torch.equal(got, kept)
    return bool(got == kept)
