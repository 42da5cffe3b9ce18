"""The mm_tool agent loop. ``MMToolAgentLoop`` is imported on first use (it imports verl): the package itself and
its ``options`` stay light, so the CLI's parser reads the option values without verl's import."""

__all__ = ["MMToolAgentLoop"]


def __getattr__(name: str):
    if name == "MMToolAgentLoop":
        from verl_mm_tools.agent_loop.mm_tool_loop import MMToolAgentLoop

        return MMToolAgentLoop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
