"""The ``mm_tool`` agent loop: verl's ToolAgentLoop plus an image workspace that tools resolve image ids in."""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

from verl_mm_tools.workspace import WORKSPACE_ATTR, ImageWorkspace

logger = logging.getLogger(__name__)


class MMToolAgentLoop(ToolAgentLoop):
    """Multimodal tool loop registered as ``mm_tool``."""

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        if agent_data.image_data is None:
            agent_data.image_data = []
        setattr(agent_data, WORKSPACE_ATTR, ImageWorkspace(agent_data.image_data))
        return await super()._handle_pending_state(agent_data, sampling_params)
