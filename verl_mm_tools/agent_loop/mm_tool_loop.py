"""The ``mm_tool`` agent loop: verl's ToolAgentLoop (its state machine's generation step, Continuous-Token builder,
tool parser) plus what verl lacks for multimodal tool use. This module is the state machine; its parts:

- ``tool_runner``: a tool turn (sessions, timeouts, cancellation, image admission, truncation);
- ``export``: where a trajectory's training samples split (``export`` per_trajectory / per_turn / auto);
- ``output``: the validated outputs, with every field verl's loop sets, or a masked one for a failed trajectory;
- ``startup``: what is derived, checked and resolved once per worker (``WorkerSetup``, step hook, export, tool format);
- ``state``: the trajectory's state, turns, stop reason and statistics, the one thing attached to ``AgentData``.

Any error ends only its own trajectory, as a valid output with a zeroed response mask (a ConfigError stops the run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.utils.profiler import simple_timer

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.agent_loop import startup
from verl_mm_tools.agent_loop.agent_data import LoopAgentData
from verl_mm_tools.agent_loop.budget import check_pixel_bounds
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.context import LoopContext
from verl_mm_tools.agent_loop.dump import stage_trajectory
from verl_mm_tools.agent_loop.engine import CheckedEngine
from verl_mm_tools.agent_loop.export import Exporter
from verl_mm_tools.agent_loop.image_features import ImageFeatureStore
from verl_mm_tools.agent_loop.judge_view import judge_context
from verl_mm_tools.agent_loop.loop_output import ADAPTATION as OUTPUT_MODEL
from verl_mm_tools.agent_loop.loop_output import MMToolOutput
from verl_mm_tools.agent_loop.options import Export
from verl_mm_tools.agent_loop.output import OutputBuilder
from verl_mm_tools.agent_loop.prompt import charge_prompt_videos, new_agent_data, sample_name, start_environment
from verl_mm_tools.agent_loop.state import Checkpoint, LoopState, TrajectoryState, Turn, attached_state
from verl_mm_tools.agent_loop.tool_runner import ToolRunner, ToolVideos, start_remote_tools
from verl_mm_tools.envs import Observation
from verl_mm_tools.envs.base import call as call_env
from verl_mm_tools.errors import TrajectoryValidationError
from verl_mm_tools.files import FileRoots
from verl_mm_tools.handoff import SampleFields, StopReason

if TYPE_CHECKING:
    from verl.experimental.agent_loop.tool_agent_loop import AgentData

logger = logging.getLogger(__name__)

# Constructor kwargs verl itself passes (hydra also forwards the YAML entry's ``name``); everything else is ours.
VERL_LOOP_KWARGS = frozenset(
    "trainer_config server_manager tokenizer processor dataset_cls data_config hf_model_type tools name".split()
)

ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.experimental.agent_loop.tool_agent_loop",
            "ToolAgentLoop.run",
            "4d3b05be93f3261c1f4d0d4d9b3283e88d5b5de57515d585c32a6ff698b1ad0f",
        ),
        Target(
            "verl.experimental.agent_loop.tool_agent_loop",
            "ToolAgentLoop._handle_pending_state",
            "87d7a6091d94434296d155cc92860415c344da31804a9220a9ed69f01641b82c",
        ),
        Target(
            "verl.experimental.agent_loop.tool_agent_loop",
            "ToolAgentLoop._handle_processing_tools_state",
            "6fb81493273afe9bce07bd497cb77e8d4a29fa62321eb70480fc0561ea12c765",
        ),
    ),
    what=(
        "calls verl's `_handle_generating_state` (generation, Continuous-Token merge, tool parsing), "
        "`ct_build_initial_tokens`, `ct_merge_context_msg` and its helpers as they are; re-implements "
        "`run()` (AgentData and per-sample tool selection in `agent_loop/prompt.py`, the output's fields"
        " in `agent_loop/output.py`), `_handle_pending_state` (renders the resolved tool format) and "
        "`_handle_processing_tools_state` (`agent_loop/tool_runner.py` and `_merge_context_turn`: "
        "sessions, timeouts, image budget, rollback)"
    ),
    why=(
        "verl's `run()` has no hook for the trajectory's state, environments, failure isolation or "
        "several samples, and its tool state creates a tool per call, gathers calls in parallel and "
        "admits every image"
    ),
    applies_to="verl 0.9.1",
    proof=(
        "the targets' sha256, checked by "
        "`tests/adaptations/test_records_on_cpu.py::"
        "test_every_target_is_the_code_its_record_was_written_against`; "
        "`tests/agent_loop/test_parity_on_cpu.py` checks every output field `tool_agent` sets, "
        "`routed_experts` included, equals mm_tool's"
    ),
)


@ADAPTATION.implements
class MMToolAgentLoop(ToolAgentLoop):
    """Multimodal tool loop registered as ``mm_tool``. Options: see ``MMToolLoopConfig``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # verl's and hydra's keyword arguments, and the options
        confirm(ADAPTATION)  # the verl code this loop copies changed: refuses to start (checked once per process)
        confirm(OUTPUT_MODEL)  # likewise verl's output model, which the loop's outputs extend
        options = {key: kwargs.pop(key) for key in list(kwargs) if key not in VERL_LOOP_KWARGS}
        super().__init__(*args, **kwargs)
        # aborted replies raise; prefix-cache hits kept (a wrapper of verl's client, with its generate)
        self.server_manager = CheckedEngine(self.server_manager)  # type: ignore[assignment, unused-ignore]
        setup = startup.worker_setup(  # derived once per worker: verl builds its loops on one config
            self.config, self.processor, self.tokenizer, self.mm_processor_kwargs, self.apply_chat_template_kwargs
        )
        self.context = self._context(MMToolLoopConfig.from_options(options, limit_images=setup.limit_images), setup)
        self.end_of_turn = setup.end_of_turn
        self.tool_runner = ToolRunner(
            self.context.options,
            self.max_parallel_calls,
            self.max_tool_response_length,
            self.tool_response_truncate_side,
            self.tool_parser_name,
            ToolVideos(self.context) if self.context.sees_images else None,
        )
        # verl's builder renders through the processor: each trajectory's copy of it processes each image once
        builder_processor = getattr(self.continuous_token_builder, "processor", None)
        self.caches_images = self.context.sees_images and builder_processor is not None
        self.exporter = Exporter(self.context)
        self.outputs = OutputBuilder(self.context)

    def _context(self, options: MMToolLoopConfig, setup: startup.WorkerSetup) -> LoopContext:
        """The loop's settings, checked, and what its parts read of it (they never hold the loop)."""
        check_pixel_bounds(options, setup.geometry)
        setup.check_step_hook(options)  # these two: once per worker and option value
        setup.check_export(options)
        placeholder_ids = setup.placeholder_ids
        return LoopContext(
            tokenizer=setup.tokenizer,  # verl's, as transformers makes them (verl annotates the Auto factories)
            processor=setup.processor,
            options=options,
            model_path=setup.model_path,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            calculate_log_probs=setup.calculate_log_probs,
            apply_chat_template_kwargs=self.apply_chat_template_kwargs,
            tool_format=startup.tool_format(bool(self.tools), options, setup.traits, self.tool_parser_name),
            traits=setup.traits,
            files=FileRoots.from_config(options.file_roots),
            tools=self.tools,
            geometry=setup.geometry,
            placeholder_ids=placeholder_ids,
            image_token_id=placeholder_ids[0] if placeholder_ids else None,
            forbidden_generated=setup.forbidden_generated,
            turn_credit=setup.turn_credit,
            turn_gamma=setup.turn_gamma,
            run_in_executor=self.loop.run_in_executor,
            build_initial_tokens=self.continuous_token_builder.build_initial_tokens,
            video_payload=self.build_sglang_video_payload,
            process_multi_modal_info=self.process_multi_modal_info,
            mm_processor_kwargs=self._get_mm_processor_kwargs,
            new_request_id=lambda priority: self._make_request_id(priority, setup.full_determinism),
        )

    # ----- one trajectory -------------------------------------------------------------------------------------

    # verl's run returns one output; with export per_turn / auto this one returns the list its worker also takes
    async def run(  # type: ignore[override, unused-ignore]
        self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One trajectory: its output, or with ``export`` per_turn / auto the list of its training samples."""
        state = TrajectoryState(files=self.context.files, features=self._image_features(sample_name(kwargs)))
        agent_data: LoopAgentData | None = None
        outputs: Sequence[tuple[MMToolOutput, list | None]]
        try:
            agent_data = await new_agent_data(self.context, kwargs, priority, state)
            await start_remote_tools(agent_data._active_tools)
            await start_environment(agent_data, kwargs, state, self.context.options.env)  # close() runs if reset raises
            await self._run_states(agent_data, state, sampling_params)
            outputs = self.outputs.checked(agent_data, state)
        except (Exception, asyncio.CancelledError) as error:  # isolation: verl gathers without return_exceptions
            if isinstance(error, asyncio.CancelledError) and _being_cancelled():
                raise  # this trajectory is being cancelled; a stray CancelledError from a callee is masked instead
            outputs = [(self.outputs.masked(agent_data, state, error, sample_name(kwargs)), None)]
        finally:
            await state.release()
        if agent_data is not None:
            state.stats.generate_s = agent_data.metrics.get("generate_sequences", 0.0)
        await state.hand_images([output for output, _ in outputs])
        self.outputs.add_extra_fields(outputs, state)
        final = outputs[-1][0]
        if self.context.options.dump_dir:
            final.extra_fields[SampleFields.key("dump")] = await stage_trajectory(
                self.context, agent_data, [o for o, _ in outputs], kwargs
            )
        final.extra_fields[SampleFields.key("judge_context")] = await judge_context(self.context.options, kwargs, state)
        if self.context.options.export is Export.PER_TRAJECTORY:
            return final
        return [output for output, _ in outputs]

    def _image_features(self, sample: str) -> ImageFeatureStore | None:
        """The trajectory's images as the image processor saw them, and verl's builder rendering through them."""
        if not self.caches_images or self.context.processor is None:  # caching: the model sees images (a processor)
            return None
        features = ImageFeatureStore(self.context.processor, sample)
        self.continuous_token_builder.processor = features.processor  # type: ignore[attr-defined, unused-ignore]
        return features

    # ----- the state machine ----------------------------------------------------------------------------------

    async def _run_states(self, agent_data: LoopAgentData, state: TrajectoryState, sampling_params: dict) -> None:
        handlers = {
            LoopState.PENDING: lambda: self._handle_pending_state(agent_data, sampling_params),
            LoopState.GENERATING: lambda: self._handle_generating_state(agent_data, sampling_params),
            LoopState.TOOL_CALLS: lambda: self._answer_tools(agent_data, state, agent_data.tool_calls),
            LoopState.MALFORMED_CALLS: lambda: self._answer_tools(agent_data, state, []),
            LoopState.ENV_TURN: lambda: self._env_turn(agent_data, state),
        }
        step = LoopState.PENDING
        while step is not LoopState.TERMINATED:
            step = await handlers[step]()

    # This and the next: the mm_tool state machine's (LoopState, on the agent data prompt.new_agent_data built).
    async def _handle_pending_state(  # type: ignore[override, unused-ignore]
        self, agent_data: LoopAgentData, sampling_params: dict[str, Any]
    ) -> LoopState:
        """verl's pending state, rendering the conversation in the resolved tool format, after the image budget's
        check of the prompt's images."""
        state = attached_state(agent_data)
        if state.budget is not None:
            state.budget.admit_prompt_images(agent_data.image_data)
        schemas = agent_data._active_tool_schemas
        self._assert_mm_supported(bool(agent_data.image_data or agent_data.video_data or agent_data.audio_data))
        mm_inputs: dict = {}
        agent_data.prompt_ids = await self.ct_build_initial_tokens(
            self.context.tool_format.view(agent_data.messages, schemas),
            tools=self.context.tool_format.template_tools(schemas),  # type: ignore[arg-type, unused-ignore]  # verl's default is None
            images=agent_data.image_data,
            videos=agent_data.video_data,
            audios=agent_data.audio_data,  # type: ignore[arg-type, unused-ignore]  # verl's default is None
            mm_inputs_out=mm_inputs,
        )
        agent_data.mm_processor_output = self.build_sglang_video_payload(agent_data.video_data, mm_inputs)
        charge_prompt_videos(state, self.context.processor, mm_inputs)
        state.prompt_ids = list(agent_data.prompt_ids)
        context = self.context
        startup.require_visible_tools(
            context.decode(agent_data.prompt_ids), agent_data._active_tools, context.options, context.tool_format
        )
        return LoopState.GENERATING

    async def _handle_generating_state(  # type: ignore[override, unused-ignore]
        self, agent_data: LoopAgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> LoopState:
        """verl's generating state, within the response budget (so an output is never cut, nor an image in it),
        after starting a new training sample where ``export`` says so."""
        state = attached_state(agent_data)
        if len(agent_data.response_mask) >= self.response_length:
            return state.stop(StopReason.LENGTH_LIMIT)
        if state.turns and await self.exporter.new_sample(agent_data, state) is None:
            return state.stop(StopReason.LENGTH_LIMIT)  # the rendered history alone fills the response budget
        cast(CheckedEngine, self.server_manager).first_image = state.first_image  # the images in context
        tokens_left = self.response_length - len(agent_data.response_mask)
        limit = min(sampling_params.get("max_tokens") or tokens_left, tokens_left)
        turn = state.turn_from(agent_data)
        messages = len(agent_data.messages)
        verl_next = await super()._handle_generating_state(
            cast("AgentData", agent_data),  # verl's own: prompt.new_agent_data builds an AgentData
            {**sampling_params, "max_tokens": limit},
            ignore_termination,
        )
        self._record_turn(turn, agent_data, messages if len(agent_data.messages) > messages else None)
        return self._after_generation(agent_data, state, verl_next, ignore_termination)

    def _record_turn(self, turn: Turn, agent_data: LoopAgentData, message: int | None) -> None:
        generated = set(agent_data.response_ids) & self.context.forbidden_generated
        if generated:
            raise TrajectoryValidationError(f"the model generated vision placeholder tokens {sorted(generated)}")
        end = len(agent_data.response_mask)
        turn.response_span = (end - len(agent_data.response_ids), min(end, self.response_length))
        turn.text = self._generated_text(agent_data.response_ids)
        turn.message = message
        generation = cast(CheckedEngine, self.server_manager).generations[-1]  # set in __init__
        turn.cached_tokens = generation.cached_tokens
        turn.versions = generation.versions
        turn.resume_cost = generation.resume_cost
        turn.routed_experts = agent_data.routed_experts

    def _generated_text(self, token_ids: list[int]) -> str:
        """What the model wrote, as a chat server keeps it: special tokens and reasoning in, the end token out."""
        if token_ids and token_ids[-1] in self.end_of_turn:
            token_ids = token_ids[:-1]
        return self.context.decode(token_ids, skip_special_tokens=False)

    def _after_generation(
        self, agent_data: LoopAgentData, state: TrajectoryState, verl_next: AgentState, ignore_termination: bool
    ) -> LoopState:
        """Where the turn leads: its tool calls, an answer to its unparsable calls, the environment, or the end."""
        state.stats.last_assistant_text = self.context.decode(agent_data.response_ids, skip_special_tokens=True)
        attempted = self._attempted_calls(agent_data.response_ids)
        at_limit = self._at_limit(agent_data, ignore_termination)
        if verl_next == AgentState.PROCESSING_TOOLS or not at_limit:
            state.turns[-1].malformed_calls = max(0, attempted - len(agent_data.tool_calls))
            if verl_next == AgentState.PROCESSING_TOOLS:
                return LoopState.TOOL_CALLS
            if state.turns[-1].malformed_calls:
                return LoopState.MALFORMED_CALLS
        if not ignore_termination and len(agent_data.response_mask) >= self.response_length:
            return state.stop(StopReason.LENGTH_LIMIT)
        if attempted and at_limit:
            return state.stop(StopReason.TURN_LIMIT)
        if state.env is not None:
            state.stop_reason = StopReason.ANSWERED
            return LoopState.ENV_TURN  # the environment reacts to the answer
        return state.stop(StopReason.ANSWERED)

    def _attempted_calls(self, token_ids: list[int]) -> int:
        """Calls the model began, by the parser's own opening tag (Gemma 4's <|tool_call> is a special token)."""
        opening = getattr(self.tool_parser, "tool_call_start_token", None) or "<tool_call>"
        return self.context.decode(token_ids, skip_special_tokens=False).count(opening)

    def _at_limit(self, agent_data: LoopAgentData, ignore_termination: bool = False) -> bool:
        return (
            (not ignore_termination and len(agent_data.response_mask) >= self.response_length)
            or bool(self.max_assistant_turns and agent_data.assistant_turns >= self.max_assistant_turns)
            or bool(self.max_user_turns and agent_data.user_turns >= self.max_user_turns)
        )

    async def _answer_tools(self, agent_data: LoopAgentData, state: TrajectoryState, calls: list) -> LoopState:
        """A tool turn: the turn's calls run, and its unparsable calls answered, as one context turn."""
        checkpoint = Checkpoint.of(agent_data, state)
        with simple_timer("tool_calls", agent_data.metrics):
            answers = await self.tool_runner.run_turn(calls, state.turns[-1].malformed_calls, state, agent_data)
        if answers is None:  # over budget with over_budget=stop
            checkpoint.restore(agent_data, state)
            return state.stop(StopReason.BUDGET)
        after = await self._merge_context_turn(agent_data, state, checkpoint, answers.messages, answers.rewards)
        if answers.stop is not None:
            # after its answer (context tokens, trained on by nothing): the record shows the call that ended it; even
            # where that answer did not fit, that call is why the trajectory ends
            return state.stop(answers.stop)
        return after

    async def _env_turn(self, agent_data: LoopAgentData, state: TrajectoryState) -> LoopState:
        """The environment scores the answer; unless done (or out of turns), its observation is the next user turn."""
        if state.env is None:
            raise TypeError("an environment turn in a trajectory without an environment")
        observation, reward, done, info = await call_env(state.env.step, state.stats.last_assistant_text)
        state.stats.attempts += 1
        agent_data.turn_scores.append(float(reward))
        state.turns[-1].reward += float(reward)
        state.stats.env_infos.append(dict(info or {}))
        if done:
            return LoopState.TERMINATED
        if self._at_limit(agent_data):
            return state.stop(StopReason.TURN_LIMIT)
        checkpoint = Checkpoint.of(agent_data, state)
        observation = observation or Observation()
        content = self.tool_runner.content(list(observation.images), observation.text, [], state)
        if content is None:  # over budget with over_budget=stop
            checkpoint.restore(agent_data, state)
            return state.stop(StopReason.BUDGET)
        return await self._merge_context_turn(agent_data, state, checkpoint, [{"role": "user", "content": content}], [])

    async def _merge_context_turn(
        self, agent_data: LoopAgentData, state: TrajectoryState, checkpoint: Checkpoint, messages: list, rewards: list
    ) -> LoopState:
        """Append tool or environment messages as context tokens, or drop the whole turn when it does not fit."""
        schemas = agent_data._active_tool_schemas
        previous = self.context.tool_format.view(agent_data.messages[: checkpoint.messages], schemas)
        agent_data.messages.extend(messages)
        merge_result, response_mask, response_logprobs = await self.ct_merge_context_msg(
            previous,
            self.context.tool_format.view(agent_data.messages, schemas),
            agent_data.prompt_ids,
            agent_data.response_mask,
            agent_data.response_logprobs or None,
            tools=self.context.tool_format.template_tools(schemas),  # type: ignore[arg-type, unused-ignore]  # verl's default is None
        )
        if len(response_mask) >= self.response_length:
            # The whole tool turn is dropped, images included: never a partial image or a cut placeholder run.
            checkpoint.restore(agent_data, state)
            state.stats.dropped_turns += 1
            return state.stop(StopReason.LENGTH_LIMIT)
        agent_data.prompt_ids = merge_result.token_ids
        agent_data.response_mask = response_mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = response_logprobs or []
        agent_data.tool_rewards.extend(rewards)
        turn = state.turns[-1]
        turn.reward += sum(rewards)
        turn.images_added = list(range(checkpoint.images + 1, len(agent_data.image_data) + 1))  # ids are 1-based
        agent_data.user_turns += 1
        return LoopState.GENERATING


def _being_cancelled() -> bool:
    """Whether the running task was asked to cancel (Python 3.11+; on 3.10 every CancelledError counts as stray)."""
    task = asyncio.current_task()
    return bool(task is not None and getattr(task, "cancelling", lambda: 0)())
