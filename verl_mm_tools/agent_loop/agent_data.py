"""``LoopAgentData``: what the mm_tool loop and its parts read and write of verl's ``AgentData``
(``verl.experimental.agent_loop.tool_agent_loop``), as a ``typing.Protocol``.

verl's class is the object at run time (``prompt.new_agent_data`` builds it); the protocol names the fields the loop
relies on, so a change to them in verl shows up here, and test doubles (a ``SimpleNamespace`` with these fields) fit.
``_active_tools`` and ``_active_tool_schemas`` are not declared by verl's class: its ToolAgentLoop sets them per
sample, and so does ``prompt.select_tools``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from PIL import Image
    from verl.experimental.agent_loop.tool_parser import FunctionCall


class LoopAgentData(Protocol):
    """One trajectory's conversation and token stream, as verl's ``AgentData`` holds them."""

    # the conversation and its media
    messages: list[dict[str, Any]]
    image_data: list[Image.Image]
    video_data: Any  # verl: list of (frames, metadata), None without videos
    audio_data: list[Any] | None
    mm_processor_kwargs: dict[str, Any]
    mm_processor_output: list[dict[str, Any]] | None
    tools_kwargs: dict[str, Any]
    request_id: str
    metrics: dict[str, Any]

    # the token stream
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    routed_experts: Any

    # turns, calls and rewards
    user_turns: int
    assistant_turns: int
    tool_calls: list[FunctionCall]
    turn_scores: list[float]
    tool_rewards: list[float]
    extra_fields: dict[str, Any]

    # the sample's tools (set per sample; see the module docstring)
    _active_tools: dict[str, Any]  # name -> verl tool (a BaseTool, or a FunctionTool)
    _active_tool_schemas: list[dict[str, Any]]
