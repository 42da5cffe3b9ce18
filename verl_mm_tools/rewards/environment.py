"""The environment's own reward as the trajectory's score: what a GUI task (``miniwob``) gives its episode."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from verl_mm_tools.errors import TrajectoryValidationError
from verl_mm_tools.handoff import SampleFields, StopReason
from verl_mm_tools.rewards.common import check_tunables

# the keys of the loop's hand-off this function reads in extra_info
TOOL_REWARDS_KEY = "tool_rewards"  # the tool calls' rewards, in order (a GUI action's is its environment's)
TURN_SCORES_KEY = "turn_scores"  # the environment's rewards for the model's answers
STOP_REASON_KEY = SampleFields.key("stop_reason")
EPISODE_ENDED = frozenset({StopReason.EPISODE_DONE.value, StopReason.ANSWERED.value})
_TUNABLES = ("unfinished",)


def environment_reward(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: Mapping[str, Any] | None = None,
    *,
    unfinished: float = -1.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """The sum of the rewards the trajectory's environment gave (its tool actions' and its answers'), when the episode
    ended; ``unfinished`` when the trajectory stopped first (turn or length limit, image budget, a failed tool), as a
    MiniWoB task's time-out scores it.

    Returns:
        ``{"score", "acc", "reason"}``: ``acc`` is 1.0 for an ended episode with a positive score; ``reason`` is
        "ended" or the stop reason.
    """
    check_tunables("environment_reward()", kwargs, _TUNABLES)
    info = dict(extra_info or {})
    stop = info.get(STOP_REASON_KEY)
    if stop not in EPISODE_ENDED:
        return {"score": float(unfinished), "acc": 0.0, "reason": str(stop)}
    score = sum(_rewards(info, TOOL_REWARDS_KEY)) + sum(_rewards(info, TURN_SCORES_KEY))
    return {"score": score, "acc": float(score > 0), "reason": "ended"}


def _rewards(info: Mapping[str, Any], key: str) -> list[float]:
    values = info.get(key)
    if values is None:
        return []
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise TrajectoryValidationError(f"extra_info[{key!r}] must be a list of rewards, got {type(values).__name__}")
    rewards = list(values)
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in rewards):
        raise TrajectoryValidationError(f"extra_info[{key!r}] must hold finite numbers, got {rewards[:8]!r}")
    return [float(v) for v in rewards]
