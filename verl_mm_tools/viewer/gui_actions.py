"""GUI actions drawn on the screenshot they acted on: for a ``click`` or ``scroll`` call, a marker at its point on the
latest image shown before the call; for ``type`` and ``press``, the text or key under that image.

Points are pixels of that image as stored in the trajectory (what the model was shown: the GUI tools map them to the
page by the same image's size), so the marker sits at x/width, y/height of the picture, in percent: it stays on the
point at any display size. A point off the image (the tool answered it with an error) is said in words, never drawn.
The arguments are the model's: only finite numbers are placed, and every text is escaped.
"""

from __future__ import annotations

import math
from html import escape
from typing import TypeGuard

POINT_ACTIONS = ("click", "scroll")  # called with x, y: pixels of the latest screenshot
TEXT_ACTIONS = {"type": "text", "press": "key"}  # tool name -> the argument holding what it typed or pressed
LONG_NUMBER_CHARS = 12  # a model's absurd coordinate is cut in the caption (the call's JSON shows all of it)


def acted_on_images(messages: list[dict]) -> dict[int, dict[int, int]]:
    """Message index -> {call position -> the id of the latest image shown before that call}, for each assistant
    call with an image before it. The loop runs a turn's calls one after another, so a call acts on the screenshot the
    answer to an earlier call of the same turn brought (the tool messages answer the calls in order)."""
    acted: dict[int, dict[int, int]] = {}
    latest: int | None = None
    for index, message in enumerate(messages):
        latest = _last_image(message, latest)
        if message.get("role") != "assistant":
            continue
        answers = _answers(messages, index)
        shown = latest
        for position, _ in enumerate(message.get("tool_calls") or []):
            if shown is not None:
                acted.setdefault(index, {})[position] = shown
            if position < len(answers):
                shown = _last_image(answers[position], shown)
    return acted


def _answers(messages: list[dict], index: int) -> list[dict]:
    """The tool messages right after the assistant message at ``index``."""
    answers = []
    for message in messages[index + 1 :]:
        if message.get("role") != "tool":
            break
        answers.append(message)
    return answers


def _last_image(message: dict, latest: int | None) -> int | None:
    ids = message.get("image_ids") or []
    return ids[-1] if ids else latest


def action_view(call: dict, image: dict | None, image_base: str | None) -> str:
    """The picture of where a GUI call landed on ``image`` (a record's image entry: the one it acted on), or "" for
    a call that is no GUI action (another tool, or arguments that are not a point, a text or a key)."""
    arguments, name = call.get("arguments"), call.get("name")
    if image is None or not isinstance(arguments, dict) or not isinstance(name, str):
        return ""
    if name in POINT_ACTIONS:
        return _point_view(name, arguments, image, image_base)
    if name in TEXT_ACTIONS:
        value = arguments.get(TEXT_ACTIONS[name])
        return _text_view(name, value, image, image_base) if isinstance(value, str) else ""
    return ""


def _point_view(name: str, arguments: dict, image: dict, image_base: str | None) -> str:
    x, y = arguments.get("x"), arguments.get("y")
    if not (_finite(x) and _finite(y)):
        return ""
    direction = arguments.get("direction")
    what = f"{name} {direction}" if name == "scroll" and isinstance(direction, str) else name
    where = f"{what} at ({_coordinate(x)}, {_coordinate(y)})"
    width, height = image.get("width"), image.get("height")
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
        return _note_only(f"{where} on Image {image['id']} (its size is unknown)")
    if not (0 <= x < width and 0 <= y < height):  # the GUI tools' own bounds
        return _note_only(f"{where}: off the image (Image {image['id']} is {width}×{height} px)", "off-image")
    style = f"left:{_percent(x, width)}%;top:{_percent(y, height)}%"
    marker = f'<span class="marker {name}" style="{style}"></span>'  # name: one of POINT_ACTIONS
    return _shot(image, image_base, f"the {name} point", marker, escape(f"{where} on Image {image['id']}"))


def _text_view(name: str, value: str, image: dict, image_base: str | None) -> str:
    tag = "kbd" if name == "press" else "code"
    verb = "pressed" if name == "press" else "typed"
    caption = f"{verb} <{tag}>{escape(value)}</{tag}> on Image {image['id']}"
    return _shot(image, image_base, f"what {name} acted on", "", caption)


def _shot(image: dict, image_base: str | None, alt: str, overlay: str, caption: str) -> str:
    """The image with ``overlay`` placed over it (the wrapper has the image's size, so percentages are the image's),
    and ``caption`` (HTML, escaped by the caller) under it; the caption alone when the pixels were not dumped."""
    if not image.get("file") or image_base is None:
        return f'<div class="action"><div class="action-note">{caption} (pixels not dumped)</div></div>'
    src = escape(f"{image_base}/{image['file']}")
    picture = f'<img src="{src}" alt="Image {image["id"]}: {escape(alt)}">'
    return (
        f'<div class="action"><div class="shot">{picture}{overlay}</div><div class="action-note">{caption}</div></div>'
    )


def _note_only(text: str, kind: str = "") -> str:
    classes = f"action {kind}" if kind else "action"
    return f'<div class="{classes}"><div class="action-note">{escape(text)}</div></div>'


def _finite(value: object) -> TypeGuard[int | float]:
    """A JSON number that is finite (an int always is; bool is no number)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _percent(value: int | float, size: int) -> str:
    """``value`` as a percentage of ``size``, to 0.001 % (under a tenth of a pixel below 10,000 px displayed)."""
    text = f"{100 * value / size + 0.0:.3f}"  # + 0.0: no "-0"
    return text.rstrip("0").rstrip(".")


def _coordinate(value: int | float) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= LONG_NUMBER_CHARS else text[: LONG_NUMBER_CHARS - 1] + "…"
