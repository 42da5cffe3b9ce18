"""``BlockingTool``: a tool that blocks its thread (``time.sleep``) for ``config.seconds`` and then answers, as a
tool running a model or a simulator does. What the pool measurements and tests run; also a template for your own."""

from __future__ import annotations

import os
import time
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_mm_tools.tools.base import build_schema
from verl_mm_tools.workspace import workspace_of


def wait(note: str = "") -> None:
    """Wait for the slow tool, then say how many images it saw.

    Args:
        note: Anything; it is echoed back.
    """


class BlockingTool(BaseTool):
    """Sleeps ``config.seconds`` (default 0.5) on its thread, then answers where and when it ran (pid, wall-clock
    interval) and how many images it saw. Other config keys are ignored (a tag gives a test its own pool)."""

    schema_fn = staticmethod(wait)

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None):
        # BaseTool.__init__ is not called on purpose: it print()s the schema.
        self.config = dict(config or {})
        self.seconds = float(self.config.get("seconds", 0.5))
        self.tool_schema = tool_schema or build_schema(wait)
        self.name = self.tool_schema.function.name

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        began = time.time()
        time.sleep(self.seconds)  # blocking on purpose: the event loop it runs on is stuck meanwhile
        images = len(workspace_of(kwargs.get("agent_data")).images)
        note = str(parameters.get("note", ""))[:100]
        text = (
            f"waited {self.seconds:g} s in pid {os.getpid()} from {began:.3f} to {time.time():.3f}; "
            f"{images} images; {note}"
        )
        return ToolResponse(text=text), 0.0, {}
