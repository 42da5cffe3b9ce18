"""What the mm_tool loop checks and resolves once per worker rather than per trajectory (verl builds a loop per
trajectory, every one on its worker's one trainer config): the worker's constants, the step hook the options need,
the export the trainer can take, and the tool format the chat template needs (logged once).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from omegaconf import OmegaConf

from verl_mm_tools.agent_loop.budget import ImageGeometry, SoftTokenGeometry
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.hook_config import (
    MANAGER_TQ_OVERRIDE,
    how_to_hook,
    multi_sample_manager_configured,
    refuse_unsupported_with_hook,
    require_step_hook,
    step_hook_configured,
    uses_fully_async_trainer,
    uses_v1_trainer,
)
from verl_mm_tools.agent_loop.options import Export, ToolPrompt, ToolResponseRole
from verl_mm_tools.agent_loop.tool_format import TemplateTraits, ToolFormat, resolve_tool_format, template_traits
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME as TURN_CREDIT_ESTIMATOR
from verl_mm_tools.tokens import placeholder_token_ids, stop_ids, vision_token_ids

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class WorkerSetup:
    """What every loop of a verl agent-loop worker derives alike from the worker's trainer config, processor and
    tokenizer, held with them (strongly: no other object takes their identities while the setup lives). Derived anew
    for each trajectory, it would cost 1.5 ms (DictConfig reads, processor inspection, the generation config file)
    and its checks 1.1 ms more, against 6.5 ms for a whole loop construction (56 px, 2026-12-02, a loaded 2-core
    machine). The checks that also read a loop's options run once per option value (``check_step_hook``,
    ``check_export``)."""

    trainer_config: DictConfig
    processor: ProcessorMixin | None  # None for a text-only model
    tokenizer: PreTrainedTokenizerBase
    limit_images: int | None
    model_path: str
    calculate_log_probs: bool
    full_determinism: bool
    geometry: ImageGeometry | SoftTokenGeometry | None  # None when the model sees no images
    placeholder_ids: tuple[int | None, int | None] | None
    forbidden_generated: frozenset[int]
    traits: TemplateTraits
    end_of_turn: frozenset[int]  # every token that ends a generated turn (``end_of_turn_ids``)
    turn_credit: bool  # whether the run's advantage estimator is turn credit
    turn_gamma: float  # algorithm.gamma with turn credit, else 1.0 (``turn_gamma``)
    _passed: set[Hashable] = field(default_factory=set, repr=False)  # the option-dependent checks passed so far

    def derived_from(self, trainer_config: object, processor: object, tokenizer: object) -> bool:
        """Whether this setup was derived from these very objects."""
        return self.trainer_config is trainer_config and self.processor is processor and self.tokenizer is tokenizer

    def check_step_hook(self, options: MMToolLoopConfig) -> None:
        """Dumps and turn credit need the trainer-side step hook; without it, say once what the run lacks."""
        self._once(("step hook", bool(options.dump_dir)), lambda: _check_step_hook(self, options))

    def check_export(self, options: MMToolLoopConfig) -> None:
        """Several samples per trajectory need verl's v1 trainer and our v1 manager; a template that rewrites history
        deserves per_turn (said once)."""
        export = options.export
        chosen = f" (chosen by keep_last_images={options.keep_last_images})" if options.keep_last_images else ""
        self._once(("export", export), lambda: _check_export(self.trainer_config, export, self.traits, chosen))

    def _once(self, key: Hashable, check: Callable[[], None]) -> None:
        """Runs a check the first time its key comes; one that raised runs again for the next loop."""
        if key not in self._passed:
            check()
            self._passed.add(key)


RECENT_SETUPS = 4  # a worker derives one; a process that builds loops for a few configs (the bench, tests) a few
_recent: list[WorkerSetup] = []  # the setups used last (``worker_setup``), the latest first
_logged_formats: set[ToolFormat] = set()  # each resolved tool format is logged once per process


def worker_setup(
    trainer_config: DictConfig,
    processor: object,
    tokenizer: object,
    mm_processor_kwargs: Mapping[str, Any] | None,
    chat_template_kwargs: dict,
) -> WorkerSetup:
    """The worker's ``WorkerSetup``: a recent one derived from these very objects (the kwargs are read from the same
    trainer config), else one derived anew. A verl agent-loop worker builds all its loops, one per trajectory, on its
    one trainer config, processor and tokenizer, so it derives one; a process that builds loops for a few configs in
    turn (the bench's figure 6 alternates two) keeps the ``RECENT_SETUPS`` used last, each holding its config alive.
    ``processor`` and ``tokenizer`` are verl's loop's, which verl annotates with transformers' ``AutoProcessor`` and
    ``AutoTokenizer`` factories: the setup holds them as what those factories make."""
    found = next((setup for setup in _recent if setup.derived_from(trainer_config, processor, tokenizer)), None)
    setup = found or _derive_setup(trainer_config, processor, tokenizer, mm_processor_kwargs, chat_template_kwargs)
    if not _recent or _recent[0] is not setup:  # the latest used first: the one a worker uses is found at once
        _recent[:] = [setup, *(kept for kept in _recent if kept is not setup)][:RECENT_SETUPS]
    return setup


def _derive_setup(
    trainer_config: DictConfig,
    verl_processor: object,
    verl_tokenizer: object,
    mm_processor_kwargs: Mapping[str, Any] | None,
    chat_template_kwargs: dict,
) -> WorkerSetup:
    # what transformers' Auto factories make: a processor (None for a text-only model) and a tokenizer
    processor = cast("ProcessorMixin | None", verl_processor)
    tokenizer = cast("PreTrainedTokenizerBase", verl_tokenizer)
    vision = processor if getattr(processor, "image_processor", None) is not None else None
    rollout = trainer_config.actor_rollout_ref.rollout
    uses_turn_credit = trainer_config.algorithm.get("adv_estimator") == TURN_CREDIT_ESTIMATOR
    return WorkerSetup(
        trainer_config=trainer_config,
        processor=processor,
        tokenizer=tokenizer,
        limit_images=OmegaConf.select(rollout, "limit_images", default=None),
        model_path=str(trainer_config.actor_rollout_ref.model.path),
        calculate_log_probs=bool(rollout.calculate_log_probs),
        full_determinism=bool(rollout.full_determinism),
        geometry=ImageGeometry.from_processor(vision, mm_processor_kwargs) if vision is not None else None,
        placeholder_ids=placeholder_token_ids(vision, tokenizer) if vision is not None else None,
        forbidden_generated=vision_token_ids(tokenizer),
        traits=template_traits(processor or tokenizer, chat_template_kwargs),
        end_of_turn=end_of_turn_ids(trainer_config, tokenizer),
        turn_credit=uses_turn_credit,
        turn_gamma=turn_gamma(trainer_config, uses_turn_credit),
    )


def end_of_turn_ids(trainer_config: DictConfig, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every token that ends a generated turn: the model's generation config's eos ids (what verl's vLLM server stops
    at: Qwen's <|im_end|>, GLM's <|user|> and <|observation|> too) and the tokenizer's eos."""
    from transformers import GenerationConfig

    path = OmegaConf.select(trainer_config, "actor_rollout_ref.model.path", default=None)
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id if path else None
    except OSError:  # a checkpoint without generation_config.json: the tokenizer's eos is all there is
        eos = None
    return stop_ids(eos, tokenizer)


def turn_gamma(trainer_config: DictConfig, turn_credit: bool) -> float:
    """algorithm.gamma: the per-turn discount the step hook chains a trajectory's samples with (turn credit only)."""
    return float(OmegaConf.select(trainer_config, "algorithm.gamma", default=1.0)) if turn_credit else 1.0


def _check_step_hook(setup: WorkerSetup, options: MMToolLoopConfig) -> None:
    trainer_config = setup.trainer_config
    refuse_unsupported_with_hook(trainer_config)
    if options.dump_dir:
        require_step_hook(trainer_config, "mm_tool dump_dir")
    if setup.turn_credit:
        require_step_hook(trainer_config, f"algorithm.adv_estimator={TURN_CREDIT_ESTIMATOR}")
    if not step_hook_configured(trainer_config):
        logger.warning(
            "mm_tool runs without verl-mm-tools' step hook: no mm_tool/* step metrics and no masked-batch guard: %s",
            how_to_hook(trainer_config),
        )


def _check_export(trainer_config: DictConfig, export: Export, traits: TemplateTraits, chosen: str = "") -> None:
    if export is not Export.PER_TRAJECTORY and uses_fully_async_trainer(trainer_config):
        raise ConfigError(
            f"mm_tool export={export.value!r}{chosen} returns several training samples per trajectory, which verl's "
            "fully async trainer does not take (its rollouter's agent-loop worker takes one output per trajectory). "
            "Use export: per_trajectory, or verl's v1 trainer (python -m verl.trainer.main_ppo)."
        )
    if export is not Export.PER_TRAJECTORY and not uses_v1_trainer(trainer_config):
        raise ConfigError(
            f"mm_tool export={export.value!r}{chosen} returns several training samples per trajectory, which only "
            "verl's v1 trainer takes (trainer.use_v1=true, verl's default); this run uses the classic trainer "
            "(trainer.use_v1=false). Use the v1 trainer, or export: per_trajectory."
        )
    if export is not Export.PER_TRAJECTORY and not multi_sample_manager_configured(trainer_config):
        raise ConfigError(
            f"mm_tool export={export.value!r}{chosen} returns several samples per trajectory, and verl 0.9.1's v1 "
            "agent-loop worker crashes scoring several samples of a Qwen-VL model (it stacks their (4, L) position ids "
            f"along the wrong dimension). Add {MANAGER_TQ_OVERRIDE} (verl's manager, scoring the final sample alone)."
        )
    if export is Export.PER_TRAJECTORY and not traits.prefix_stable:
        logger.warning(
            "mm_tool: the chat template renders the history otherwise than the model generated it (Qwen3-VL "
            "Thinking's drops earlier reasoning once a new user turn arrives, Gemma 4's the empty thought channel of "
            "its generation prompt), so with export=per_trajectory the model trains on contexts it would not see at "
            "inference. Set export: per_turn (one sample per turn, each the template's own render) or auto."
        )


def tool_format(has_tools: bool, options: MMToolLoopConfig, traits: TemplateTraits, parser: str) -> ToolFormat:
    """How the tools reach the model on this template (logged once per format)."""
    if not has_tools:
        return ToolFormat(tool_prompt=ToolPrompt.OFF, response_role=ToolResponseRole.TOOL)
    resolved = resolve_tool_format(options.tool_prompt, options.tool_response_role, traits, parser)
    if resolved not in _logged_formats:
        _logged_formats.add(resolved)
        logger.info(
            "mm_tool renders tools as %s (options tool_prompt=%s, tool_response_role=%s; %s)",
            resolved,
            options.tool_prompt,
            options.tool_response_role,
            traits,
        )
    return resolved


def require_visible_tools(first_prompt: str, tools: dict, options: MMToolLoopConfig, resolved: ToolFormat) -> None:
    """A tool the first prompt never names cannot be called: a configuration error, not a dead tool loop."""
    missing = sorted(name for name in tools if not re.search(rf"\b{re.escape(name)}\b", first_prompt))
    if missing:
        raise ConfigError(
            f"the tools {missing} are configured but appear nowhere in the first prompt the model sees "
            f"(mm_tool tool_prompt={options.tool_prompt.value!r}, resolved to {resolved.tool_prompt.value!r}): "
            "the model cannot know they exist. Set tool_prompt: auto (mm_tool adds the tool schemas to the "
            "system message when the chat template ignores them) or describe the tools in the dataset's prompt."
        )
