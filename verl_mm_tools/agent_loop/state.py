"""One trajectory's state in the mm_tool loop: how it stopped, its turns as they ran, its counters, and the
per-trajectory objects (tool sessions, image budget, environment) the loop keeps beside verl's ``AgentData``.

Where to add things: a new way to stop is a ``StopReason`` member (the step metrics ``mm_tool/stop/<reason>`` list
every member); a per-turn fact is a ``Turn`` field, filled where the loop runs that turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from verl_mm_tools.envs.base import call as call_env
from verl_mm_tools.files import STATE_ATTR, FileRoots
from verl_mm_tools.handoff import LoopSettings, SampleFields, StopReason, ToolStats
from verl_mm_tools.ops.transform import distinct_image_bytes
from verl_mm_tools.video import VideoSource
from verl_mm_tools.workspace import ImageWorkspace, attach_tool_context

if TYPE_CHECKING:
    import numpy as np
    import torch

    from verl_mm_tools.agent_loop.agent_data import LoopAgentData
    from verl_mm_tools.agent_loop.budget import ImageBudget
    from verl_mm_tools.agent_loop.engine import WeightVersions
    from verl_mm_tools.agent_loop.image_features import ImageFeatureStore
    from verl_mm_tools.agent_loop.loop_output import MMToolOutput
    from verl_mm_tools.agent_loop.resumes import ResumeCost
    from verl_mm_tools.agent_loop.sessions import ToolSessions
    from verl_mm_tools.envs.base import Environment

    # MoE routing as verl's servers return it: (tokens, layers, top-k) expert ids; numpy from vLLM
    Routing = np.ndarray | torch.Tensor

logger = logging.getLogger(__name__)


class LoopState(Enum):
    """The mm_tool loop's states: verl's ``AgentState`` with its tool state split by what answers the model."""

    PENDING = "pending"  # render the first prompt
    GENERATING = "generating"  # the model writes a turn
    TOOL_CALLS = "tool_calls"  # run the turn's tool calls (and answer its unparsable ones)
    MALFORMED_CALLS = "malformed_calls"  # no call of the turn parsed: answer each with how to write one
    ENV_TURN = "env_turn"  # the environment reacts to the model's answer
    TERMINATED = "terminated"


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
    videos_before: int = 0  # videos those tokens hold (the prompt's, then tools')
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


@dataclass(frozen=True)
class ToolVideo:
    """A tool's video the loop showed: its id, the turn whose calls it answered, its frames' times and shown size
    (the processor's), and its placeholder tokens."""

    video_id: int
    turn: int
    times_s: tuple[float, ...]
    width: int
    height: int
    tokens: int


@dataclass
class SampleCut:
    """A finished training sample of a multi-sample export: the stream of tokens the loop ran, as it stood when the
    next sample started, cut after the sample's last generated token."""

    token_ids: list[int]  # prompt and response
    response_mask: list[int]  # over the tokens after the trajectory's first prompt length (the loop's convention)
    response_logprobs: list[float]
    images: int  # the tokens hold the trajectory's images before this one: image_data[first_image:images]
    routed_experts: Routing | None = None  # the engine's MoE routing over the tokens (None unless it returns it)
    first_image: int = 0  # the images before it left the context (``keep_last_images``)
    videos: int | None = None  # the tokens hold the trajectory's videos video_data[:videos] (None: all of them)


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
    videos: list[VideoSource] = field(default_factory=list)  # the prompt's videos, checked, then tools': Video 1 first
    prompt_ids: list[int] = field(default_factory=list)  # the rendered first prompt (empty until rendered)
    prompt_images: int = 0  # images of the first prompt (dataset and environment reset)
    prompt_video_tokens: int = 0  # the placeholder tokens of the first prompt's videos (the processor's count)
    video_sizes: list[tuple[int, int]] = field(default_factory=list)  # each prompt video's frame size, as shown
    tool_videos: list[ToolVideo] = field(default_factory=list)  # the videos of tool answers shown, in order
    samples: list[SampleCut] = field(default_factory=list)  # finished samples; the current one is the loop's stream
    first_image: int = 0  # the current sample's first image in context: the earlier ones left it (keep_last_images)
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

    async def hand_images(self, outputs: Sequence[MMToolOutput]) -> None:
        """Give each output the trajectory's image store (verl's postprocess takes each sample's images from it) and
        count what the outputs carry."""
        features, stats = self.features, self.stats
        if features is None:
            return
        stats.processor_runs, stats.float_images = features.runs, features.floats
        images = [(output.multi_modal_data or {}).get("images") or [] for output in outputs]
        stats.sample_image_bytes = [features.payload_bytes(sample) for sample in images]
        # every sample's (with keep_last_images the final one holds only the last few), each object once
        held = list({id(image): image for sample in images for image in sample}.values())
        # off the event loop (hashing releases the GIL): 16 images of 1024 px took ~100 ms of it
        stats.distinct_images = await asyncio.to_thread(distinct_image_bytes, held)
        for output in outputs:
            output.hand_images(features)

    def stop(self, reason: StopReason) -> LoopState:
        self.stop_reason = reason
        return LoopState.TERMINATED

    def start_turn(self, prompt_end: int, images_before: int, videos_before: int = 0) -> Turn:
        turn = Turn(prompt_end, images_before, videos_before, sample=len(self.samples))
        self.turns.append(turn)
        return turn

    def turn_from(self, agent_data: LoopAgentData) -> Turn:
        """A new turn, its generation starting where the conversation stands."""
        videos = len(agent_data.video_data or [])
        return self.start_turn(len(agent_data.prompt_ids), len(agent_data.image_data), videos)

    def sample_video_tokens(self, videos: int | None) -> int:
        """The video placeholder tokens of a sample holding the first ``videos`` videos (None: all)."""
        prompt_videos = len(self.videos) - len(self.tool_videos)
        shown = self.tool_videos if videos is None else self.tool_videos[: max(0, videos - prompt_videos)]
        return self.prompt_video_tokens + sum(video.tokens for video in shown)

    def sample_turns(self, sample: int) -> list[Turn]:
        return [turn for turn in self.turns if turn.sample == sample]

    def mask(self, error: str) -> None:
        """The trajectory trains on nothing: its turns are gone from the output."""
        self.stats.masked, self.stats.error, self.stop_reason = True, error, StopReason.ERROR

    @property
    def output_turns(self) -> list[Turn]:
        """The turns the output holds: none for a masked trajectory, whose output holds none of their tokens."""
        return [] if self.stats.masked else self.turns

    def sample_fields(
        self, settings: LoopSettings, sample: int = 0, samples: int = 1, spans: list[list[int]] | None = None
    ) -> SampleFields:
        """What output ``sample`` of ``samples`` hands the trainer: the trajectory's statistics, the turns that output
        holds (their rewards, and their response ``spans`` in it) and the loop's ``settings``."""
        stats, turns = self.stats, [turn for turn in self.output_turns if turn.sample == sample]
        versions = [turn.versions for turn in self.turns if turn.versions is not None]
        costs = [turn.resume_cost for turn in self.turns if turn.resume_cost is not None]
        # the prompts of the generations after the first: a multi-turn rollout should not recompute its history
        later = [turn for turn in self.turns[1:] if turn.cached_tokens is not None]
        return SampleFields(
            **vars(settings),
            tool_call_counts=stats.tool_calls,
            attempts=max(1, stats.attempts),
            last_assistant_text=stats.last_assistant_text,
            turns=len(self.output_turns),
            tool_calls=stats.tool_calls,
            tool_errors=stats.tool_errors,
            tool_time_s=sum(tool.time_s for tool in stats.per_tool.values()),
            valid_actions=stats.tool_calls - stats.tool_errors,
            invalid_actions=stats.invalid_actions,
            ignored_calls=stats.ignored_calls,
            per_tool={name: vars(tool).copy() for name, tool in stats.per_tool.items()},
            env_infos=list(stats.env_infos),
            stop_reason=self.stop_reason.value,
            masked=int(stats.masked),
            error=stats.error,
            dropped_turns=stats.dropped_turns,
            images=stats.images,
            image_tokens=stats.image_tokens,
            budget_refusals=stats.budget_refusals,
            budget_downscales=stats.budget_downscales,
            processor_runs=stats.processor_runs,
            float_images=stats.float_images,
            generate_s=stats.generate_s,
            later_prompt_tokens=sum(turn.prompt_end for turn in later),
            later_cached_tokens=sum(turn.cached_tokens or 0 for turn in later),
            weight_versions=[min(v.first for v in versions), max(v.last for v in versions)] if versions else None,
            resumed_generations=sum(v.resumed for v in versions),
            aborted_generations=stats.aborted_generations,
            resumes=sum(cost.resumes for cost in costs),
            resume_prefill_tokens=sum(cost.prefilled_tokens for cost in costs),
            resume_images=sum(cost.images for cost in costs),
            request_id=self.request_id,
            sample=[sample, samples],
            turn_rewards=[turn.reward for turn in (turns if samples > 1 else self.turns)],
            turn_spans=[list(turn.response_span) for turn in turns] if spans is None else spans,
            image_bytes=sum(stats.sample_image_bytes[sample : sample + 1]),  # 0 where no image was kept
            distinct_images=dict(stats.distinct_images) if sample == samples - 1 else {},
        )


def state_of(agent_data: object) -> TrajectoryState | None:
    state = getattr(agent_data, STATE_ATTR, None)
    return state if isinstance(state, TrajectoryState) else None


def attached_state(agent_data: object) -> TrajectoryState:
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
    videos: int = 0  # the trajectory's videos (``state.videos``)
    tool_videos: int = 0
    video_payload: object = None  # verl's SGLang video payload (``mm_processor_output``), which tool videos extend

    @classmethod
    def of(cls, agent_data: LoopAgentData, state: TrajectoryState) -> Checkpoint:
        videos, tool_videos, payload = len(state.videos), len(state.tool_videos), agent_data.mm_processor_output
        return cls(len(agent_data.messages), len(agent_data.image_data), videos, tool_videos, payload)

    def restore(self, agent_data: LoopAgentData, state: TrajectoryState) -> None:
        del agent_data.messages[self.messages :]
        state.workspace.truncate(self.images)
        if state.budget is not None:
            state.budget.truncate(self.images, self.tool_videos)
        dropped = len(state.tool_videos) - self.tool_videos
        if dropped and agent_data.video_data:
            del agent_data.video_data[len(agent_data.video_data) - dropped :]
            agent_data.video_data = agent_data.video_data or None  # verl's: None without videos
        agent_data.mm_processor_output = self.video_payload  # type: ignore[assignment]  # the value it had
        del state.videos[self.videos :]
        del state.video_sizes[self.videos :]
        del state.tool_videos[self.tool_videos :]
