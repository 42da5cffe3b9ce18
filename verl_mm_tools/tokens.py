"""Token ids and processor token counts: the vision tokens a model must never generate, the tokens that end a turn,
the image placeholder ids, and how many placeholder tokens the processor makes for an image. Read by the loop
(``agent_loop/``) and the CPU backend (``cpu/``), so they live below both; no verl import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PIL import Image

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

# An image processor's type stays open: transformers sets its geometry (``patch_size``, ``merge_size``, ``size``,
# Gemma 4's ``max_soft_tokens``) from its kwargs at run time, and ``ProcessorMixin.image_processor`` is untyped.

# Every family's vision tokens (Qwen-VL's, then GLM-V's): a token absent from the vocabulary is skipped.
VISION_TOKENS = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
)


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int | None:
    """The id of a single token, None when the vocabulary lacks it (without building the whole vocabulary dict,
    which costs tens of milliseconds for a 150k-token Qwen tokenizer)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or found == tokenizer.unk_token_id:
        return None
    return found if tokenizer.convert_ids_to_tokens(found) == token else None


def vision_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of the vision placeholder tokens the model must never generate itself (looked up once per worker by
    ``agent_loop.startup.WorkerSetup``, once per engine by ``cpu.hf_engine``)."""
    ids = (token_id(tokenizer, token) for token in VISION_TOKENS)
    return frozenset(found for found in ids if found is not None)


def stop_ids(generation_eos: int | list[int] | None, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every token that ends a generated turn: a generation config's ``eos_token_id`` (one or a list; GLM lists
    <|endoftext|>, <|user|> and <|observation|>) and the tokenizer's eos."""
    listed = generation_eos if isinstance(generation_eos, list) else [generation_eos]
    return frozenset(token for token in [*listed, tokenizer.eos_token_id] if token is not None)


def placeholder_token_ids(
    processor: ProcessorMixin, tokenizer: PreTrainedTokenizerBase
) -> tuple[int | None, int | None]:
    """(image, video) placeholder ids: the tokens the processor repeats once per image or video token (Qwen's
    ``<|image_pad|>``, GLM's ``<|image|>``), as the processor names them."""
    image = getattr(processor, "image_token", None) or "<|image_pad|>"
    video = getattr(processor, "video_token", None) or "<|video_pad|>"
    return token_id(tokenizer, image), token_id(tokenizer, video)


def video_placeholder_tokens(processor: ProcessorMixin, video_grid_thw: Any) -> int:
    """Placeholder tokens the processor wrote for videos of these grids (frames x rows x columns of patches, each
    ``merge_size`` x ``merge_size`` patches one token)."""
    if video_grid_thw is None or len(video_grid_thw) == 0:
        return 0
    merge = int(getattr(_video_processor(processor), "merge_size", 2))
    return int(sum(int(t) * int(h) * int(w) for t, h, w in video_grid_thw.tolist())) // (merge * merge)


def video_frame_sizes(processor: ProcessorMixin, video_grid_thw: Any) -> list[tuple[int, int]]:
    """Each video's frame size (width, height) as the processor shows it: its grid's columns and rows of patches."""
    patch = int(getattr(_video_processor(processor), "patch_size", 14))
    return [(int(w) * patch, int(h) * patch) for _, h, w in video_grid_thw.tolist()]


def _video_processor(processor: ProcessorMixin) -> Any:
    """The processor's video processor (its image processor where it has none)."""
    return getattr(processor, "video_processor", None) or processor.image_processor


def processor_image_tokens(
    processor: ProcessorMixin, image: Image.Image, mm_processor_kwargs: dict | None = None
) -> int:
    """Placeholder tokens the processor produces for this image (its own computation, not ours)."""
    return processor_size_tokens(processor, *image.size, mm_processor_kwargs)


def processor_size_tokens(
    processor: ProcessorMixin, width: int, height: int, mm_processor_kwargs: dict | None = None
) -> int:
    """Placeholder tokens the processor produces for an image of this size, with these kwargs."""
    image_processor = processor.image_processor
    kwargs = dict(mm_processor_kwargs or {})
    if counts_soft_tokens(image_processor):
        width, height = soft_token_size(image_processor, width, height, kwargs)
        side = soft_token_side(image_processor, kwargs)
        return (width // side) * (height // side)
    if takes_pixel_bounds(image_processor):
        # its count reads min/max_pixels one by one, its resize both together or a ``size``: count what it does
        min_pixels, max_pixels = pixel_bounds(image_processor, kwargs)
        kwargs = {**kwargs, "min_pixels": min_pixels, "max_pixels": max_pixels}
    patches = image_processor.get_number_of_image_patches(height, width, kwargs)
    return patches // image_processor.merge_size**2


def counts_soft_tokens(image_processor: object) -> bool:
    """Whether the processor scales every image to a soft-token budget (Gemma 4's ``max_soft_tokens``)."""
    return hasattr(image_processor, "max_soft_tokens") and hasattr(image_processor, "pooling_kernel_size")


def soft_token_side(image_processor: Any, kwargs: dict) -> int:
    """Pixels per side of one soft token: a pooled square of patches."""
    patch = int(kwargs.get("patch_size", image_processor.patch_size))
    return patch * int(kwargs.get("pooling_kernel_size", image_processor.pooling_kernel_size))


def soft_token_size(image_processor: Any, width: int, height: int, kwargs: dict) -> tuple[int, int]:
    """(width, height) Gemma 4's processor scales an image to, up or down: the largest size of whole soft tokens
    within ``max_soft_tokens`` at the image's aspect ratio (transformers' own function). ValueError for an image too
    elongated for one soft token on its short side."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    patch = int(kwargs.get("patch_size", image_processor.patch_size))
    pooling = int(kwargs.get("pooling_kernel_size", image_processor.pooling_kernel_size))
    budget = int(kwargs.get("max_soft_tokens", image_processor.max_soft_tokens))
    new_height, new_width = get_aspect_ratio_preserving_size(
        height=height, width=width, patch_size=patch, max_patches=budget * pooling**2, pooling_kernel_size=pooling
    )
    return new_width, new_height


def takes_pixel_bounds(image_processor: object) -> bool:
    """Whether the image processor takes ``min_pixels`` / ``max_pixels`` (Qwen-VL's; GLM-V's ignores them)."""
    return "max_pixels" in getattr(type(image_processor), "valid_kwargs", dict).__annotations__


def pixel_bounds(image_processor: Any, kwargs: dict) -> tuple[int, int]:
    """(min, max) pixels the processor resizes to with verl's ``mm_processor_kwargs``, as transformers 5 applies
    them: a ``size`` replaces the processor's; ``min_pixels`` and ``max_pixels`` only both together, and only on a
    processor that takes them (Qwen-VL's; one alone is ignored)."""
    size = kwargs.get("size") or image_processor.size
    size = dict(size) if hasattr(size, "keys") else vars(size)
    given = kwargs.get("min_pixels") is not None and kwargs.get("max_pixels") is not None
    if takes_pixel_bounds(image_processor) and given:
        return int(kwargs["min_pixels"]), int(kwargs["max_pixels"])
    return int(size["shortest_edge"]), int(size["longest_edge"])
