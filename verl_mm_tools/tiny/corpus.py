"""Generated training text for the tiny tokenizer: the words, numbers and JSON the tasks and chat template use.

Seeded, so the same seed always yields the same corpus (and so the same merges and token ids).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

WORDS = (
    "the a an of to in is it that this what which image picture photo angle rotation rotated rotate degrees "
    "clockwise counterclockwise answer question please look at zoom crop flip draw box line color red green blue "
    "yellow black white gray shape square circle triangle text digit number left right top bottom horizontal "
    "vertical upside down by how much has been was with tool call function name arguments result error invalid "
    "must be between got you are helpful assistant user system think step first then finally correct wrong try "
    "again feedback reward attempt remaining budget exhausted images pixels width height size id new latest from "
    "geometry triangle length area find value x y z choose option options final boxed object small large target "
    "region around near inside outside and or not can use tools call return json"
).split()
TOOL_NAMES = ("rotate", "flip", "crop", "zoom_in", "draw_bbox", "draw_line", "answer")
JSON_KEYS = ("degrees", "direction", "bbox", "image_id", "label", "start", "end", "width", "color", "angle")
TEMPLATE_TEXT = (
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:",
    '{"name": <function-name>, "arguments": <args-json-object>}',
    "<tool_response>",
    "</tool_response>",
    '{"type": "function", "function": {"name": "rotate", "description": "Rotate the image.", "parameters": '
    '{"type": "object", "properties": {"degrees": {"type": "number", "description": "Angle."}}, '
    '"required": ["degrees"]}}}',
    "<answer>",
    "</answer>",
    "\\boxed{",
)


def generate_corpus(seed: int, num_lines: int = 3000) -> Iterator[str]:
    rng = random.Random(seed)
    yield from TEMPLATE_TEXT
    for index in range(num_lines):
        kind = index % 3
        if kind == 0:
            yield _sentence(rng)
        elif kind == 1:
            yield _tool_call(rng)
        else:
            yield f"Image {rng.randint(1, 16)}: {_sentence(rng)} <answer>{rng.randint(0, 359)}</answer>"


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", "?", "!", ":"))


def _tool_call(rng: random.Random) -> str:
    arguments = {key: _json_value(rng) for key in rng.sample(JSON_KEYS, rng.randint(1, 3))}
    call = {"name": rng.choice(TOOL_NAMES), "arguments": arguments}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _json_value(rng: random.Random) -> int | list[int] | str | float:
    choice = rng.randint(0, 3)
    if choice == 0:
        return rng.randint(-360, 1024)
    if choice == 1:
        return [rng.randint(0, 512) for _ in range(4)]
    if choice == 2:
        return rng.choice(("horizontal", "vertical", "red", "green", "blue"))
    return round(rng.uniform(0, 360), 1)
