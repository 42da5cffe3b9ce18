"""The tiny model's processor: the family's own processor classes (its record's), with the stand-in's image
budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_mm_tools.tiny.spec import TinyModelSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin


def build_processor(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> ProcessorMixin:
    import transformers

    family = spec.family_record
    if family.image.counts_soft_tokens:
        return _soft_token_processor(spec, tokenizer)
    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    geometry = {"patch_size": family.patch_size, "merge_size": spec.merge_size, "temporal_patch_size": 2}
    if family.image.bounds_count_frames:
        # GLM's resize counts an image as temporal_patch_size frames: its pixel bounds are per two frames
        size = {key: value * geometry["temporal_patch_size"] for key, value in size.items()}
    tiny = family.tiny
    image_processor = getattr(transformers, tiny.image_processor_class)(size=size, **geometry)
    video_processor = getattr(transformers, tiny.video_processor_class)(size=size, **geometry)
    processor_cls = getattr(transformers, tiny.processor_class)
    return processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=spec.chat_template,
    )


def stand_in_soft_tokens(spec: TinyModelSpec) -> int:
    """The soft-token budget per image of a stand-in that counts soft tokens (Gemma 4): the smallest its processor
    takes, so that a square image becomes 8 x 8 soft tokens, as the Qwen stand-ins' at most 64 tokens per image."""
    return spec.family_record.image.soft_token_budgets[0]


def _soft_token_processor(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> ProcessorMixin:
    """Gemma 4's processor: every image scaled to the soft-token budget."""
    import transformers

    family = spec.family_record
    soft_tokens = stand_in_soft_tokens(spec)
    geometry = {"patch_size": family.patch_size, "pooling_kernel_size": family.image.pooling}
    image_processor = getattr(transformers, family.tiny.image_processor_class)
    video_processor = getattr(transformers, family.tiny.video_processor_class)
    return getattr(transformers, family.tiny.processor_class)(
        feature_extractor=transformers.Gemma4AudioFeatureExtractor(),
        image_processor=image_processor(max_soft_tokens=soft_tokens, **geometry),
        tokenizer=tokenizer,
        video_processor=video_processor(max_soft_tokens=soft_tokens, **geometry),
        chat_template=spec.chat_template,
        image_seq_length=soft_tokens,
    )
