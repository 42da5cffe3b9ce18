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
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# each supported image processor's resize step: the method whose output is the compact form
RESIZE_METHODS = {
    "Qwen2VLImageProcessor": "resize",  # Qwen2-VL, Qwen2.5-VL, Qwen3-VL (MoE), Qwen3.5
    "Glm4vImageProcessor": "resize",  # GLM-4.1V, GLM-4.5V
    "Gemma4ImageProcessor": "aspect_ratio_preserving_resize",
}


class NotCompactable(ValueError):
    """This processor's output cannot be rebuilt from resized pixels here: keep its float output."""


@dataclass(frozen=True)
class CompactImage:
    """One image as its processor resized it: ``pixels`` (channels, height, width), uint8 for 8-bit images, and the
    keyword arguments of the processor call that made it (the same ones rebuild its output)."""

    pixels: Any  # torch.Tensor
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(self.pixels.numel() * self.pixels.element_size())


def compact_image(image_processor: Any, image: Any, **arguments: Any) -> tuple[CompactImage, Any]:
    """The image's compact form and the processor's own output for it (``image_processor(images=[image],
    **arguments)``, unchanged)."""
    name = type(image_processor).__name__
    method = RESIZE_METHODS.get(name)
    if method is None:
        raise NotCompactable(
            f"the image processor {name} has no known resize step (known: {sorted(RESIZE_METHODS)}); its float "
            "output is kept"
        )
    resized: list[Any] = []
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


def expanded(image_processor: Any, images: list[CompactImage]) -> Any:
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
