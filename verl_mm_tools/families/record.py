"""The record that declares one model family: what the tiny builder, the image budget, the recipes and the docs read
of it. The records themselves are in ``catalog.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes" / "family"


class ModelSizes(Protocol):
    """The tiny stand-in's sizes a family's config fields are derived from (``TinyModelSpec`` has them)."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def vision_hidden_size(self) -> int: ...

    @property
    def vision_depth(self) -> int: ...

    @property
    def merge_size(self) -> int: ...


@dataclass(frozen=True)
class Vocabulary:
    """A family's own tokens: special ones (ids from 0, in the family's order), added non-special ones (as the real
    tokenizer adds them: ``decode(skip_special_tokens=True)`` keeps them, so the tool parsers see them), and which
    token plays which part."""

    special: tuple[str, ...]
    added: tuple[str, ...]
    eos: str  # the tokenizer's eos_token
    pad: str
    stop: tuple[str, ...]  # generation_config.eos_token_id: every token that ends a turn
    # config field -> token: the model config's vision token ids
    config_ids: tuple[tuple[str, str], ...]
    thinking: tuple[str, ...] = ()  # added only to thinking-template models (Qwen3-VL Thinking)
    bos: str | None = None  # the tokenizer's bos_token, where the template starts with it (Gemma)
    # tokenizer attribute -> token, where the processor reads tokens from the tokenizer (Gemma's image_token, ...)
    named: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ImageEntry:
    """How the family's image processor turns an image into placeholder tokens: what the image budget counts and
    which ``data.mm_processor_kwargs`` bound it."""

    patch_size: int
    # the image processor classes of the family (by name prefix): how the budget recognises a processor
    processor_prefixes: tuple[str, ...]
    bounds: tuple[str, ...] = ("min_pixels", "max_pixels")  # the mm_processor_kwargs a recipe sets
    # GLM-V's resize (transformers' glm4v ``smart_resize``) bounds ``temporal_patch_size`` frames of an image
    bounds_count_frames: bool = False
    # Gemma 4: patches pooled ``pooling`` x ``pooling`` into one soft token; every image is scaled to one of the
    # soft-token budgets (``max_soft_tokens``), whatever its size
    pooling: int | None = None
    soft_token_budgets: tuple[int, ...] = ()
    # the docs' "Tokens per image" row, with the released processor's defaults: a 448 x 448 and a 1000 x 700 image
    tokens_448: str = ""
    tokens_1000x700: str = ""
    bounds_doc: str = ""

    @property
    def counts_soft_tokens(self) -> bool:
        return self.pooling is not None

    @property
    def pixels_per_token_doc(self) -> str:
        if self.pooling is None:
            side = self.patch_size * 2  # the released processors merge 2 x 2 patches
            return f"{side} x {side}"
        side = self.patch_size * self.pooling
        return f"{side} x {side} ({self.patch_size} px patches pooled {self.pooling} x {self.pooling})"


def _no_fields(sizes: ModelSizes, vocab_size: int) -> dict:
    return {}


@dataclass(frozen=True)
class TinyEntry:
    """What the tiny builder needs beyond the record's name, model type, template and image geometry."""

    processor_class: str
    image_processor_class: str
    video_processor_class: str
    vocabulary: Vocabulary
    # the vision tower's config (sizes, the family's image geometry) -> config fields
    vision_config: Callable[[ModelSizes, ImageEntry], dict]
    # the text config fields only this family has (experts, linear attention, Gemma's layout), given the sizes and
    # the tokenizer's length
    text_fields: Callable[[ModelSizes, int], dict] = _no_fields
    mrope: bool = True  # multimodal rotary sections (Qwen-VL, GLM-V); Gemma 4 has its own rotary layout
    rotary_share: float = 1.0  # the share of each head rotated (Qwen3.5 a quarter, GLM half)
    interleaved_mrope: bool = False  # Qwen3's interleaved M-RoPE; its config then names the head size
    tied_embeddings: bool = False  # the LM head tied to the embeddings, as the released checkpoints have it
    # fused experts saved as the released checkpoints store them (Qwen3-VL-MoE: vLLM reads that layout only)
    experts_in_released_layout: bool = False


@dataclass(frozen=True)
class Family:
    """One model family: its tiny stand-in, image geometry, tool-call format, recipe and docs row."""

    name: str  # --family F, the recipes' +family=F
    model_type: str  # the HF config's model_type
    template: str  # file under tiny/templates/: the real family's chat-template token format
    tool_parser: str  # verl's multi_turn.format (a registered tool parser) for the family's tool-call format
    image: ImageEntry
    tiny: TinyEntry
    checkpoint: str  # the released model the family's recipe trains (actor_rollout_ref.model.path)
    verl_builder: str  # verl's Continuous-Token builder class for the model type
    verl_builder_note: str = ""
    stand_in_doc: str = ""  # the docs' "stand-in specifics" cell
    thinking_template: str | None = None  # a Thinking variant's template under tiny/templates/

    @property
    def patch_size(self) -> int:
        return self.image.patch_size

    @property
    def vocabulary(self) -> Vocabulary:
        return self.tiny.vocabulary

    @property
    def recipe(self) -> Path:
        """The recipe line: ``examples/recipes/run.sh <recipe> +family=NAME`` composes this file."""
        return RECIPES / f"{self.name}.yaml"

    @property
    def recipe_command(self) -> str:
        return f"examples/recipes/run.sh <recipe> +family={self.name}"
