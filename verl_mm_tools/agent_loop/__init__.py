"""The mm_tool agent loop."""

from verl_mm_tools.agent_loop.mm_tool_loop import MMToolAgentLoop

__all__ = ["MMToolAgentLoop"]
