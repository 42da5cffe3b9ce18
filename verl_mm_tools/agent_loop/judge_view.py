"""What the loop hands a judge reward with a trajectory (its ``judge_images`` option): ``judge.context``."""

from __future__ import annotations

import asyncio
from typing import Any

from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.state import TrajectoryState
from verl_mm_tools.judge.context import ImageChoice, JudgeContext, prompt_question


async def judge_context(options: MMToolLoopConfig, row: dict[str, Any], state: TrajectoryState) -> JudgeContext | None:
    """The trajectory's question and chosen images, PNG-encoded off the event loop (None without ``judge_images``)."""
    if options.judge_images is None:
        return None
    choice = options.judge_images
    question = prompt_question(list(row.get("raw_prompt") or []))
    images = list(state.workspace.images)
    answer = state.stats.last_assistant_text
    return await asyncio.to_thread(ImageChoice.parse(choice).context, question, images, state.prompt_images, answer)
