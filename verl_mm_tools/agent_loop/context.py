"""What the loop's parts (``export``, ``output``, ``prompt``, ``dump``) read of their loop, gathered once when the
loop is built. The parts take this context, never the loop itself: they would otherwise import the loop's module
back, and could reach any of its ~80 attributes (verl's included)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from verl_mm_tools.agent_loop.budget import ImageGeometry, SoftTokenGeometry
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.tool_format import TemplateTraits, ToolFormat
from verl_mm_tools.files import FileRoots

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin


class TextDecoder(Protocol):
    """The loop's use of its tokenizer: one sequence of ids decodes to its text."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class LoopContext:
    """One loop's settings, its resolved chat-template handling, and the few verl methods its parts call."""

    tokenizer: PreTrainedTokenizerBase
    processor: ProcessorMixin | None  # None for a text-only model
    options: MMToolLoopConfig
    model_path: str
    prompt_length: int
    response_length: int
    calculate_log_probs: bool  # verl concatenates rollout log-probs across a batch: all samples have them or none
    apply_chat_template_kwargs: dict
    tool_format: ToolFormat
    traits: TemplateTraits
    files: FileRoots
    tools: dict  # name -> verl tool, before per-sample selection
    # images: the processor's geometry (None when the model sees none), its placeholder ids, generated ids refused
    geometry: ImageGeometry | SoftTokenGeometry | None
    placeholder_ids: tuple[int | None, int | None] | None  # (image, video); None when the model sees no images
    image_token_id: int | None
    forbidden_generated: frozenset[int]
    turn_credit: bool
    turn_gamma: float
    # verl's: its event loop's ``run_in_executor``, the Continuous-Token builder's ``build_initial_tokens``, the
    # SGLang video payload, the prompt's multimodal info, its processor kwargs and a new request id (by priority)
    run_in_executor: Callable[..., Awaitable[Any]]
    build_initial_tokens: Callable[..., list[int]]
    video_payload: Callable[[Any, dict], list[dict] | None]
    process_multi_modal_info: Callable[[list[dict]], Awaitable[dict]]
    mm_processor_kwargs: Callable[[list | None], dict]
    new_request_id: Callable[[int], str]

    @property
    def sees_images(self) -> bool:
        return self.geometry is not None

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        """The tokenizer's decode (verl annotates it with the ``AutoTokenizer`` factory, and transformers' decode with
        the batch case's list too)."""
        return cast(TextDecoder, self.tokenizer).decode(token_ids, skip_special_tokens=skip_special_tokens)

    @property
    def renderer(self) -> ProcessorMixin | PreTrainedTokenizerBase:
        """What renders the chat template: the processor, or the tokenizer of a text-only model."""
        return self.processor or self.tokenizer
