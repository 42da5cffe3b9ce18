"""A finished trajectory as verl's ``AgentLoopOutput``s: each training sample validated (lengths, image placeholders
per image against the processor, no generated vision tokens), with every field verl's ``ToolAgentLoop`` sets
(prompt videos and audios, the SGLang video payload, MoE ``routed_experts``); or, for a trajectory that failed, one
valid output that trains on nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from verl_mm_tools.agent_loop.context import LoopContext
from verl_mm_tools.agent_loop.engine import EngineAbortedError
from verl_mm_tools.agent_loop.loop_output import MMToolOutput
from verl_mm_tools.agent_loop.state import SampleCut, TrajectoryState, Turn
from verl_mm_tools.agent_loop.tool_runner import ToolCrashError
from verl_mm_tools.agent_loop.validation import trajectory_problems
from verl_mm_tools.errors import (
    ConfigError,
    FileAccessError,
    ImageBudgetError,
    ImageInputError,
    TrajectoryValidationError,
    VideoInputError,
)
from verl_mm_tools.handoff import LoopSettings
from verl_mm_tools.tokens import processor_image_tokens

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.agent_data import LoopAgentData

logger = logging.getLogger(__name__)

# errors whose message says it all: logged without a traceback
EXPECTED_ERRORS = (
    TrajectoryValidationError,
    ImageBudgetError,
    ToolCrashError,
    ImageInputError,
    FileAccessError,
    VideoInputError,
    EngineAbortedError,
)
MASKED_NOTICE = "This sample was dropped by verl-mm-tools; see mm_tool/error."


class OutputBuilder:
    """Builds one loop's outputs."""

    def __init__(self, context: LoopContext):
        self.context = context
        self.response_length = context.response_length

    def checked(self, agent_data: LoopAgentData, state: TrajectoryState) -> list[tuple[MMToolOutput, list]]:
        """Each training sample as a validated output, with its turns' response spans in it."""
        excess = agent_data.response_mask[self.response_length :]
        if not all(excess):  # only generated tokens may be trimmed: context tokens may hold image placeholders
            raise TrajectoryValidationError(
                f"the response holds {len(agent_data.response_mask)} tokens, more than response_length="
                f"{self.response_length}, and the excess is not only generated text"
            )
        current = SampleCut(
            agent_data.prompt_ids,
            agent_data.response_mask,
            agent_data.response_logprobs,
            len(agent_data.image_data),
            agent_data.routed_experts,
            first_image=state.first_image,
        )
        image_tokens = self._image_tokens(agent_data.image_data, agent_data.mm_processor_kwargs)
        outputs = []
        for index, sample in enumerate([*state.samples, current]):
            output, spans = self._output(agent_data, sample, state.sample_turns(index))
            problems = self._problems(output, image_tokens[sample.first_image : sample.images], state, sample.videos)
            if problems:
                raise TrajectoryValidationError(f"training sample {index + 1}: " + "; ".join(problems))
            outputs.append((output, spans))
        state.stats.images, state.stats.image_tokens = len(agent_data.image_data), sum(image_tokens)
        return outputs

    def add_extra_fields(self, outputs: Sequence[tuple[MMToolOutput, list | None]], state: TrajectoryState) -> None:
        """What every output hands the trainer (``handoff.SampleFields``): the trajectory's statistics and turns,
        and the options the trainer-side step hook reads."""
        options = self.context.options
        settings = LoopSettings(
            max_masked_fraction=options.max_masked_fraction,
            call_rate_window=options.call_rate_window,
            turn_credit=self.context.turn_credit,
            turn_gamma=self.context.turn_gamma,
        )
        for index, (output, spans) in enumerate(outputs):
            output.extra_fields.update(state.sample_fields(settings, index, len(outputs), spans).extra_fields())

    def _image_tokens(self, images: list, mm_processor_kwargs: dict) -> list[int]:
        processor = self.context.processor
        if not self.context.sees_images or processor is None:  # a model that sees images has a processor
            return []
        return [processor_image_tokens(processor, image, mm_processor_kwargs) for image in images]

    def _problems(
        self, output: MMToolOutput, image_tokens: list[int], state: TrajectoryState, videos: int | None = None
    ) -> list[str]:
        placeholder_ids = self.context.placeholder_ids
        return trajectory_problems(
            prompt_ids=output.prompt_ids,
            response_ids=output.response_ids,
            response_mask=output.response_mask,
            response_logprobs=output.response_logprobs,
            image_tokens=image_tokens,
            image_token_id=self.context.image_token_id,
            forbidden_generated=self.context.forbidden_generated,
            video_tokens=state.sample_video_tokens(videos),
            video_token_id=placeholder_ids[1] if placeholder_ids else None,
        )

    def _output(self, agent_data: LoopAgentData, sample: SampleCut, turns: list[Turn]) -> tuple[MMToolOutput, list]:
        """One training sample: its prompt is everything before its first turn's generation (the first prompt for
        a one-sample trajectory); returns it with its turns' response spans in it. For a one-sample trajectory every
        field is what verl's ToolAgentLoop.run sets (tests/agent_loop/test_parity_on_cpu.py)."""
        limit = self.response_length
        first = len(sample.token_ids) - len(sample.response_mask)  # where the loop's response part begins
        split = turns[0].prompt_end if turns else first
        shift = split - first  # response tokens before the sample's first generation, now prompt
        routed = sample.routed_experts
        output = MMToolOutput(
            prompt_ids=sample.token_ids[:split],
            response_ids=sample.token_ids[first:][:limit][shift:],
            response_mask=sample.response_mask[:limit][shift:],
            response_logprobs=sample.response_logprobs[shift:limit] if sample.response_logprobs else None,
            multi_modal_data=_multi_modal_data(
                agent_data, agent_data.image_data[sample.first_image : sample.images], sample.videos
            ),
            mm_processor_kwargs=agent_data.mm_processor_kwargs,
            mm_processor_output=agent_data.mm_processor_output,
            num_turns=agent_data.user_turns + agent_data.assistant_turns + 1,
            metrics=agent_data.metrics,  # type: ignore[arg-type, unused-ignore]  # pydantic reads the dict, as verl's loop passes it
            routed_experts=routed[: first + limit] if routed is not None else None,
            extra_fields={
                **agent_data.extra_fields,
                "turn_scores": agent_data.turn_scores,
                "tool_rewards": agent_data.tool_rewards,
            },
        )
        return output, [[start - shift, end - shift] for start, end in (turn.response_span for turn in turns)]

    def masked(
        self, agent_data: LoopAgentData | None, state: TrajectoryState, error: BaseException, name: str
    ) -> MMToolOutput:
        """A valid output that trains on nothing: the prompt as rendered (or a text stand-in) and one masked token."""
        if isinstance(error, ConfigError):
            raise error  # a broken configuration must stop the run, not mask every sample
        state.mask(f"{type(error).__name__}: {error}")
        state.stats.aborted_generations += isinstance(error, EngineAbortedError)
        logger.warning(
            "mm_tool: masked the trajectory of sample %s (%s)",
            name,
            state.stats.error,
            exc_info=not isinstance(error, EXPECTED_ERRORS),
        )
        output = self._prompt_only(agent_data, state)
        if output is None:
            notice = self.context.tokenizer.encode(MASKED_NOTICE, add_special_tokens=False)
            output = self._masked(notice[-self.context.prompt_length :], {}, agent_data)
        state.stats.images = len((output.multi_modal_data or {}).get("images", []))
        return output

    def _prompt_only(self, agent_data: LoopAgentData | None, state: TrajectoryState) -> MMToolOutput | None:
        """The rendered prompt with its own images, if it was rendered and is sound."""
        if agent_data is None or not state.prompt_length:
            return None
        images = agent_data.image_data[: state.prompt_images]
        # the prompt's videos with its images: their placeholders are in prompt_ids
        prompt_videos = len(state.videos) - len(state.tool_videos)
        output = self._masked(state.prompt_ids, _multi_modal_data(agent_data, images, prompt_videos), agent_data)
        image_tokens = self._image_tokens(images, agent_data.mm_processor_kwargs)
        return None if self._problems(output, image_tokens, state, prompt_videos) else output

    def _masked(self, prompt_ids: list[int], multi_modal_data: dict, agent_data: LoopAgentData | None) -> MMToolOutput:
        # verl concatenates rollout log-probs (and MoE routing) across the batch: all samples have them or none does
        logprobs = [0.0] if self.context.calculate_log_probs else None
        routed = getattr(agent_data, "routed_experts", None)
        return MMToolOutput(
            prompt_ids=list(prompt_ids),
            response_ids=[self.context.tokenizer.eos_token_id],
            response_mask=[0],
            response_logprobs=logprobs,
            multi_modal_data=multi_modal_data,
            mm_processor_kwargs=getattr(agent_data, "mm_processor_kwargs", None),
            num_turns=1,
            metrics=getattr(agent_data, "metrics", {}),  # type: ignore[arg-type, unused-ignore]  # pydantic reads the dict, as verl's
            # no routing was taken for these tokens: zeros of the engine's shape, where this trajectory got one
            routed_experts=None if routed is None else np.zeros((len(prompt_ids) + 1, *np.shape(routed)[1:]), np.int16),
            # what the engine reported for the turns generated (the weight versions verl's v1 trainer reads per sample)
            extra_fields={**(getattr(agent_data, "extra_fields", None) or {}), "turn_scores": [], "tool_rewards": []},
        )


def _multi_modal_data(agent_data: LoopAgentData, images: list, videos: int | None = None) -> dict:
    """verl's multi_modal_data: the sample's images, its videos (the prompt's, then the tools' it shows: the first
    ``videos``, None: all) and the prompt's audios as verl passes them."""
    data: dict[str, Any] = {"images": images} if images else {}
    if agent_data.video_data is not None:
        shown = agent_data.video_data if videos is None else agent_data.video_data[:videos]
        if shown or videos is None:
            data["videos"] = shown
    if agent_data.audio_data is not None:
        data["audios"] = agent_data.audio_data
    return data
