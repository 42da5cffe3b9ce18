"""A trajectory's opening: the dataset row's messages made safe (``prompt_images``), verl's ``AgentData`` built as
verl's ToolAgentLoop builds it (per-sample tool selection included), the trajectory's state attached to it, and the
sample's environment reset, whose observation joins the prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from verl.experimental.agent_loop.tool_agent_loop import AgentData

from verl_mm_tools.agent_loop.agent_data import LoopAgentData
from verl_mm_tools.agent_loop.budget import ImageBudget
from verl_mm_tools.agent_loop.context import LoopContext
from verl_mm_tools.agent_loop.prompt_images import cheap_to_check, safe_messages
from verl_mm_tools.agent_loop.prompt_videos import video_sources
from verl_mm_tools.agent_loop.sessions import ToolSessions
from verl_mm_tools.agent_loop.state import TrajectoryState
from verl_mm_tools.envs import Sample, make_environment
from verl_mm_tools.envs.base import call as call_env
from verl_mm_tools.files import FileRoots
from verl_mm_tools.ops.text import valid_text
from verl_mm_tools.tokens import video_frame_sizes, video_placeholder_tokens
from verl_mm_tools.video import VideoSource
from verl_mm_tools.workspace import ImageWorkspace

if TYPE_CHECKING:
    from transformers import ProcessorMixin


async def new_agent_data(context: LoopContext, row: dict, priority: int, state: TrajectoryState) -> LoopAgentData:
    """verl's AgentData for the row, with ``state`` attached and set up for it."""
    # decoded, checked RGB images (paths read through the file roots), off the event loop as verl decodes
    # unless they are few small PIL images
    arguments = (list(row["raw_prompt"]), context.files, sample_name(row))
    videos: list[VideoSource] = []  # none where the check is cheap
    if cheap_to_check(arguments[0]):
        messages = safe_messages(*arguments)
    else:
        messages, videos = await asyncio.get_running_loop().run_in_executor(None, _checked_prompt, *arguments)
    multi_modal_data = await context.process_multi_modal_info(messages)
    # verl's AgentData; select_tools gives it the two tool fields LoopAgentData adds to the ones verl declares
    agent_data = cast(
        LoopAgentData,
        AgentData(
            messages=messages,
            image_data=list(multi_modal_data.get("images") or []),
            video_data=multi_modal_data.get("videos"),  # type: ignore[arg-type, unused-ignore]  # None without videos, as verl's loop
            audio_data=multi_modal_data.get("audios"),
            mm_processor_kwargs=context.mm_processor_kwargs(multi_modal_data.get("audios")),
            metrics={},
            request_id=context.new_request_id(priority),
            tools_kwargs=row.get("tools_kwargs") or {},
        ),
    )
    select_tools(agent_data, context.tools, (row.get("extra_info") or {}).get("tool_selection"))
    state.attach(agent_data)
    state.workspace = ImageWorkspace(agent_data.image_data)  # by reference: tools' images land in image_data
    state.videos = videos
    state.request_id = agent_data.request_id
    state.sessions = ToolSessions(agent_data._active_tools, agent_data.tools_kwargs)
    state.budget = ImageBudget(context.options, context.geometry) if context.geometry else None
    state.prompt_images = len(agent_data.image_data)
    return agent_data


def _checked_prompt(messages: list[dict], files: FileRoots, sample: str) -> tuple[list[dict], list[VideoSource]]:
    """The messages made safe, and their videos as tools read them."""
    safe = safe_messages(messages, files, sample)
    return safe, video_sources(safe)


def charge_prompt_videos(state: TrajectoryState, processor: ProcessorMixin | None, mm_inputs: dict) -> None:
    """Count the rendered prompt's video tokens (the processor's grids) and charge them to the budget."""
    if processor is None or mm_inputs.get("video_grid_thw") is None:
        return
    state.prompt_video_tokens = video_placeholder_tokens(processor, mm_inputs["video_grid_thw"])
    state.video_sizes = video_frame_sizes(processor, mm_inputs["video_grid_thw"])
    if state.budget is not None:
        state.budget.admit_prompt_videos(state.prompt_video_tokens)


def select_tools(agent_data: LoopAgentData, tools: dict, selection: Iterable[str] | None) -> None:
    """Per-sample tool selection (``extra_info.tool_selection``), as in verl's tool loop."""
    if selection and tools:
        tools = {name: tools[name] for name in selection if name in tools}
    agent_data._active_tools = tools
    agent_data._active_tool_schemas = [
        tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in tools.values()
    ]


async def start_environment(
    agent_data: LoopAgentData, row: dict, state: TrajectoryState, default_env: str | dict | None
) -> None:
    """Create and reset the sample's environment (``extra_info.env``, else the loop's ``env``); an observation
    from reset joins the prompt."""
    extra_info = row.get("extra_info") or {}
    spec = (extra_info.get("env") if isinstance(extra_info, dict) else None) or default_env
    if not spec:
        return
    state.env = make_environment(spec)
    sample = Sample.from_row(row, list(agent_data.image_data), files=state.files)
    observation = await call_env(state.env.reset, sample)
    if observation is not None and (observation.text or observation.images):
        # sized as the processor sizes them: the image the trajectory holds is the one the model sees (a GUI
        # environment's points refer to its pixels)
        images = [state.budget.sized(image) if state.budget else image for image in observation.images]
        content = [{"type": "image", "image": image} for image in images]
        text = valid_text(observation.text)
        agent_data.messages.append({"role": "user", "content": content + [{"type": "text", "text": text}]})
        agent_data.image_data.extend(images)
        state.prompt_images = len(agent_data.image_data)  # reset's images are part of the prompt


def sample_name(row: dict) -> str:
    """The row's index or uid, to name it in errors and logs."""
    extra_info = row.get("extra_info") or {}
    for key in ("index", "uid"):
        value = row.get(key, extra_info.get(key) if isinstance(extra_info, dict) else None)
        if value is not None:
            return str(value)
    return "<unknown>"
