"""GUI tools: ``click``, ``type``, ``press`` and ``scroll`` act on the trajectory's GUI environment (a
``ScreenEnvironment``, e.g. ``miniwob``) and answer with the page's new screenshot.

Points are pixels of the latest screenshot of that environment as the model was shown it (after the processor's
sizing and any downscale by the image budget); ``envs.gui.screen.page_point`` maps them to the page exactly. Each
answer names the new screenshot's image id. When an action ends the episode, the answer says how it ended, carries
the environment's reward, and ends the trajectory (``EPISODE_DONE``). Bad actions (a point off the screenshot,
arguments that are not numbers, an unknown key, text too long) are answered as text, with reward 0. A browser that
fails raises (``BrowserLost``): the loop masks that trajectory only.

Load them with verl's tool YAML (``examples/tools/gui_tools.yaml``):
``class_name: verl_mm_tools.tools.gui_tools.ClickTool``, ``config: {type: native}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from verl_mm_tools.envs.gui.screen import (
    ActionResult,
    Click,
    PressKey,
    ScreenAction,
    ScreenEnvironment,
    Scroll,
    TypeText,
    checked_key,
    checked_text,
    page_point,
    shown_size,
)
from verl_mm_tools.errors import ConfigError, ToolInputError
from verl_mm_tools.files import STATE_ATTR
from verl_mm_tools.tools.base import EPISODE_DONE, SchemaFunctionTool
from verl_mm_tools.workspace import workspace_of

logger = logging.getLogger(__name__)


def click(x: float, y: float) -> None:
    """Click a point of the page.

    Args:
        x: Pixels from the left edge of the latest screenshot.
        y: Pixels from the top edge of the latest screenshot.
    """


def type_text(text: str) -> None:
    """Type text into the focused element of the page, key by key (click a text field first).

    Args:
        text: The text to type (printable characters only; press Enter or Tab with press).
    """


type_text.__name__ = "type"  # the tool's name; ``type`` itself would shadow the builtin here


def press(key: str) -> None:
    """Press one key on the page.

    Args:
        key: One printable character, or a named key: Enter, Tab, Backspace, Delete, Escape, Space, ArrowUp,
            ArrowDown, ArrowLeft, ArrowRight, Home, End, PageUp or PageDown.
    """


def scroll(x: float, y: float, direction: Literal["up", "down"]) -> None:
    """Scroll the page with the mouse wheel at a point.

    Args:
        x: Pixels from the left edge of the latest screenshot.
        y: Pixels from the top edge of the latest screenshot.
        direction: up or down.
    """


class ScreenTool(SchemaFunctionTool):
    """Base of the GUI tools: subclasses set ``schema_fn`` and implement ``action``."""

    example_arguments: ClassVar[dict[str, object]] = {}

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None):
        self.config = dict(config or {})
        unknown = sorted(set(self.config) - {"type"})
        if unknown:
            raise ConfigError(f"{type(self).__name__} takes no config besides type, got {unknown}")
        self._set_schema(tool_schema)

    def action(self, arguments: dict[str, Any], screen: ScreenEnvironment, shown: tuple[int, int]) -> ScreenAction:
        raise NotImplementedError(f"{type(self).__name__} must implement action(arguments, screen, shown)")

    def describe(self, arguments: dict[str, Any]) -> str:
        """What was done, for the answer: e.g. "clicking at (84, 112)"."""
        raise NotImplementedError

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs.get("agent_data")
        try:
            arguments = self.arguments.parse(parameters)
            screen = screen_of(agent_data)
            workspace = workspace_of(agent_data)
            action = self.action(arguments, screen, shown_size(workspace.images, screen.screen_token))
        except ToolInputError as error:
            return self._refuse(str(error))
        result = await screen.act(action)  # a browser that fails raises: the loop masks the trajectory
        return self._answer(result, self.describe(arguments), workspace.next_id)

    @staticmethod
    def _answer(result: ActionResult, what: str, next_id: int) -> tuple[ToolResponse, float, dict]:
        metrics: dict[str, Any] = {"reward": result.reward}
        if result.done or result.screenshot is None:
            metrics[EPISODE_DONE] = True
            outcome = "done" if result.reward > 0 else "not done"
            text = f"The task is over after {what}: {outcome} (reward {result.reward:g})."
            return ToolResponse(text=text), result.reward, metrics
        text = f"Image {next_id}: the page after {what}."
        return ToolResponse(image=[result.screenshot], text=text), result.reward, metrics


def screen_of(agent_data: object) -> ScreenEnvironment:
    """The trajectory's GUI environment; ToolInputError when it has none."""
    env = getattr(getattr(agent_data, STATE_ATTR, None), "env", None)
    if not isinstance(env, ScreenEnvironment):
        what = "no environment" if env is None else f"the environment {type(env).__name__}, which has no screen"
        raise ToolInputError(f"this tool acts on a GUI environment's page, and this conversation has {what}")
    return env


def _point(arguments: dict[str, Any], shown: tuple[int, int], screen: ScreenEnvironment) -> tuple[float, float]:
    return page_point(arguments["x"], arguments["y"], shown, screen.page_size)


class ClickTool(ScreenTool):
    schema_fn = staticmethod(click)
    example_arguments: ClassVar[dict[str, object]] = {"x": 10, "y": 10}

    def action(self, arguments: dict[str, Any], screen: ScreenEnvironment, shown: tuple[int, int]) -> ScreenAction:
        return Click(*_point(arguments, shown, screen))

    def describe(self, arguments: dict[str, Any]) -> str:
        return f"clicking at ({arguments['x']:g}, {arguments['y']:g})"


class TypeTool(ScreenTool):
    schema_fn = staticmethod(type_text)
    example_arguments: ClassVar[dict[str, object]] = {"text": "hello"}

    def action(self, arguments: dict[str, Any], screen: ScreenEnvironment, shown: tuple[int, int]) -> ScreenAction:
        return TypeText(checked_text(arguments["text"]))

    def describe(self, arguments: dict[str, Any]) -> str:
        return f"typing {arguments['text']!r}"


class PressTool(ScreenTool):
    schema_fn = staticmethod(press)
    example_arguments: ClassVar[dict[str, object]] = {"key": "Enter"}

    def action(self, arguments: dict[str, Any], screen: ScreenEnvironment, shown: tuple[int, int]) -> ScreenAction:
        return PressKey(checked_key(arguments["key"], screen.keys))

    def describe(self, arguments: dict[str, Any]) -> str:
        return f"pressing {arguments['key']}"


class ScrollTool(ScreenTool):
    schema_fn = staticmethod(scroll)
    example_arguments: ClassVar[dict[str, object]] = {"x": 10, "y": 10, "direction": "down"}

    def action(self, arguments: dict[str, Any], screen: ScreenEnvironment, shown: tuple[int, int]) -> ScreenAction:
        return Scroll(*_point(arguments, shown, screen), arguments["direction"])

    def describe(self, arguments: dict[str, Any]) -> str:
        return f"scrolling {arguments['direction']} at ({arguments['x']:g}, {arguments['y']:g})"


GUI_TOOLS = (ClickTool, TypeTool, PressTool, ScrollTool)
