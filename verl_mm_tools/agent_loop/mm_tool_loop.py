"""The ``mm_tool`` agent loop: verl's ToolAgentLoop (state machine, Continuous-Token builder, tool parser) plus what
verl lacks for multimodal tool use:

- an image workspace: every image has a stable 1-based id; tools name earlier images by id;
- per-trajectory tool sessions (create once, execute on the same instance, release exactly once);
- an image budget (max images, pixel bounds, max image tokens), with downscale-or-refuse, never a partial image;
- failure isolation: any error ends only its own trajectory, as a valid output with a zeroed response mask;
- validation of every trajectory (lengths, image placeholders per image vs the processor, no generated vision tokens);
- tools that reach the model whatever its chat template (``tool_format``);
- one training sample per trajectory, per turn, or per prefix-stable stretch (``export``), so thinking templates
  that rewrite history train on what the model saw;
- the trajectory's state, turns and statistics in one object (``state.TrajectoryState``), carried into the batch as
  fixed-key extra fields.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf
from PIL import Image
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.function_tool import FunctionTool, normalize_function_tool_return
from verl.tools.schemas import ToolResponse
from verl.utils.profiler import simple_timer

from verl_mm_tools.agent_loop.budget import ImageBudget, ImageGeometry, Verdict
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.dump import stage_trajectory
from verl_mm_tools.agent_loop.engine import CheckedEngine, EngineAbortedError
from verl_mm_tools.agent_loop.export import collapse_runs, history_view
from verl_mm_tools.agent_loop.prompt_images import cheap_to_check, safe_messages
from verl_mm_tools.agent_loop.sessions import ToolSessions
from verl_mm_tools.agent_loop.state import (
    CALL_RATE_WINDOW_KEY,
    MASKED_LIMIT_KEY,
    STATE_ATTR,
    SampleCut,
    TURN_CREDIT_KEY,
    TURN_GAMMA_KEY,
    StopReason,
    TrajectoryState,
    state_of,
)
from verl_mm_tools.agent_loop.step_hook import (
    MANAGER_TQ_OVERRIDE,
    hook_overrides,
    multi_sample_manager_configured,
    refuse_unsupported_with_hook,
    require_step_hook,
    step_hook_configured,
    uses_v1_trainer,
)
from verl_mm_tools.agent_loop.tool_format import ToolFormat, resolve_tool_format, template_traits
from verl_mm_tools.agent_loop.validation import processor_image_tokens, token_id, trajectory_problems, vision_token_ids
from verl_mm_tools.envs import Observation, Sample, make_environment
from verl_mm_tools.envs.base import call as call_env
from verl_mm_tools.errors import (
    ConfigError,
    FileAccessError,
    ImageBudgetError,
    ImageInputError,
    TrajectoryValidationError,
    did_you_mean,
)
from verl_mm_tools.files import FILES_ATTR, FileRoots
from verl_mm_tools.ops.checks import show
from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME as TURN_CREDIT_ESTIMATOR
from verl_mm_tools.record import DUMP_KEY
from verl_mm_tools.remote.spec import REMOTE_ACTOR_METRIC
from verl_mm_tools.remote.tool import RemoteTool
from verl_mm_tools.workspace import WORKSPACE_ATTR, ImageWorkspace

logger = logging.getLogger(__name__)

# Constructor kwargs verl itself passes (hydra also forwards the YAML entry's ``name``); everything else is ours.
VERL_LOOP_KWARGS = frozenset(
    {"trainer_config", "server_manager", "tokenizer", "processor", "dataset_cls", "data_config", "hf_model_type",
     "tools", "name"}
)
MALFORMED_CALL_TEXT = (
    'Error: a tool call could not be parsed. Write each call as <tool_call>{"name": <tool name>, "arguments": '
    "{...}}</tool_call> with valid JSON."
)


@dataclass(frozen=True)
class _Checkpoint:
    """Where a tool or environment turn started: a dropped turn is rolled back to it, images and budget included."""

    messages: int
    images: int
    budget: tuple[int, int] | None

    @classmethod
    def of(cls, agent_data) -> _Checkpoint:
        budget = state_of(agent_data).budget
        return cls(len(agent_data.messages), len(agent_data.image_data), (budget.images, budget.tokens) if budget else None)

    def restore(self, agent_data) -> None:
        del agent_data.messages[self.messages :]
        getattr(agent_data, WORKSPACE_ATTR).truncate(self.images)
        if self.budget is not None:
            budget = state_of(agent_data).budget
            budget.images, budget.tokens = self.budget


class ToolCrashError(RuntimeError):
    """A tool raised instead of answering: the trajectory is masked (its tool responses cannot be trusted)."""


class MMToolAgentLoop(ToolAgentLoop):
    """Multimodal tool loop registered as ``mm_tool``. Options: see ``MMToolLoopConfig``."""

    def __init__(self, *args, **kwargs):
        options = {key: kwargs.pop(key) for key in list(kwargs) if key not in VERL_LOOP_KWARGS}
        super().__init__(*args, **kwargs)
        self.server_manager = CheckedEngine(self.server_manager)  # aborted replies raise; prefix-cache hits kept
        # select, not .get: DictConfig.get costs ~0.1 ms, and verl builds a loop per trajectory
        limit_images = OmegaConf.select(self.rollout_config, "limit_images", default=None)
        self.mm_config = MMToolLoopConfig.from_options(options, limit_images=limit_images)
        self.files = FileRoots.from_config(self.mm_config.file_roots)
        self.geometry = ImageGeometry.from_processor(self.processor, self.mm_processor_kwargs) if self._sees_images else None
        self.forbidden_generated = vision_token_ids(self.tokenizer)
        self.image_token_id = token_id(self.tokenizer, "<|image_pad|>") if self._sees_images else None
        self.turn_credit = _checked_step_hook(self.config, self.mm_config)
        # algorithm.gamma: the per-turn discount the step hook chains a trajectory's samples with (turn credit only)
        self.turn_gamma = float(OmegaConf.select(self.config, "algorithm.gamma", default=1.0)) if self.turn_credit else 1.0
        traits = template_traits(self.processor or self.tokenizer, self.apply_chat_template_kwargs)
        _check_export(self.config, self.mm_config.export, traits)
        self.tool_format = self._resolved_tool_format(traits)
        # the placeholder runs export=auto collapses to compare the stream with the template's text (verl builds a
        # loop per trajectory: nothing to look up otherwise)
        self.placeholder_ids = frozenset(
            token_id(self.tokenizer, token) for token in ("<|image_pad|>", "<|video_pad|>")
        ) if self._sees_images and self.mm_config.export == "auto" else frozenset()

    def _resolved_tool_format(self, traits) -> ToolFormat:
        if not self.tools:
            return ToolFormat(tool_prompt="off", response_role="tool")
        resolved = resolve_tool_format(
            self.mm_config.tool_prompt, self.mm_config.tool_response_role, traits, self.tool_parser_name
        )
        if resolved not in _logged_formats:
            _logged_formats.add(resolved)
            logger.info("mm_tool renders tools as %s (options tool_prompt=%s, tool_response_role=%s; %s)", resolved,
                        self.mm_config.tool_prompt, self.mm_config.tool_response_role, traits)
        return resolved

    @property
    def _sees_images(self) -> bool:
        return getattr(self.processor, "image_processor", None) is not None

    # ----- one trajectory -------------------------------------------------------------------------------------

    async def run(
        self, sampling_params: dict[str, Any], priority: int = 0, **kwargs
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One trajectory: its output, or with ``export`` per_turn / auto the list of its training samples."""
        state = TrajectoryState()
        agent_data = None
        try:
            agent_data = await self._new_agent_data(kwargs, priority, state)
            await _start_remote_tools(agent_data._active_tools)
            await self._start_environment(agent_data, kwargs)  # after agent_data exists: close() runs even if reset raises
            await self._run_states(agent_data, sampling_params)
            outputs = self._checked_outputs(agent_data, state)
        except (Exception, asyncio.CancelledError) as error:  # isolation: verl gathers without return_exceptions
            if isinstance(error, asyncio.CancelledError) and _being_cancelled():
                raise  # this trajectory is being cancelled; a stray CancelledError from a callee is masked instead
            outputs = [(self._masked_output(agent_data, state, error, kwargs), None)]
        finally:
            await self._release(state)
        for index, (output, spans) in enumerate(outputs):
            output.extra_fields.update(state.extra_fields(index, len(outputs), spans))
            output.extra_fields[MASKED_LIMIT_KEY] = self.mm_config.max_masked_fraction
            output.extra_fields[CALL_RATE_WINDOW_KEY] = self.mm_config.call_rate_window
            output.extra_fields[TURN_CREDIT_KEY] = self.turn_credit
            output.extra_fields[TURN_GAMMA_KEY] = self.turn_gamma
            if self.mm_config.dump_dir:
                output.extra_fields[DUMP_KEY] = None
        final = outputs[-1][0]
        if self.mm_config.dump_dir:
            final.extra_fields[DUMP_KEY] = await stage_trajectory(self, agent_data, [o for o, _ in outputs], kwargs)
        if self.mm_config.export == "per_trajectory":
            return final
        return [output for output, _ in outputs]

    async def _release(self, state: TrajectoryState) -> None:
        """Release tool sessions and close the environment, once, however the trajectory ended."""
        if state.sessions is not None:
            await state.sessions.release_all()
        env, state.env = state.env, None
        if env is not None:
            try:
                await call_env(env.close)
            except Exception:
                logger.warning("closing environment %r failed", type(env).__name__, exc_info=True)

    async def _new_agent_data(self, kwargs: dict, priority: int, state: TrajectoryState) -> AgentData:
        # decoded, checked RGB images (paths read through the file roots), off the event loop as verl decodes
        # unless they are few small PIL images
        arguments = (list(kwargs["raw_prompt"]), self.files, _sample_name(kwargs))
        if cheap_to_check(arguments[0]):
            messages = safe_messages(*arguments)
        else:
            messages = await asyncio.get_running_loop().run_in_executor(None, safe_messages, *arguments)
        multi_modal_data = await self.process_multi_modal_info(messages)
        agent_data = AgentData(
            messages=messages,
            image_data=list(multi_modal_data.get("images") or []),
            video_data=multi_modal_data.get("videos"),
            audio_data=multi_modal_data.get("audios"),
            mm_processor_kwargs=self._get_mm_processor_kwargs(multi_modal_data.get("audios")),
            metrics={},
            request_id=self._make_request_id(priority, self.rollout_config.full_determinism),
            tools_kwargs=kwargs.get("tools_kwargs") or {},
        )
        self._select_tools(agent_data, (kwargs.get("extra_info") or {}).get("tool_selection"))
        setattr(agent_data, WORKSPACE_ATTR, ImageWorkspace(agent_data.image_data))
        setattr(agent_data, FILES_ATTR, self.files)  # what tools may read: files_of(agent_data)
        setattr(agent_data, STATE_ATTR, state)
        state.request_id = agent_data.request_id
        state.sessions = ToolSessions(agent_data._active_tools, agent_data.tools_kwargs)
        state.budget = ImageBudget(self.mm_config, self.geometry) if self.geometry else None
        state.prompt_images = len(agent_data.image_data)
        return agent_data

    async def _start_environment(self, agent_data: AgentData, row: dict) -> None:
        """Create and reset the sample's environment; an observation from reset joins the prompt."""
        extra_info = row.get("extra_info") or {}
        spec = extra_info.get("env") if isinstance(extra_info, dict) else None
        spec = spec or self.mm_config.env
        if not spec:
            return
        state = state_of(agent_data)
        state.env = make_environment(spec)
        sample = Sample.from_row(row, list(agent_data.image_data), files=self.files)
        observation = await call_env(state.env.reset, sample)
        if observation is not None and (observation.text or observation.images):
            content = [{"type": "image", "image": image} for image in observation.images]
            agent_data.messages.append({"role": "user", "content": content + [{"type": "text", "text": observation.text}]})
            agent_data.image_data.extend(observation.images)
            state.prompt_images = len(agent_data.image_data)  # reset's images are part of the prompt

    def _select_tools(self, agent_data: AgentData, selection) -> None:
        """Per-sample tool selection (``extra_info.tool_selection``), as in verl's tool loop."""
        tools = self.tools
        if selection and self.tools:
            tools = {name: self.tools[name] for name in selection if name in self.tools}
        agent_data._active_tools = tools
        agent_data._active_tool_schemas = [
            tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in tools.values()
        ]

    async def _run_states(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> None:
        handlers = {
            AgentState.PENDING: lambda: self._handle_pending_state(agent_data, sampling_params),
            AgentState.GENERATING: lambda: self._handle_generating_state(agent_data, sampling_params),
            AgentState.PROCESSING_TOOLS: lambda: (
                self._handle_env_turn(agent_data) if state_of(agent_data).env_pending
                else self._handle_processing_tools_state(agent_data)
            ),
        }
        state = AgentState.PENDING
        while state != AgentState.TERMINATED:
            state = await handlers[state]()

    # ----- states ---------------------------------------------------------------------------------------------

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        state = state_of(agent_data)
        if state.budget is not None:
            state.budget.count_prompt_images(agent_data.image_data)
            problem = state.budget.prompt_problem
            if problem:
                raise ImageBudgetError(f"{problem}; raise the mm_tool budget or shrink the dataset images")
        # verl's pending state, rendering the conversation in the resolved tool format
        schemas = agent_data._active_tool_schemas
        self._assert_mm_supported(bool(agent_data.image_data or agent_data.video_data or agent_data.audio_data))
        mm_inputs = {}
        agent_data.prompt_ids = await self.ct_build_initial_tokens(
            self.tool_format.view(agent_data.messages, schemas),
            tools=self.tool_format.template_tools(schemas),
            images=agent_data.image_data,
            videos=agent_data.video_data,
            audios=agent_data.audio_data,
            mm_inputs_out=mm_inputs,
        )
        agent_data.mm_processor_output = self.build_sglang_video_payload(agent_data.video_data, mm_inputs)
        state.prompt_ids = list(agent_data.prompt_ids)
        self._require_visible_tools(agent_data)
        return AgentState.GENERATING

    def _require_visible_tools(self, agent_data: AgentData) -> None:
        """A tool the first prompt never names cannot be called: a configuration error, not a dead tool loop."""
        text = self.tokenizer.decode(agent_data.prompt_ids)
        missing = sorted(name for name in agent_data._active_tools if not re.search(rf"\b{re.escape(name)}\b", text))
        if missing:
            raise ConfigError(
                f"the tools {missing} are configured but appear nowhere in the first prompt the model sees "
                f"(mm_tool tool_prompt={self.mm_config.tool_prompt!r}, resolved to {self.tool_format.tool_prompt!r}): "
                "the model cannot know they exist. Set tool_prompt: auto (mm_tool adds the tool schemas to the "
                "system message when the chat template ignores them) or describe the tools in the dataset's prompt."
            )

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        state = state_of(agent_data)
        tokens_left = self.response_length - len(agent_data.response_mask)
        if tokens_left <= 0:
            state.stop_reason = StopReason.LENGTH_LIMIT
            return AgentState.TERMINATED
        if state.turns and await self._history_rewritten(agent_data) and not await self._start_sample(agent_data):
            state.stop_reason = StopReason.LENGTH_LIMIT  # the rendered history alone fills the response budget
            return AgentState.TERMINATED
        tokens_left = self.response_length - len(agent_data.response_mask)
        # Never generate past the response budget: the output is then never cut, so no image is ever cut off.
        limit = min(sampling_params.get("max_tokens") or tokens_left, tokens_left)
        turn = state.start_turn(prompt_end=len(agent_data.prompt_ids), images_before=len(agent_data.image_data))
        messages = len(agent_data.messages)
        next_state = await super()._handle_generating_state(agent_data, {**sampling_params, "max_tokens": limit})
        turn.cached_tokens = self.server_manager.cached_tokens[-1]
        end = len(agent_data.response_mask)
        turn.response_span = (end - len(agent_data.response_ids), min(end, self.response_length))
        turn.text = self._generated_text(agent_data.response_ids)
        turn.message = messages if len(agent_data.messages) > messages else None
        generated = set(agent_data.response_ids) & self.forbidden_generated
        if generated:
            raise TrajectoryValidationError(f"the model generated vision placeholder tokens {sorted(generated)}")
        return self._after_generation(agent_data, next_state)

    def _generated_text(self, token_ids: list[int]) -> str:
        """What the model wrote, as a chat server keeps it: special tokens and reasoning in, the end token out."""
        if token_ids and token_ids[-1] == self.tokenizer.eos_token_id:
            token_ids = token_ids[:-1]
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    # ----- training samples (``export``) ----------------------------------------------------------------------

    async def _history_rewritten(self, agent_data: AgentData) -> bool:
        """Whether the next turn starts a new training sample (see ``export``)."""
        export = self.mm_config.export
        if export != "auto":
            return export == "per_turn"
        rendered = await self.loop.run_in_executor(None, self._rendered_text, agent_data)
        stream = collapse_runs(agent_data.prompt_ids, self.placeholder_ids)
        return rendered != self.tokenizer.decode(stream, skip_special_tokens=False)

    def _history_messages(self, agent_data: AgentData) -> list[dict]:
        """The conversation as the chat template renders it at inference: generated turns from their text."""
        texts = {turn.message: turn.text for turn in state_of(agent_data).turns if turn.message is not None}
        return self.tool_format.view(history_view(agent_data.messages, texts), agent_data._active_tool_schemas)

    def _rendered_text(self, agent_data: AgentData) -> str:
        from verl.utils.tokenizer.chat_template import apply_chat_template

        return apply_chat_template(
            self.processor or self.tokenizer, self._history_messages(agent_data), tokenize=False,
            add_generation_prompt=True, tools=self.tool_format.template_tools(agent_data._active_tool_schemas),
            **self.apply_chat_template_kwargs,
        )

    async def _start_sample(self, agent_data: AgentData) -> bool:
        """End the current sample after its last generated token and continue from the template's render of the
        whole conversation; False (nothing changed) when that render leaves no room to generate. The tokens after
        the first prompt's length count as the response, so the response budget and verl's own length checks hold
        for every sample, and a sample is never longer than prompt_length + response_length."""
        state = state_of(agent_data)
        mm_inputs = {}
        schemas = agent_data._active_tool_schemas
        messages = self._history_messages(agent_data)
        # the builder itself, not verl's ct_build_initial_tokens, which caps a prompt at rollout.prompt_length
        rendered = await self.loop.run_in_executor(None, lambda: self.continuous_token_builder.build_initial_tokens(
            messages, tools=self.tool_format.template_tools(schemas), images=agent_data.image_data,
            videos=agent_data.video_data, audios=agent_data.audio_data, mm_inputs_out=mm_inputs,
        ))
        history = len(rendered) - state.prompt_length
        if history < 0:
            raise TrajectoryValidationError(
                f"the chat template rendered the conversation in {len(rendered)} tokens, fewer than its first prompt "
                f"({state.prompt_length}): mm_tool export={self.mm_config.export!r} cannot place it"
            )
        if history >= self.response_length:
            return False
        last = state.turns[-1]
        end = last.response_span[1]
        state.samples.append(SampleCut(agent_data.prompt_ids[: state.prompt_length + end], agent_data.response_mask[:end],
                                       list(agent_data.response_logprobs[:end]), last.images_before))
        agent_data.prompt_ids = rendered
        agent_data.mm_processor_output = self.build_sglang_video_payload(agent_data.video_data, mm_inputs)
        agent_data.response_mask = [0] * history
        if agent_data.response_logprobs:
            agent_data.response_logprobs = [0.0] * history
        return True

    def _after_generation(self, agent_data: AgentData, next_state: AgentState) -> AgentState:
        state = state_of(agent_data)
        text = self.tokenizer.decode(agent_data.response_ids, skip_special_tokens=True)
        state.stats.last_assistant_text = text
        attempted = text.count("<tool_call>")
        if next_state == AgentState.PROCESSING_TOOLS or not self._at_limit(agent_data):
            state.malformed_calls = max(0, attempted - len(agent_data.tool_calls))
            if state.malformed_calls:
                return AgentState.PROCESSING_TOOLS
        if next_state == AgentState.TERMINATED:
            state.stop_reason = self._stop_reason(agent_data, attempted)
            if state.stop_reason is StopReason.ANSWERED and state.env is not None:
                state.env_pending = True  # the environment reacts to the answer
                return AgentState.PROCESSING_TOOLS
        return next_state

    def _at_limit(self, agent_data: AgentData) -> bool:
        return (
            len(agent_data.response_mask) >= self.response_length
            or bool(self.max_assistant_turns and agent_data.assistant_turns >= self.max_assistant_turns)
            or bool(self.max_user_turns and agent_data.user_turns >= self.max_user_turns)
        )

    def _stop_reason(self, agent_data: AgentData, attempted_calls: int) -> StopReason:
        if len(agent_data.response_mask) >= self.response_length:
            return StopReason.LENGTH_LIMIT
        if attempted_calls and self._at_limit(agent_data):
            return StopReason.TURN_LIMIT
        return StopReason.ANSWERED

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = state_of(agent_data)
        checkpoint = _Checkpoint.of(agent_data)
        calls = agent_data.tool_calls[: self.max_parallel_calls]
        ignored = len(agent_data.tool_calls) - len(calls)
        state.stats.ignored_calls += ignored
        state.turns[-1].tool_calls = [call.name for call in calls]

        new_messages, rewards = [], []
        with simple_timer("tool_calls", agent_data.metrics):
            # Sequential, so image ids are deterministic and a call may use an image made by an earlier one.
            for call in calls:
                response, reward = await self._execute(call, agent_data)
                message = self._tool_message(call, response, agent_data)
                if message is None:  # over budget with over_budget=stop
                    checkpoint.restore(agent_data)
                    state.stop_reason = StopReason.BUDGET
                    return AgentState.TERMINATED
                new_messages.append(message)
                rewards.append(reward)
        state.stats.invalid_actions += state.malformed_calls
        new_messages += [{"role": "tool", "content": MALFORMED_CALL_TEXT}] * state.malformed_calls
        # every call is answered: a call past max_parallel_calls the model is never told about looks executed
        new_messages += [{"role": "tool", "content": self._ignored_call_text()}] * ignored
        state.malformed_calls = 0
        return await self._merge_context_turn(agent_data, checkpoint, new_messages, rewards)

    def _ignored_call_text(self) -> str:
        return (f"Error: only {self.max_parallel_calls} tool call(s) per turn are run, so this call was not run; "
                "make it again in a later turn.")

    async def _merge_context_turn(self, agent_data, checkpoint: _Checkpoint, new_messages: list, rewards: list):
        """Append tool or environment messages as context tokens, or drop the whole turn when it does not fit."""
        schemas = agent_data._active_tool_schemas
        previous = self.tool_format.view(agent_data.messages[: checkpoint.messages], schemas)
        agent_data.messages.extend(new_messages)
        merge_result, response_mask, response_logprobs = await self.ct_merge_context_msg(
            previous,
            self.tool_format.view(agent_data.messages, schemas),
            agent_data.prompt_ids,
            agent_data.response_mask,
            agent_data.response_logprobs or None,
            tools=self.tool_format.template_tools(schemas),
        )
        state = state_of(agent_data)
        if len(response_mask) >= self.response_length:
            # The whole tool turn is dropped, images included: never a partial image or a cut placeholder run.
            checkpoint.restore(agent_data)
            state.stats.dropped_turns += 1
            state.stop_reason = StopReason.LENGTH_LIMIT
            return AgentState.TERMINATED
        agent_data.prompt_ids = merge_result.token_ids
        agent_data.response_mask = response_mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = response_logprobs or []
        rewards = [float(reward) for reward in rewards if reward is not None]
        agent_data.tool_rewards.extend(rewards)
        turn = state.turns[-1]
        turn.reward += sum(rewards)
        turn.images_added = list(range(checkpoint.images + 1, len(agent_data.image_data) + 1))  # ids are 1-based
        agent_data.user_turns += 1
        return AgentState.GENERATING

    async def _handle_env_turn(self, agent_data: AgentData) -> AgentState:
        """The environment scores the answer; unless done (or out of turns), its observation is the next user turn."""
        state = state_of(agent_data)
        state.env_pending = False
        observation, reward, done, info = await call_env(state.env.step, state.stats.last_assistant_text)
        state.stats.attempts += 1
        agent_data.turn_scores.append(float(reward))
        state.turns[-1].reward += float(reward)
        state.stats.env_infos.append(dict(info or {}))
        if done:
            return AgentState.TERMINATED
        if self._at_limit(agent_data):
            state.stop_reason = StopReason.TURN_LIMIT
            return AgentState.TERMINATED
        checkpoint = _Checkpoint.of(agent_data)
        observation = observation or Observation()
        content = self._content(list(observation.images), observation.text, [], agent_data)
        if content is None:  # over budget with over_budget=stop
            checkpoint.restore(agent_data)
            state.stop_reason = StopReason.BUDGET
            return AgentState.TERMINATED
        state.stop_reason = StopReason.ANSWERED
        return await self._merge_context_turn(agent_data, checkpoint, [{"role": "user", "content": content}], [])

    # ----- tools ----------------------------------------------------------------------------------------------

    async def _execute(self, call: FunctionCall, agent_data: AgentData) -> tuple[ToolResponse, float | None]:
        """Run one call on the trajectory's tool session. Model mistakes become text; a raising tool raises."""
        stats = state_of(agent_data).stats
        tools = agent_data._active_tools
        if call.name not in tools:
            stats.invalid_actions += 1
            hint = did_you_mean(call.name, tools)
            # the name is cut short: a long one would push the list of tools past the response truncation
            text = f"Error: unknown tool {show(call.name)}; available tools: {sorted(tools)}.{hint}"
            return ToolResponse(text=text), None
        arguments = _parse_arguments(call.arguments)
        if isinstance(arguments, str):
            stats.invalid_actions += 1
            return ToolResponse(text=f"Error: arguments of {call.name!r} {arguments}"), None
        started = time.perf_counter()
        invocation = self._invoke(call.name, arguments, agent_data)
        task = await _finished_or_cancelled(invocation, self.mm_config.tool_timeout_s)
        if task is None:
            stats.record_call(call.name, time.perf_counter() - started, failed=True)
            seconds = self.mm_config.tool_timeout_s
            return ToolResponse(text=f"Error: tool {call.name!r} took longer than {seconds:g} s and was cancelled"), None
        try:
            response, reward, metrics = task.result()
        except (Exception, asyncio.CancelledError) as error:  # the tool's own, TimeoutError and CancelledError too
            stats.record_call(call.name, time.perf_counter() - started, failed=True)
            raise ToolCrashError(f"tool {call.name!r} raised {type(error).__name__}: {error}") from error
        metrics = metrics if isinstance(metrics, dict) else {}
        stats.record_call(call.name, time.perf_counter() - started, failed=bool(metrics.get("error")),
                          remote=REMOTE_ACTOR_METRIC in metrics)
        return response, reward

    async def _invoke(self, tool_name: str, arguments: dict, agent_data: AgentData):
        tool = agent_data._active_tools[tool_name]
        if isinstance(tool, FunctionTool):
            return normalize_function_tool_return(await tool.call(arguments))
        instance_id = await state_of(agent_data).sessions.instance_id(tool_name)
        return await tool.execute(instance_id, arguments, agent_data=agent_data)

    def _tool_message(self, call: FunctionCall, response: ToolResponse, agent_data: AgentData) -> dict | None:
        """The tool-role message of one call. None when the budget says stop."""
        images = response.image if isinstance(response.image, list) else [response.image] if response.image else []
        notes = ["videos from tools are not supported and were dropped"] if response.video else []
        content = self._content(images, response.text or "", notes, agent_data)
        if content is None:
            return None
        message: dict[str, Any] = {"role": "tool", "content": content}
        if call.tool_call_id is not None:
            message["tool_call_id"] = call.tool_call_id
        return message

    def _content(self, images: list, text: str, notes: list[str], agent_data: AgentData) -> list | str | None:
        """Message content: the admitted images (each added to the workspace) then the text, with image ids and
        notes on what the budget did. None when the budget says stop."""
        state = state_of(agent_data)
        content, new_ids = [], []
        for image in images:
            if not isinstance(image, Image.Image):
                notes.append(f"the tool returned a {type(image).__name__} instead of an image; it was dropped")
                continue
            if state.budget is None:
                notes.append("this model cannot see images; the tool's image was dropped")
                continue
            admission = state.budget.admit(image)
            state.stats.budget_refusals += admission.verdict in (Verdict.REFUSED, Verdict.STOP)
            state.stats.budget_downscales += admission.verdict is Verdict.DOWNSCALED
            if admission.verdict is Verdict.STOP:
                return None
            if admission.note:
                notes.append(admission.note)
            if admission.admitted:
                new_ids.append(getattr(agent_data, WORKSPACE_ATTR).add(admission.image))
                content.append({"type": "image", "image": admission.image})
        text = self._response_text(text, images, new_ids, notes)
        return content + [{"type": "text", "text": text}] if content else text

    def _response_text(self, text: str, images: list, new_ids: list[int], notes: list[str]) -> str:
        if images and not new_ids:
            text = ""  # the tool's text describes an image the model will not see
        elif self.mm_config.annotate_image_ids:
            unnamed = [image_id for image_id in new_ids if f"Image {image_id}" not in text]
            text = "".join(f"Image {image_id}. " for image_id in unnamed) + text
        text = self._truncate(text)
        if notes:
            text = (text + "\n" if text else "") + "Note: " + "; ".join(notes) + "."
        return text

    def _truncate(self, text: str) -> str:
        """verl's ``max_tool_response_length`` truncation, applied to the tool's own text."""
        limit = self.max_tool_response_length
        if len(text) <= limit:
            return text
        if self.tool_response_truncate_side == "left":
            return "(truncated)..." + text[-limit:]
        if self.tool_response_truncate_side == "right":
            return text[:limit] + "...(truncated)"
        return text[: limit // 2] + "...(truncated)..." + text[-(limit // 2) :]

    # ----- output ---------------------------------------------------------------------------------------------

    def _checked_outputs(self, agent_data: AgentData, state: TrajectoryState) -> list[tuple[AgentLoopOutput, list]]:
        """Each training sample as a validated output, with its turns' response spans in it."""
        excess = agent_data.response_mask[self.response_length :]
        if not all(excess):  # only generated tokens may be trimmed: context tokens may hold image placeholders
            raise TrajectoryValidationError(
                f"the response holds {len(agent_data.response_mask)} tokens, more than response_length="
                f"{self.response_length}, and the excess is not only generated text"
            )
        current = SampleCut(agent_data.prompt_ids, agent_data.response_mask, agent_data.response_logprobs,
                            len(agent_data.image_data))
        image_tokens = self._image_tokens(agent_data.image_data, agent_data.mm_processor_kwargs)
        outputs = []
        for index, sample in enumerate([*state.samples, current]):
            output, spans = self._output(agent_data, sample, state.sample_turns(index))
            problems = self._problems(output, image_tokens[: sample.images])
            if problems:
                raise TrajectoryValidationError(f"training sample {index + 1}: " + "; ".join(problems))
            outputs.append((output, spans))
        state.stats.images, state.stats.image_tokens = len(agent_data.image_data), sum(image_tokens)
        return outputs

    def _image_tokens(self, images: list, mm_processor_kwargs: dict) -> list[int]:
        if not self._sees_images:
            return []
        return [processor_image_tokens(self.processor, image, mm_processor_kwargs) for image in images]

    def _problems(self, output: AgentLoopOutput, image_tokens: list[int]) -> list[str]:
        return trajectory_problems(
            prompt_ids=output.prompt_ids,
            response_ids=output.response_ids,
            response_mask=output.response_mask,
            response_logprobs=output.response_logprobs,
            image_tokens=image_tokens,
            image_token_id=self.image_token_id,
            forbidden_generated=self.forbidden_generated,
        )

    def _output(self, agent_data: AgentData, sample: SampleCut, turns: list) -> tuple[AgentLoopOutput, list]:
        """One training sample: its prompt is everything before its first turn's generation (the first prompt for
        a one-sample trajectory); returns it with its turns' response spans in it."""
        limit = self.response_length
        first = len(sample.token_ids) - len(sample.response_mask)  # where the loop's response part begins
        split = turns[0].prompt_end if turns else first
        shift = split - first  # response tokens before the sample's first generation, now prompt
        logprobs = sample.response_logprobs[shift:limit] if sample.response_logprobs else None
        images = agent_data.image_data[: sample.images]
        output = AgentLoopOutput(
            prompt_ids=sample.token_ids[:split],
            response_ids=sample.token_ids[first:][:limit][shift:],
            response_mask=sample.response_mask[:limit][shift:],
            response_logprobs=logprobs,
            multi_modal_data={"images": images} if images else {},
            mm_processor_kwargs=agent_data.mm_processor_kwargs,
            num_turns=agent_data.user_turns + agent_data.assistant_turns + 1,
            metrics=agent_data.metrics,
            extra_fields={
                **agent_data.extra_fields,
                "turn_scores": agent_data.turn_scores,
                "tool_rewards": agent_data.tool_rewards,
            },
        )
        return output, [[start - shift, end - shift] for start, end in (turn.response_span for turn in turns)]

    def _masked_output(self, agent_data, state: TrajectoryState, error: Exception, sample: dict) -> AgentLoopOutput:
        """A valid output that trains on nothing: the prompt as rendered (or a text stand-in) and one masked token."""
        if isinstance(error, ConfigError):
            raise error  # a broken configuration must stop the run, not mask every sample
        state.mask(f"{type(error).__name__}: {error}")
        logger.warning(
            "mm_tool: masked the trajectory of sample %s (%s)", _sample_name(sample), state.stats.error,
            exc_info=not isinstance(
                error, (TrajectoryValidationError, ImageBudgetError, ToolCrashError, ImageInputError, FileAccessError,
                        EngineAbortedError)
            ),
        )
        output = self._prompt_only_output(agent_data, state)
        if output is None:
            notice = "This sample was dropped by verl-mm-tools; see mm_tool/error."
            output = self._masked(self.tokenizer.encode(notice, add_special_tokens=False)[-self.prompt_length :], [], agent_data)
        state.stats.images = len(output.multi_modal_data.get("images", []))
        return output

    def _prompt_only_output(self, agent_data: AgentData | None, state: TrajectoryState) -> AgentLoopOutput | None:
        """The rendered prompt with its own images, if it was rendered and is sound."""
        if agent_data is None or not state.prompt_length:
            return None
        images = agent_data.image_data[: state.prompt_images]
        output = self._masked(state.prompt_ids, images, agent_data)
        image_tokens = self._image_tokens(images, agent_data.mm_processor_kwargs)
        return None if self._problems(output, image_tokens) else output

    def _masked(self, prompt_ids: list[int], images: list, agent_data) -> AgentLoopOutput:
        # verl concatenates rollout log-probs across the batch: all samples have them or none does.
        logprobs = [0.0] if self.rollout_config.calculate_log_probs else None
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids),
            response_ids=[self.tokenizer.eos_token_id],
            response_mask=[0],
            response_logprobs=logprobs,
            multi_modal_data={"images": list(images)} if images else {},
            mm_processor_kwargs=getattr(agent_data, "mm_processor_kwargs", None),
            num_turns=1,
            metrics=getattr(agent_data, "metrics", {}),
            extra_fields={"turn_scores": [], "tool_rewards": []},
        )


CANCEL_GRACE_S = 1.0
_logged_formats: set[ToolFormat] = set()  # each resolved tool format is logged once per process
# (id of the trainer config, dump_dir) -> (the config, kept alive so its id is never reused; turn credit)
_checked_configs: dict[tuple[int, str | None], tuple[Any, bool]] = {}


def _checked_step_hook(trainer_config, options: MMToolLoopConfig) -> bool:
    """Whether the run uses turn credit. Dumps and turn credit need the trainer-side step hook; without it, say
    once what the run lacks. Once per config: verl builds a loop per trajectory."""
    key = (id(trainer_config), options.dump_dir)
    if key not in _checked_configs:
        turn_credit = trainer_config.algorithm.get("adv_estimator") == TURN_CREDIT_ESTIMATOR
        refuse_unsupported_with_hook(trainer_config)
        if options.dump_dir:
            require_step_hook(trainer_config, "mm_tool dump_dir")
        if turn_credit:
            require_step_hook(trainer_config, f"algorithm.adv_estimator={TURN_CREDIT_ESTIMATOR}")
        if not step_hook_configured(trainer_config):
            logger.warning("mm_tool runs without verl-mm-tools' step hook: no mm_tool/* step metrics and no "
                           "masked-batch guard. Set %s", " ".join(hook_overrides(trainer_config)))
        _checked_configs[key] = (trainer_config, turn_credit)
    return _checked_configs[key][1]


# (id of the trainer config, export) -> the config, kept alive so its id is never reused
_checked_exports: dict[tuple[int, str], Any] = {}


def _check_export(trainer_config, export: str, traits) -> None:
    """Several samples per trajectory need verl's v1 trainer and our v1 manager; a template that rewrites history
    deserves per_turn (said once). Once per config: verl builds a loop per trajectory."""
    key = (id(trainer_config), export)
    if key in _checked_exports:
        return
    if export != "per_trajectory" and not uses_v1_trainer(trainer_config):
        raise ConfigError(
            f"mm_tool export={export!r} returns several training samples per trajectory, which only verl's v1 trainer "
            "takes (trainer.use_v1=true, verl's default); this run uses the classic trainer (trainer.use_v1=false). "
            "Use the v1 trainer, or export: per_trajectory."
        )
    if export != "per_trajectory" and not multi_sample_manager_configured(trainer_config):
        raise ConfigError(
            f"mm_tool export={export!r} returns several samples per trajectory, and verl 0.9.1's v1 agent-loop worker "
            "crashes scoring several samples of a Qwen-VL model (it stacks their (4, L) position ids along the wrong "
            f"dimension). Add {MANAGER_TQ_OVERRIDE} (verl's manager, scoring the final sample alone)."
        )
    _checked_exports[key] = trainer_config
    if export == "per_trajectory" and not traits.prefix_stable:
        logger.warning(
            "mm_tool: the chat template drops earlier reasoning from the history once a new user turn arrives (as "
            "Qwen3-VL Thinking's does), so with export=per_trajectory the model trains on contexts it would not see "
            "at inference. Set export: per_turn (one sample per turn, each the template's own render) or auto."
        )


def _being_cancelled() -> bool:
    """Whether the running task was asked to cancel (Python 3.11+; on 3.10 every CancelledError counts as stray)."""
    task = asyncio.current_task()
    return bool(task is not None and getattr(task, "cancelling", lambda: 0)())


async def _start_remote_tools(tools: dict) -> None:
    """Remote tools' actors started before the first turn: their start never counts against tool_timeout_s."""
    for tool in tools.values():
        if isinstance(tool, RemoteTool):
            await tool.start()


async def _finished_or_cancelled(coroutine, timeout_s: float) -> asyncio.Task | None:
    """The finished task of a tool call, or None when it ran past ``timeout_s`` and was cancelled.

    Unlike ``asyncio.wait_for``, the tool's own TimeoutError or CancelledError stays the tool's (in the task), and a
    tool that ignores cancellation is abandoned after ``CANCEL_GRACE_S`` instead of hanging the trajectory.
    """
    task = asyncio.ensure_future(coroutine)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())  # no "never retrieved" warnings
    try:
        finished, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:  # the trajectory itself is being cancelled: take the call down with it
        task.cancel()
        raise
    if finished:
        return task
    task.cancel()
    finished, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    if not finished:
        logger.warning("a tool call ignored its cancellation for %g s and was abandoned", CANCEL_GRACE_S)
    return None


def _parse_arguments(raw: str) -> dict | str:
    """The call's arguments as a dict, or a sentence saying what was wrong with them."""
    try:
        arguments = json.loads(raw)
    except (TypeError, ValueError) as error:
        return f"are not valid JSON ({error}); received {raw!r:.200}"
    if not isinstance(arguments, dict):
        return f"must be a JSON object, received {type(arguments).__name__} {raw!r:.200}"
    return arguments


def _sample_name(sample: dict) -> str:
    extra_info = sample.get("extra_info") or {}
    for key in ("index", "uid"):
        value = sample.get(key, extra_info.get(key) if isinstance(extra_info, dict) else None)
        if value is not None:
            return str(value)
    return "<unknown>"
