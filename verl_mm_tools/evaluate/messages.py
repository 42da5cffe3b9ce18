"""What crosses to an OpenAI-compatible chat endpoint and back, in the tokens the mm_tool loop runs on.

The loop renders each turn's prompt with the model's chat template (tool schemas, tool responses and images
exactly as in training) and hands verl's server its token ids. For an endpoint those tokens become chat messages
again: the ChatML blocks of the rendered text (``<|im_start|>role\\n...<|im_end|>``), each image run
(``<|vision_start|><|image_pad|>...<|vision_end|>``) an ``image_url`` part carrying the next image as a PNG data
URL, each video run (``<|video_pad|>``) a ``video_url`` part carrying the next prompt video's sampled frames
(``video_urls``; their times go in the request's ``media_io_kwargs``). Audio is refused. An endpoint that serves the
same model renders them back to the same text (the tests check the token count the server reports). The answer comes
back as text (plus any structured ``tool_calls``, written as the model's hermes ``<tool_call>`` text) and is
tokenized with the model's tokenizer, so the loop parses it as it parses a rollout's.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.video_urls import video_data_url

BLOCK = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n?", re.DOTALL)
GENERATION_PROMPT = "<|im_start|>assistant\n"
MEDIA_RUN = re.compile(r"<\|vision_start\|>(?:(?P<image>(?:<\|image_pad\|>)+)|(?:<\|video_pad\|>)+)<\|vision_end\|>")
UNSUPPORTED = ("<|audio_pad|>",)
EXTRA_RUNS = {"video": " (Qwen3-VL writes a video as one run per frame group, which eval does not send yet)"}


def chat_messages(prompt_text: str, images: Sequence[Image.Image], videos: Sequence[Any] = ()) -> list[dict]:
    """The OpenAI chat messages of a rendered ChatML prompt that ends in the assistant's generation prompt, its
    image runs replaced by ``images`` and its video runs by ``videos`` (verl's ``(frames, metadata)`` pairs) in
    order."""
    if not prompt_text.endswith(GENERATION_PROMPT):
        raise ConfigError(
            "eval talks to chat endpoints in ChatML (Qwen-VL and most open VLMs): the rendered prompt must end in "
            f"{GENERATION_PROMPT!r}, got one ending in {prompt_text[-60:]!r}"
        )
    for token in UNSUPPORTED:
        if token in prompt_text:
            raise ConfigError(f"eval sends images and videos only; the prompt holds {token} (audio)")
    body = prompt_text[: -len(GENERATION_PROMPT)]
    blocks = list(BLOCK.finditer(body))
    if "".join(block.group(0) for block in blocks) != body:
        raise ConfigError(f"the rendered prompt is not a sequence of ChatML blocks: {body[:120]!r}...")
    media = _Media(iter(images), iter(videos))
    messages = [{"role": block.group(1), "content": _content(block.group(2), media)} for block in blocks]
    for name, given, left in (("image", images, media.images), ("video", videos, media.videos)):
        unused = sum(1 for _ in left)
        if unused:
            raise ConfigError(
                f"the rendered prompt holds {len(given) - unused} {name} runs but {len(given)} {name}s came"
            )
    return messages


@dataclass
class _Media:
    images: Iterator[Image.Image]
    videos: Iterator[Any]

    def part(self, run: re.Match[str]) -> dict:
        """The chat content part of one image or video run: the next image's or video's data URL."""
        name = "image" if run.group("image") else "video"
        item = next(self.images if name == "image" else self.videos, None)
        if item is None:
            raise ConfigError(
                f"the rendered prompt holds more {name} runs than the trajectory has {name}s{EXTRA_RUNS.get(name, '')}"
            )
        url = data_url(item) if name == "image" else video_data_url(item)
        return {"type": f"{name}_url", f"{name}_url": {"url": url}}


def _content(text: str, media: _Media) -> str | list[dict]:
    if not MEDIA_RUN.search(text):
        return text
    parts: list[dict] = []
    start = 0
    for run in MEDIA_RUN.finditer(text):
        if run.start() > start:
            parts.append({"type": "text", "text": text[start : run.start()]})
        parts.append(media.part(run))
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
