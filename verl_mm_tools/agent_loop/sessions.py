"""Per-trajectory tool sessions: ``create`` once per tool per trajectory (lazily, with the sample's create_kwargs),
``execute`` on that same instance for every call, ``release`` exactly once when the trajectory ends, however it ends.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.tools.function_tool import FunctionTool

logger = logging.getLogger(__name__)


class ToolSessions:
    """The tool instances of one trajectory."""

    def __init__(self, tools: dict[str, Any], tools_kwargs: dict[str, Any] | None):
        self.tools = tools
        self.tools_kwargs = tools_kwargs or {}
        self.instances: dict[str, str] = {}
        self.released = False

    def _kwargs(self, tool_name: str, key: str) -> dict:
        return dict((self.tools_kwargs.get(tool_name) or {}).get(key) or {})

    async def instance_id(self, tool_name: str) -> str | None:
        """The trajectory's instance of this tool, created on first use (None for stateless function tools)."""
        tool = self.tools[tool_name]
        if isinstance(tool, FunctionTool):
            return None
        if tool_name not in self.instances:
            instance_id, _ = await tool.create(create_kwargs=self._kwargs(tool_name, "create_kwargs"))
            self.instances[tool_name] = instance_id
        return self.instances[tool_name]

    async def release_all(self) -> None:
        """Release every created instance once; a failing release is logged, never raised."""
        if self.released:
            return
        self.released = True
        for tool_name, instance_id in self.instances.items():
            try:
                await self.tools[tool_name].release(instance_id, **self._kwargs(tool_name, "release_kwargs"))
            except Exception:
                logger.warning("releasing tool %r instance %s failed", tool_name, instance_id, exc_info=True)
