"""What crosses to an OpenAI-compatible chat endpoint and back, in the tokens the mm_tool loop runs on.

The loop renders each turn's prompt with the model's chat template (tool schemas, tool responses and images
exactly as in training) and hands verl's server its token ids. For an endpoint those tokens become chat messages
again: the ChatML blocks of the rendered text (``<|im_start|>role\\n...<|im_end|>``), each image run
(``<|vision_start|><|image_pad|>...<|vision_end|>``) an ``image_url`` part carrying the next image as a PNG data
URL. An endpoint that serves the same model renders them back to the same text (the tests check the token count the
server reports). The answer comes back as text (plus any structured ``tool_calls``, written as the model's hermes
``<tool_call>`` text) and is tokenized with the model's tokenizer, so the loop parses it as it parses a rollout's.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator, Sequence

from PIL import Image

from verl_mm_tools.errors import ConfigError

BLOCK = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n?", re.DOTALL)
GENERATION_PROMPT = "<|im_start|>assistant\n"
IMAGE_RUN = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>")
UNSUPPORTED = ("<|video_pad|>", "<|audio_pad|>")


def chat_messages(prompt_text: str, images: Sequence[Image.Image]) -> list[dict]:
    """The OpenAI chat messages of a rendered ChatML prompt that ends in the assistant's generation prompt, its
    image runs replaced by ``images`` in order."""
    if not prompt_text.endswith(GENERATION_PROMPT):
        raise ConfigError(
            "eval talks to chat endpoints in ChatML (Qwen-VL and most open VLMs): the rendered prompt must end in "
            f"{GENERATION_PROMPT!r}, got one ending in {prompt_text[-60:]!r}"
        )
    for token in UNSUPPORTED:
        if token in prompt_text:
            raise ConfigError(f"eval sends images only; the prompt holds {token} (video or audio)")
    body = prompt_text[: -len(GENERATION_PROMPT)]
    blocks = list(BLOCK.finditer(body))
    if "".join(block.group(0) for block in blocks) != body:
        raise ConfigError(f"the rendered prompt is not a sequence of ChatML blocks: {body[:120]!r}...")
    pictures = iter(images)
    messages = [{"role": block.group(1), "content": _content(block.group(2), pictures)} for block in blocks]
    left = sum(1 for _ in pictures)
    if left:
        raise ConfigError(f"the rendered prompt holds {len(images) - left} image runs but {len(images)} images came")
    return messages


def _content(text: str, images: Iterator[Image.Image]) -> str | list[dict]:
    if not IMAGE_RUN.search(text):
        return text
    parts: list[dict] = []
    start = 0
    for run in IMAGE_RUN.finditer(text):
        if run.start() > start:
            parts.append({"type": "text", "text": text[start : run.start()]})
        image = next(images, None)
        if image is None:
            raise ConfigError("the rendered prompt holds more image runs than the trajectory has images")
        parts.append({"type": "image_url", "image_url": {"url": data_url(image)}})
        start = run.end()
    if start < len(text):
        parts.append({"type": "text", "text": text[start:]})
    return parts


def data_url(image: Image.Image) -> str:
    """A lossless PNG data URL, so the endpoint sees the loop's pixels."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def answer_text(message: dict) -> str:
    """The assistant message as the model wrote it: its text, then each structured tool call as hermes text
    (arguments the endpoint could not parse are kept verbatim, so the loop counts the call as malformed)."""
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise ValueError(f"the endpoint's message content is not text: {json.dumps(content)[:200]}")
    calls = [_hermes_call(call) for call in message.get("tool_calls") or []]
    return "\n".join(part for part in [content, *calls] if part)


def _hermes_call(call: dict) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return f'<tool_call>\n{{"name": {json.dumps(function.get("name"))}, "arguments": {arguments}}}\n</tool_call>'
