"""One tool turn of the mm_tool loop: run the turn's calls on the trajectory's tool sessions (sequentially, each
with a timeout and real cancellation), and turn each answer into a message the model will see: images admitted by
the image budget (each added to the workspace, never a partial one), text truncated as verl truncates it, and notes
on what was dropped or downscaled, all of it valid text (``ops.text.valid_text``: a lone surrogate or a control
character from any tool or environment would make the tokenizer raise or reach the model as nothing). Model mistakes
(unknown tool, bad JSON, unparsable call) become text for the model; a tool that raises raises ``ToolCrashError``,
which masks the trajectory. A failed call whose metrics set ``END_TRAJECTORY`` ends the turn there: it is answered,
the calls after it are not run (each answered so), and the loop ends the trajectory (``StopReason.TOOL_FAILED``),
which trains as usual. A call whose metrics set ``EPISODE_DONE`` (its environment's episode is over) ends it the same
way (``StopReason.EPISODE_DONE``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from PIL import Image
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.function_tool import FunctionTool, normalize_function_tool_return
from verl.tools.schemas import ToolResponse

from verl_mm_tools.agent_loop.budget import Verdict
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.state import TrajectoryState
from verl_mm_tools.agent_loop.tool_videos import ToolVideos, VideoAnswer
from verl_mm_tools.errors import did_you_mean
from verl_mm_tools.handoff import StopReason
from verl_mm_tools.ops.argument_checks import show
from verl_mm_tools.ops.text import valid_text
from verl_mm_tools.remote.spec import REMOTE_ACTOR_METRIC
from verl_mm_tools.remote.tool import RemoteTool
from verl_mm_tools.tools.base import END_TRAJECTORY, EPISODE_DONE

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.agent_data import LoopAgentData

logger = logging.getLogger(__name__)

T = TypeVar("T")

CANCEL_GRACE_S = 1.0  # how long a cancelled tool call may take to stop before it is abandoned
MALFORMED_CALL_TEXT = (
    'Error: a tool call could not be parsed. Write each call as <tool_call>{"name": <tool name>, "arguments": '
    "{...}}</tool_call> with valid JSON."
)
# for the other call formats (GLM's, Qwen3-Coder's, Gemma 4's): the template's own tool instructions show the format
MALFORMED_CALL_TEXT_OTHER_FORMATS = (
    "Error: a tool call could not be parsed. Write each call exactly in the tool-call format of your instructions."
)


# the name a tool message answering an unparsable call carries (templates that name each result, Gemma 4's, show it)
UNPARSED_CALL_NAME = "unparsed_call"


def malformed_call_text(parser: str) -> str:
    """What an unparsable call is answered with, for verl's tool parser ``multi_turn.format``."""
    return MALFORMED_CALL_TEXT if parser == "hermes" else MALFORMED_CALL_TEXT_OTHER_FORMATS


class ToolCrashError(RuntimeError):
    """A tool raised instead of answering: the trajectory is masked (its tool responses cannot be trusted)."""


class CallAnswer(NamedTuple):
    """One call's answer: the tool's response and reward, and why the trajectory ends with it (None: it goes on)."""

    response: ToolResponse
    reward: float | None  # None: the call did not run
    ends: StopReason | None = None


@dataclass
class ToolTurn:
    """What a tool turn answers: a message per call run (in call order), then one per call not run after a call that
    ended the trajectory, one per unparsable call, one per call past max_parallel_calls; the rewards of the calls
    run; the tool whose call ended the trajectory (None when none did) and why it ended."""

    messages: list[dict] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    ended_by: str | None = None
    stop: StopReason | None = None


@dataclass(frozen=True)
class ToolRunner:
    """Runs tool turns for one loop: the mm_tool options and verl's ``multi_turn`` limits."""

    config: MMToolLoopConfig
    max_parallel_calls: int
    max_response_length: int  # verl's max_tool_response_length, in characters
    truncate_side: str  # verl's tool_response_truncate_side: left, right or middle
    parser: str = "hermes"  # verl's multi_turn.format: what an unparsable call is told
    videos: ToolVideos | None = None  # shows tools' videos (None: each is dropped with a note)

    async def run_turn(
        self, calls: list[FunctionCall], malformed: int, state: TrajectoryState, agent_data: LoopAgentData
    ) -> ToolTurn | None:
        """The turn's answers; None when an image does not fit the budget with over_budget=stop."""
        run = calls[: self.max_parallel_calls]
        ignored = len(calls) - len(run)
        state.stats.ignored_calls += ignored
        state.turns[-1].tool_calls = [call.name for call in run]
        turn = ToolTurn()
        # Sequential, so image ids are deterministic and a call may use an image made by an earlier one.
        for position, call in enumerate(run):
            response, reward, ends = await self.execute(call, state, agent_data)
            message = self.tool_message(call, response, state, agent_data)
            if message is None:
                return None
            turn.messages.append(message)
            if reward is not None:
                turn.rewards.append(float(reward))
            if ends is not None:
                turn.ended_by, turn.stop = call.name, ends
                state.turns[-1].tool_calls = [ran.name for ran in run[: position + 1]]
                turn.messages += self._not_run_after_end(run[position + 1 :], call.name, ends, state)
                break
        state.stats.invalid_actions += malformed
        unparsed = {"role": "tool", "name": UNPARSED_CALL_NAME, "content": malformed_call_text(self.parser)}
        turn.messages += [dict(unparsed) for _ in range(malformed)]
        # every call is answered: a call past max_parallel_calls the model is never told about looks executed
        turn.messages += [
            {"role": "tool", "name": call.name, "content": self._ignored_call_text()} for call in calls[len(run) :]
        ]
        return turn

    @staticmethod
    def _not_run_after_end(
        calls: list[FunctionCall], ended_by: str, reason: StopReason, state: TrajectoryState
    ) -> list[dict]:
        """Answers to the calls after the one that ended the trajectory (counted as ignored): every call is
        answered, so the record shows none of them as run."""
        state.stats.ignored_calls += len(calls)
        text = (
            f"Error: this call was not run: the task ended with the {ended_by!r} call before it."
            if reason is StopReason.EPISODE_DONE
            else f"Error: this call was not run: the failed {ended_by!r} call before it ended the conversation."
        )
        return [{"role": "tool", "name": call.name, "content": text} for call in calls]

    def _ignored_call_text(self) -> str:
        return (
            f"Error: only {self.max_parallel_calls} tool call(s) per turn are run, so this call was not run; "
            "make it again in a later turn."
        )

    async def execute(self, call: FunctionCall, state: TrajectoryState, agent_data: LoopAgentData) -> CallAnswer:
        """Run one call on the trajectory's tool session. Model mistakes become text; a raising tool raises."""
        stats, tools = state.stats, agent_data._active_tools
        if call.name not in tools:
            stats.invalid_actions += 1
            hint = did_you_mean(call.name, tools)
            # the name is cut short: a long one would push the list of tools past the response truncation
            text = f"Error: unknown tool {show(call.name)}; available tools: {sorted(tools)}.{hint}"
            return CallAnswer(ToolResponse(text=text), None)
        arguments = parse_arguments(call.arguments)
        if isinstance(arguments, str):
            stats.invalid_actions += 1
            return CallAnswer(ToolResponse(text=f"Error: arguments of {call.name!r} {arguments}"), None)
        started = time.perf_counter()
        task = await finished_or_cancelled(
            self._invoke(call.name, arguments, state, agent_data), self.config.tool_timeout_s
        )
        if task is None:
            stats.record_call(call.name, time.perf_counter() - started, failed=True)
            seconds = self.config.tool_timeout_s
            text = f"Error: tool {call.name!r} took longer than {seconds:g} s and was cancelled"
            return CallAnswer(ToolResponse(text=text), None)
        try:
            response, reward, metrics = task.result()
        except (Exception, asyncio.CancelledError) as error:  # the tool's own, TimeoutError and CancelledError too
            stats.record_call(call.name, time.perf_counter() - started, failed=True)
            raise ToolCrashError(f"tool {call.name!r} raised {type(error).__name__}: {error}") from error
        metrics = metrics if isinstance(metrics, dict) else {}
        stats.record_call(
            call.name,
            time.perf_counter() - started,
            failed=bool(metrics.get("error")),
            remote=REMOTE_ACTOR_METRIC in metrics,
        )
        return CallAnswer(response, reward, _stop_reason(metrics))

    @staticmethod
    async def _invoke(
        tool_name: str, arguments: dict, state: TrajectoryState, agent_data: LoopAgentData
    ) -> tuple[ToolResponse, float, dict]:
        tool = agent_data._active_tools[tool_name]
        if isinstance(tool, FunctionTool):
            return normalize_function_tool_return(await tool.call(arguments))
        assert state.sessions is not None, "the loop opens the trajectory's tool sessions before its first turn"
        instance_id = await state.sessions.instance_id(tool_name)
        return await tool.execute(instance_id, arguments, agent_data=agent_data)

    def tool_message(
        self, call: FunctionCall, response: ToolResponse, state: TrajectoryState, agent_data: LoopAgentData
    ) -> dict | None:
        """The tool-role message of one call. None when the budget says stop."""
        images = response.image if isinstance(response.image, list) else [response.image] if response.image else []
        videos = self._videos(response, state, agent_data)
        if videos.stop:
            return None
        text = response.text or ""
        if response.video and not videos.parts:
            text = ""  # the tool's text describes a video the model will not see; the notes say why
        content = self.content(images, text, videos.notes, state, videos.parts)
        if content is None:
            return None
        # named: a template that renders each result under its call's name (Gemma 4's) needs it
        message: dict[str, Any] = {"role": "tool", "name": call.name, "content": content}
        if call.tool_call_id is not None:
            message["tool_call_id"] = call.tool_call_id
        return message

    def _videos(self, response: ToolResponse, state: TrajectoryState, agent_data: LoopAgentData) -> VideoAnswer:
        videos = response.video if isinstance(response.video, list) else [response.video] if response.video else []
        if not videos:
            return VideoAnswer([], [])
        if self.videos is None:
            return VideoAnswer([], ["this loop shows no video from a tool; the tool's video was dropped"])
        return self.videos.answer(videos, state, agent_data)

    def content(
        self, images: list, text: str, notes: list[str], state: TrajectoryState, videos: list[dict] | None = None
    ) -> list | str | None:
        """Message content: the admitted images (each added to the workspace), the admitted ``videos`` (content
        parts), then the text, with image ids and notes on what the budget did. None when the budget says stop."""
        videos = videos or []
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
            if admission.image is not None:  # admitted
                new_ids.append(state.workspace.add(admission.image))
                content.append({"type": "image", "image": admission.image})
        text = valid_text(self._response_text(text, images, new_ids, notes))
        content += videos
        return content + [{"type": "text", "text": text}] if content else text

    def _response_text(self, text: str, images: list, new_ids: list[int], notes: list[str]) -> str:
        if images and not new_ids:
            text = ""  # the tool's text describes an image the model will not see
        elif self.config.annotate_image_ids:
            unnamed = [image_id for image_id in new_ids if f"Image {image_id}" not in text]
            text = "".join(f"Image {image_id}. " for image_id in unnamed) + text
        text = self.truncate(text)
        if notes:
            text = (text + "\n" if text else "") + "Note: " + "; ".join(notes) + "."
        return text

    def truncate(self, text: str) -> str:
        """verl's ``max_tool_response_length`` truncation, applied to the tool's own text."""
        limit = self.max_response_length
        if len(text) <= limit:
            return text
        if self.truncate_side == "left":
            return "(truncated)..." + text[-limit:]
        if self.truncate_side == "right":
            return text[:limit] + "...(truncated)"
        return text[: limit // 2] + "...(truncated)..." + text[-(limit // 2) :]


def _stop_reason(metrics: dict) -> StopReason | None:
    """Why a call's metrics end the trajectory: a failure with ``END_TRAJECTORY``, an episode's end with
    ``EPISODE_DONE``; None: it goes on."""
    if metrics.get(END_TRAJECTORY):
        return StopReason.TOOL_FAILED
    if metrics.get(EPISODE_DONE):
        return StopReason.EPISODE_DONE
    return None


async def start_remote_tools(tools: dict) -> None:
    """Remote tools' actors started before the first turn: their start never counts against tool_timeout_s."""
    for tool in tools.values():
        if isinstance(tool, RemoteTool):
            await tool.start()


async def finished_or_cancelled(coroutine: Awaitable[T], timeout_s: float) -> asyncio.Task[T] | None:
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


def parse_arguments(raw: str) -> dict | str:
    """The call's arguments as a dict, or a sentence saying what was wrong with them."""
    try:
        arguments = json.loads(raw)
    except (TypeError, ValueError) as error:
        return f"are not valid JSON ({error}); received {raw!r:.200}"
    if not isinstance(arguments, dict):
        return f"must be a JSON object, received {type(arguments).__name__} {raw!r:.200}"
    return arguments
