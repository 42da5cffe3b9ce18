"""The mm_tool agent loop. ``MMToolAgentLoop`` is imported on first use (it imports verl): the package itself and
its ``options`` stay light, so the CLI's parser reads the option values without verl's import."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_mm_tools.agent_loop.mm_tool_loop import MMToolAgentLoop

__all__ = ["MMToolAgentLoop"]


def __getattr__(name: str) -> type[MMToolAgentLoop]:
    if name == "MMToolAgentLoop":
        from verl_mm_tools.agent_loop.mm_tool_loop import MMToolAgentLoop

        return MMToolAgentLoop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
