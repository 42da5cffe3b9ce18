"""Exact-answer reward: the last ``<answer>...</answer>`` block (or, with ``require_tag=False`` and no such block, the
whole response) equals the ground truth (after trimming)."""

from __future__ import annotations

from typing import Any

from verl_mm_tools.rewards.common import check_tunables
from verl_mm_tools.rewards.text import extract_last_tagged, strip_template_leftovers

_TUNABLES = ("case_sensitive", "require_tag")


def exact_answer_reward(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: dict | None = None,
    *,
    case_sensitive: bool = False,
    require_tag: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """1.0 when the last answer block equals ``str(ground_truth)`` (whitespace-trimmed), else 0.0.

    ``require_tag=False`` is for one-word answers: without an answer block the whole response (chat-template tokens
    removed, trimmed) is the answer.

    Returns:
        ``{"score", "acc", "reason"}``; ``reason`` is "ok", "no <answer>...</answer> block" or "wrong answer".
    """
    check_tunables("exact_answer_reward()", kwargs, _TUNABLES)
    response = strip_template_leftovers(solution_str)
    answer = extract_last_tagged(response, "answer")
    if answer is None and not require_tag:
        answer = response
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "reason": "no <answer>...</answer> block"}
    expected = str(ground_truth).strip()
    answer = answer.strip()
    right = answer == expected if case_sensitive else answer.casefold() == expected.casefold()
    return {"score": float(right), "acc": float(right), "reason": "ok" if right else "wrong answer"}
