"""One trajectory's state in the mm_tool loop: how it stopped, its turns as they ran, its counters, and the
per-trajectory objects (tool sessions, image budget, environment) the loop keeps beside verl's ``AgentData``.

Where to add things: a new way to stop is a ``StopReason`` member (the step metrics ``mm_tool/stop/<reason>`` list
every member); a per-turn fact is a ``Turn`` field, filled where the loop runs that turn.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from verl_mm_tools.envs.base import call as call_env
from verl_mm_tools.files import STATE_ATTR, FileRoots
from verl_mm_tools.rewards.common import ATTEMPTS_KEY, LAST_ASSISTANT_TEXT_KEY, TOOL_CALLS_KEY
from verl_mm_tools.workspace import ImageWorkspace, attach_tool_context

if TYPE_CHECKING:
    import numpy as np
    import torch

    from verl_mm_tools.agent_loop.agent_data import LoopAgentData
    from verl_mm_tools.agent_loop.budget import ImageBudget
    from verl_mm_tools.agent_loop.engine import WeightVersions
    from verl_mm_tools.agent_loop.image_features import ImageFeatureStore
    from verl_mm_tools.agent_loop.resumes import ResumeCost
    from verl_mm_tools.agent_loop.sessions import ToolSessions
    from verl_mm_tools.envs.base import Environment

    # MoE routing as verl's servers return it: (tokens, layers, top-k) expert ids; numpy from vLLM
    Routing = np.ndarray | torch.Tensor

logger = logging.getLogger(__name__)
# The trajectory's extra_fields: the same keys for every trajectory (verl concatenates per-key arrays across
# workers). ``tool_call_counts`` is the key verl's own ``compute_data_metrics`` reads; ``attempts`` and
# ``last_assistant_text`` are read by the reward managers; the ``mm_tool/*`` keys are aggregated per step by
# ``stats.aggregate_metrics``.
PREFIX = "mm_tool/"
STOP_REASON_KEY = PREFIX + "stop_reason"
TURN_REWARDS_KEY = PREFIX + "turn_rewards"
TURN_SPANS_KEY = PREFIX + "turn_spans"
TURNS_KEY = PREFIX + "turns"  # assistant turns (generations) in the output: the one turn count of logs and viewer
MASKED_KEY = PREFIX + "masked"
ERROR_KEY = PREFIX + "error"
PER_TOOL_KEY = PREFIX + "per_tool"
MASKED_LIMIT_KEY = PREFIX + "max_masked_fraction"  # the loop's max_masked_fraction, for the step hook's guard
CALL_RATE_WINDOW_KEY = PREFIX + "call_rate_window"  # the loop's call_rate_window, for the step hook's collapse guard
TURN_CREDIT_KEY = PREFIX + "turn_credit"  # whether the step hook places turn rewards (mm_turn_grpo)
TURN_GAMMA_KEY = PREFIX + "turn_gamma"  # algorithm.gamma: the per-turn discount, for chaining a trajectory's samples
# [index, count] of the output among its trajectory's training samples (export per_turn / auto); the trajectory's
# statistics count once, on its final sample (``is_final_sample``)
SAMPLE_KEY = PREFIX + "sample"
REQUEST_ID_KEY = PREFIX + "request_id"  # verl's request id of the trajectory: what its server calls were sent as
# from the second generation on, where the engine reports prefix-cache hits (``engine.CheckedEngine``): the prompt
# tokens sent and those the engine's prefix cache held (0 and 0 where it does not report them)
LATER_PROMPT_TOKENS_KEY = PREFIX + "later_prompt_tokens"
LATER_CACHED_TOKENS_KEY = PREFIX + "later_cached_tokens"
# weight versions (verl's fully async trainer, ``engine.WeightVersions``): [first, last] over the trajectory's
# generations (None where the engine reports none), its generations a weight sync interrupted and verl's client
# resumed (partial rollout), and those the engine aborted without a resume (the trajectory is masked)
WEIGHT_VERSIONS_KEY = PREFIX + "weight_versions"
RESUMED_KEY = PREFIX + "resumed_generations"
ABORTED_KEY = PREFIX + "aborted_generations"
# what the resumes cost the engine (``resumes.ResumeCost``, behind verl's resuming client): requests after a
# generation's first, the prompt tokens prefilled again for them and the images sent (and encoded) again
RESUMES_KEY = PREFIX + "resumes"
RESUME_PREFILL_KEY = PREFIX + "resume_prefill_tokens"
RESUME_IMAGES_KEY = PREFIX + "resume_images"
PROCESSOR_RUNS_KEY = PREFIX + "processor_runs"  # images the HF image processor processed in the rollout
# the bytes of image inputs a sample carries to the trainer (compact forms, or float pixel values for a family without
# one), and on a trajectory's last sample its distinct images by content digest, each with its raw bytes (3 per pixel;
# empty on its other samples): the step metric counts an image shown by several trajectories once
IMAGE_BYTES_KEY = PREFIX + "image_bytes"
FLOAT_IMAGES_KEY = PREFIX + "float_images"  # images kept as float pixel values: their family has no compact form
DISTINCT_IMAGES_KEY = PREFIX + "distinct_images"
# seconds a trajectory awaited the engine (verl's classic trainer logs the slowest as
# timing_s/agent_loop/generate_sequences/max; its v1 trainer drops the loops' timers, so mm_tool carries it)
GENERATE_S_KEY = PREFIX + "generate_s"


class LoopState(Enum):
    """The mm_tool loop's states: verl's ``AgentState`` with its tool state split by what answers the model."""

    PENDING = "pending"  # render the first prompt
    GENERATING = "generating"  # the model writes a turn
    TOOL_CALLS = "tool_calls"  # run the turn's tool calls (and answer its unparsable ones)
    MALFORMED_CALLS = "malformed_calls"  # no call of the turn parsed: answer each with how to write one
    ENV_TURN = "env_turn"  # the environment reacts to the model's answer
    TERMINATED = "terminated"


class StopReason(str, Enum):
    """Why a trajectory ended."""

    ANSWERED = "answered"  # the model answered without a tool call (and any environment was done with it)
    TURN_LIMIT = "turn_limit"  # it still wanted to act at max_assistant_turns / max_user_turns
    LENGTH_LIMIT = "length_limit"  # the response budget is used up (a turn that did not fit was dropped)
    BUDGET = "budget"  # an image did not fit the image budget with over_budget=stop
    # a tool's failed call ended it (its metrics' END_TRAJECTORY: the python tool's on_error: end), after that call's
    # answer; trained as usual
    TOOL_FAILED = "tool_failed"
    ERROR = "error"  # masked: trained on nothing (mm_tool/error says why)


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0
    time_s: float = 0.0
    remote_calls: int = 0  # answered by a Ray actor pool (``remote:``)


@dataclass
class TrajectoryStats:
    """The trajectory's counters."""

    per_tool: dict[str, ToolStats] = field(default_factory=lambda: defaultdict(ToolStats))
    invalid_actions: int = 0
    ignored_calls: int = 0
    images: int = 0
    image_tokens: int = 0
    budget_refusals: int = 0
    budget_downscales: int = 0
    dropped_turns: int = 0
    attempts: int = 0
    last_assistant_text: str = ""
    env_infos: list[dict] = field(default_factory=list)
    masked: bool = False
    error: str = ""
    aborted_generations: int = 0  # replies the engine aborted and nothing resumed (partial_rollout off)
    processor_runs: int = 0  # images the HF image processor processed during the rollout (1 per image: each once)
    sample_image_bytes: list[int] = field(default_factory=list)  # each sample's image inputs to the trainer, bytes
    distinct_images: dict[str, int] = field(default_factory=dict)  # content digest -> raw bytes (3 per pixel)
    float_images: int = 0  # images kept as float pixel values (a family without a compact form)
    generate_s: float = 0.0  # seconds spent awaiting the engine's generations (verl's generate_sequences timer)

    @property
    def tool_calls(self) -> int:
        return sum(stats.calls for stats in self.per_tool.values())

    @property
    def tool_errors(self) -> int:
        return sum(stats.errors for stats in self.per_tool.values())

    def record_call(self, tool_name: str, seconds: float, failed: bool, remote: bool = False) -> None:
        stats = self.per_tool[tool_name]
        stats.calls += 1
        stats.errors += int(failed)
        stats.time_s += seconds
        stats.remote_calls += int(remote)

    def to_extra_fields(self) -> dict:
        return {
            TOOL_CALLS_KEY: self.tool_calls,
            ATTEMPTS_KEY: max(1, self.attempts),  # answers given; read by the mm_turn_discount reward manager
            LAST_ASSISTANT_TEXT_KEY: self.last_assistant_text,
            PREFIX + "env_infos": list(self.env_infos),
            PREFIX + "tool_calls": self.tool_calls,
            PREFIX + "tool_errors": self.tool_errors,
            PREFIX + "tool_time_s": sum(stats.time_s for stats in self.per_tool.values()),
            PREFIX + "valid_actions": self.tool_calls - self.tool_errors,
            PREFIX + "invalid_actions": self.invalid_actions,
            PREFIX + "ignored_calls": self.ignored_calls,
            PREFIX + "images": self.images,
            PREFIX + "image_tokens": self.image_tokens,
            PROCESSOR_RUNS_KEY: self.processor_runs,
            FLOAT_IMAGES_KEY: self.float_images,
            GENERATE_S_KEY: self.generate_s,
            PREFIX + "budget_refusals": self.budget_refusals,
            PREFIX + "budget_downscales": self.budget_downscales,
            PREFIX + "dropped_turns": self.dropped_turns,
            MASKED_KEY: int(self.masked),
            ABORTED_KEY: self.aborted_generations,
            ERROR_KEY: self.error,
            PER_TOOL_KEY: {name: vars(stats).copy() for name, stats in self.per_tool.items()},
        }


@dataclass
class Turn:
    """One assistant turn, recorded while the loop runs it.

    ``prompt_end``: tokens of the whole conversation before the turn's generation (its prompt is
    ``prompt_ids[:prompt_end]``); ``images_before``: images those tokens hold; ``response_span``: [start, end) of
    the turn's generated tokens in the response; ``tool_calls``: names of the calls it made that were run;
    ``images_added``: ids of the images the tool or environment turn answering it added; ``reward``: tool step
    rewards plus the environment's reward for this turn; ``sample``: the training sample holding the turn (its
    ``prompt_end`` and ``response_span`` are in that sample's tokens; ``export``); ``text``: what the model wrote,
    special tokens and reasoning included, its end-of-turn token excluded; ``message``: the index of the assistant
    message the turn added (None when it added none: a turn cut by a limit); ``cached_tokens``: the prompt tokens
    the engine's prefix cache held for the turn's generation (None where the engine does not report them);
    ``versions``: the weight versions the generation ran under (``resumed`` where a weight sync interrupted it and
    verl's client resumed it; None where the engine reports no version); ``resume_cost``: what its resumes cost the
    engine (None behind a client that does not resume).
    """

    prompt_end: int
    images_before: int
    response_span: tuple[int, int] = (0, 0)
    tool_calls: list[str] = field(default_factory=list)
    images_added: list[int] = field(default_factory=list)
    reward: float = 0.0
    sample: int = 0
    text: str = ""
    message: int | None = None
    cached_tokens: int | None = None
    malformed_calls: int = 0
    routed_experts: Routing | None = None
    versions: WeightVersions | None = None
    resume_cost: ResumeCost | None = None


@dataclass
class SampleCut:
    """A finished training sample of a multi-sample export: the stream of tokens the loop ran, as it stood when the
    next sample started, cut after the sample's last generated token."""

    token_ids: list[int]  # prompt and response
    response_mask: list[int]  # over the tokens after the trajectory's first prompt length (the loop's convention)
    response_logprobs: list[float]
    images: int  # how many of the trajectory's images the tokens hold
    routed_experts: Routing | None = None  # the engine's MoE routing over the tokens (None unless it returns it)


@dataclass
class TrajectoryState:
    """Everything mm_tool tracks for one trajectory: the one thing the loop attaches to verl's ``AgentData``
    (``attach``, ``state_of``). Its ``workspace`` and ``files`` are what tools use (``workspace.ToolContext``)."""

    stats: TrajectoryStats = field(default_factory=TrajectoryStats)
    stop_reason: StopReason = StopReason.ANSWERED
    turns: list[Turn] = field(default_factory=list)
    sessions: ToolSessions | None = None  # once the trajectory's tools are known
    budget: ImageBudget | None = None  # None for a model that cannot see images
    env: Environment | None = None  # the trajectory's environment, until closed
    workspace: ImageWorkspace = field(default_factory=ImageWorkspace)  # ids over the trajectory's images
    files: FileRoots = field(default_factory=FileRoots)  # what tools and environments may read
    prompt_ids: list[int] = field(default_factory=list)  # the rendered first prompt (empty until rendered)
    prompt_images: int = 0  # images of the first prompt (dataset and environment reset)
    samples: list[SampleCut] = field(default_factory=list)  # finished samples; the current one is the loop's stream
    request_id: str = ""  # verl's, once the trajectory has one
    features: ImageFeatureStore | None = None  # each image's processor output (None for a model that sees none)

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_ids)

    def attach(self, agent_data: LoopAgentData) -> None:
        attach_tool_context(agent_data, self)

    async def release(self) -> None:
        """Release the tool sessions and close the environment, once, however the trajectory ended."""
        if self.sessions is not None:
            await self.sessions.release_all()
        env, self.env = self.env, None
        if env is not None:
            try:
                await call_env(env.close)
            except Exception:
                logger.warning("closing environment %r failed", type(env).__name__, exc_info=True)

    def stop(self, reason: StopReason) -> LoopState:
        self.stop_reason = reason
        return LoopState.TERMINATED

    def start_turn(self, prompt_end: int, images_before: int) -> Turn:
        turn = Turn(prompt_end=prompt_end, images_before=images_before, sample=len(self.samples))
        self.turns.append(turn)
        return turn

    def sample_turns(self, sample: int) -> list[Turn]:
        return [turn for turn in self.turns if turn.sample == sample]

    def mask(self, error: str) -> None:
        """The trajectory trains on nothing: its turns are gone from the output."""
        self.stats.masked, self.stats.error, self.stop_reason = True, error, StopReason.ERROR

    @property
    def output_turns(self) -> list[Turn]:
        """The turns the output holds: none for a masked trajectory, whose output holds none of their tokens."""
        return [] if self.stats.masked else self.turns

    def extra_fields(self, sample: int = 0, samples: int = 1, spans: list | None = None) -> dict:
        """The fixed-key ``extra_fields`` of output ``sample`` of ``samples``: the trajectory's statistics, and the
        turns that output holds (their rewards, and their response ``spans`` in it)."""
        turns = [turn for turn in self.output_turns if turn.sample == sample]
        if spans is None:
            spans = [list(turn.response_span) for turn in turns]
        return {
            **self.stats.to_extra_fields(),
            TURNS_KEY: len(self.output_turns),
            STOP_REASON_KEY: self.stop_reason.value,
            TURN_REWARDS_KEY: [turn.reward for turn in (turns if samples > 1 else self.turns)],
            TURN_SPANS_KEY: spans,
            SAMPLE_KEY: [sample, samples],
            IMAGE_BYTES_KEY: sum(self.stats.sample_image_bytes[sample : sample + 1]),  # 0 where no image was kept
            DISTINCT_IMAGES_KEY: dict(self.stats.distinct_images) if sample == samples - 1 else {},
            REQUEST_ID_KEY: self.request_id,
            **self._later_turn_cache(),
            **self._weight_versions(),
        }

    def _weight_versions(self) -> dict:
        """The weight versions the trajectory's generations ran under and what their resumes cost, masked
        trajectories' included."""
        versions = [turn.versions for turn in self.turns if turn.versions is not None]
        span = [min(v.first for v in versions), max(v.last for v in versions)] if versions else None
        costs = [turn.resume_cost for turn in self.turns if turn.resume_cost is not None]
        return {
            WEIGHT_VERSIONS_KEY: span,
            RESUMED_KEY: sum(v.resumed for v in versions),
            RESUMES_KEY: sum(cost.resumes for cost in costs),
            RESUME_PREFILL_KEY: sum(cost.prefilled_tokens for cost in costs),
            RESUME_IMAGES_KEY: sum(cost.images for cost in costs),
        }

    def _later_turn_cache(self) -> dict:
        """Prompt tokens of the generations after the first, and how many of them the prefix cache held (where the
        engine reported it): a multi-turn rollout should not recompute its history."""
        later = [turn for turn in self.turns[1:] if turn.cached_tokens is not None]
        return {
            LATER_PROMPT_TOKENS_KEY: sum(turn.prompt_end for turn in later),
            LATER_CACHED_TOKENS_KEY: sum(turn.cached_tokens for turn in later),
        }


def is_final_sample(sample) -> bool:
    """Whether an output's ``SAMPLE_KEY`` value marks its trajectory's final sample (or a one-sample trajectory)."""
    return sample is None or sample[0] == sample[1] - 1


def state_of(agent_data: Any) -> TrajectoryState | None:
    state = getattr(agent_data, STATE_ATTR, None)
    return state if isinstance(state, TrajectoryState) else None


def attached_state(agent_data: Any) -> TrajectoryState:
    """The state ``TrajectoryState.attach`` put on ``agent_data`` (``prompt.new_agent_data`` attaches it)."""
    state = state_of(agent_data)
    if state is None:
        raise TypeError(
            f"no mm_tool TrajectoryState attached to this {type(agent_data).__name__}; "
            "build it with agent_loop.prompt.new_agent_data"
        )
    return state


@dataclass(frozen=True)
class Checkpoint:
    """Where a tool or environment turn started: a dropped turn is rolled back to it, images and budget included."""

    messages: int
    images: int
    budget: tuple[int, int] | None

    @classmethod
    def of(cls, agent_data: LoopAgentData, state: TrajectoryState) -> Checkpoint:
        budget = (state.budget.images, state.budget.tokens) if state.budget else None
        return cls(len(agent_data.messages), len(agent_data.image_data), budget)

    def restore(self, agent_data: LoopAgentData, state: TrajectoryState) -> None:
        del agent_data.messages[self.messages :]
        state.workspace.truncate(self.images)
        if state.budget is not None and self.budget is not None:
            state.budget.images, state.budget.tokens = self.budget
