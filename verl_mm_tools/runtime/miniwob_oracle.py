"""A scripted solver of the offered MiniWoB++ tasks that reads the page's own DOM through the environment: what the
tests check the GUI path with, and what writes demonstrations.

``oracle_action`` picks the next action on the page (page pixels); ``oracle_script`` is a scripted model
(``runtime.scripted_client.Script``) that writes it as a tool call in the pixels of the screenshot the model was
shown, for the episode of the trajectory it answers (``miniwob_env.ACTIVE_EPISODE``: set by the environment's reset
in that trajectory's asyncio task).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from verl_mm_tools.envs.gui.miniwob_env import ACTIVE_EPISODE
from verl_mm_tools.envs.gui.screen import shown_size
from verl_mm_tools.envs.gui.tasks import OFFERED_TASKS
from verl_mm_tools.runtime.scripted_client import tool_call_text

Element = dict[str, Any]  # one of miniwob's dom_elements
FOCUSED = 0  # index of the focused flag in an element's flags


def oracle_action(task: str, observation: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of the next action that solves ``task`` from this observation; points in page px."""
    elements: Sequence[Element] = observation["dom_elements"]
    target = dict(observation.get("fields") or ()).get("target")
    if task in ("click-test", "click-button"):
        return "click", _center(_find(elements, lambda e: e["tag"] == "button" and target in (None, e["text"])))
    if task == "click-link":
        return "click", _center(_find(elements, lambda e: "alink" in e["classes"].split() and e["text"] == target))
    if task == "click-dialog":
        return "click", _center(_find(elements, lambda e: "ui-dialog-titlebar-close" in e["classes"].split()))
    if task == "focus-text":
        return "click", _center(_find(elements, _is_text_field))
    if task == "enter-text":
        field = _find(elements, _is_text_field)
        if field["value"] == target:
            return "click", _center(_find(elements, lambda e: e["tag"] == "button" and e["text"] == "Submit"))
        if not field["flags"][FOCUSED]:
            return "click", _center(field)
        return "type", {"text": target}
    raise ValueError(f"the oracle solves {list(OFFERED_TASKS)}, not {task!r}")


def oracle_script(turn: int, prompt_ids: list[int], images: list[Image.Image]) -> str:
    """The oracle's next action as the model's tool call, in the pixels of the latest screenshot shown."""
    env = ACTIVE_EPISODE.get()
    if env is None:
        raise RuntimeError("oracle_script answers trajectories of the miniwob environment only (no episode is active)")
    name, arguments = oracle_action(env.task, env.observation)
    if "x" in arguments:
        shown = shown_size(images, env.screen_token)
        arguments = {
            "x": int(arguments["x"] * shown[0] / env.page_size[0]),
            "y": int(arguments["y"] * shown[1] / env.page_size[1]),
        }
    return tool_call_text(name, **arguments)


def _is_text_field(element: Element) -> bool:
    return str(element["tag"]).startswith("input_text")


def _find(elements: Sequence[Element], matches: Any) -> Element:
    found = [element for element in elements if matches(element)]
    if not found:
        raise ValueError("the oracle found no element to act on in the page's DOM")
    return found[0]


def _center(element: Element) -> dict[str, float]:
    def value(key: str) -> float:
        return float(element[key][0])

    return {"x": value("left") + value("width") / 2, "y": value("top") + value("height") / 2}
