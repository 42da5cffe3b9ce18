"""What the loop hands a judge reward with a trajectory (its ``judge_images`` option): ``judge.context``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.state import TrajectoryState
from verl_mm_tools.judge.context import ImageChoice, JudgeContext

_PLACEHOLDERS = ("<image>", "<video>")  # verl datasets' markers of where a prompt's media go


def prompt_question(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the dataset prompt's user messages, their media markers removed."""
    texts: list[str] = []
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        parts = (
            [content]
            if isinstance(content, str)
            else [
                part.get("text", "") for part in content or [] if isinstance(part, dict) and part.get("type") == "text"
            ]
        )
        texts.extend(str(part) for part in parts)
    question = "\n".join(texts)
    for marker in _PLACEHOLDERS:
        question = question.replace(marker, "")
    return question.strip()


async def judge_context(options: MMToolLoopConfig, row: dict[str, Any], state: TrajectoryState) -> JudgeContext | None:
    """The trajectory's question and chosen images, PNG-encoded off the event loop (None without ``judge_images``)."""
    if options.judge_images is None:
        return None
    choice = options.judge_images
    question = prompt_question(list(row.get("raw_prompt") or []))
    images = list(state.workspace.images)
    answer = state.stats.last_assistant_text
    return await asyncio.to_thread(ImageChoice.parse(choice).context, question, images, state.prompt_images, answer)
