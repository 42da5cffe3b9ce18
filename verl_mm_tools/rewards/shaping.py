"""Tool-use shaping: a penalty for tool calls beyond a budget, a bonus for using tools to get the answer right.

Definition, for ``n`` tool calls and an answer reward ``s``:
    ``shaping = bonus * [s >= correct_threshold and n > 0] - penalty_per_extra_call * max(0, n - budget)``
    ``score = s + shaping``
The bonus is paid only for a right answer, so the policy cannot farm it by calling tools and guessing.

The tool-call count is the ``num_tool_calls`` argument when given, else ``extra_info["tool_call_counts"]`` (written
by the agent loop, see :mod:`verl_mm_tools.rewards.common`), else 0.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards.common import as_result_dict, check_tunables, read_tool_calls
from verl_mm_tools.rewards.registry import RewardFunction, resolve_reward_function

logger = logging.getLogger(__name__)

__all__ = ["ToolShapedReward", "ToolShaping", "make_tool_shaped_reward", "tool_use_shaping"]


@dataclasses.dataclass(frozen=True)
class ToolShaping:
    """Shaping tunables, checked once.

    Attributes:
        budget: Tool calls allowed before the penalty starts (>= 0).
        penalty_per_extra_call: Subtracted for each call beyond the budget (>= 0).
        bonus: Added when the answer is right and at least one tool was called (>= 0; 0 disables it).
        correct_threshold: An answer reward at or above this counts as right.
    """

    budget: int = 2
    penalty_per_extra_call: float = 0.1
    bonus: float = 0.0
    correct_threshold: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
            raise ConfigError(f"tool shaping budget must be an integer >= 0, got {self.budget!r}")
        for name in ("penalty_per_extra_call", "bonus"):
            value = getattr(self, name)
            if not _is_real(value) or value < 0:
                raise ConfigError(f"tool shaping {name} must be a finite number >= 0, got {value!r}")
        if not _is_real(self.correct_threshold):
            raise ConfigError(f"tool shaping correct_threshold must be a finite number, got {self.correct_threshold!r}")

    def shaping(self, num_tool_calls: int, *, answer_score: float) -> float:
        """The shaping term for this many calls and this answer reward (see the module docstring)."""
        return tool_use_shaping(
            num_tool_calls,
            answer_correct=answer_score >= self.correct_threshold,
            budget=self.budget,
            penalty_per_extra_call=self.penalty_per_extra_call,
            bonus=self.bonus,
        )


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def tool_use_shaping(
    num_tool_calls: int,
    *,
    answer_correct: bool,
    budget: int = 2,
    penalty_per_extra_call: float = 0.1,
    bonus: float = 0.0,
) -> float:
    """``bonus * [answer_correct and calls > 0] - penalty_per_extra_call * max(0, calls - budget)``."""
    if num_tool_calls < 0:
        raise ValueError(f"num_tool_calls must be >= 0, got {num_tool_calls}")
    reward = bonus if answer_correct and num_tool_calls > 0 else 0.0
    return reward - penalty_per_extra_call * max(0, num_tool_calls - budget)


@dataclasses.dataclass(frozen=True)
class ToolShapedReward:
    """An answer reward plus tool-use shaping; picklable, with verl's ``compute_score`` signature.

    Attributes:
        answer_reward: A reward function or the name of a built-in one (stored by name so it pickles small).
        shaping: The shaping tunables.
    """

    answer_reward: str | RewardFunction
    shaping: ToolShaping = ToolShaping()

    def __post_init__(self) -> None:
        resolve_reward_function(self.answer_reward)  # fail at config time, not mid-rollout

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: object,
        extra_info: dict | None = None,
        *,
        num_tool_calls: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Score with the answer reward, then add the shaping term.

        Returns:
            The answer reward's fields plus ``score`` (shaped), ``answer_score``, ``tool_shaping`` and
            ``tool_calls`` (the count used).
        """
        check_tunables("ToolShapedReward()", kwargs, ("num_tool_calls",))
        answer = resolve_reward_function(self.answer_reward)
        result = as_result_dict(answer(data_source, solution_str, ground_truth, extra_info, **kwargs))
        calls = read_tool_calls(extra_info) if num_tool_calls is None else num_tool_calls
        shaping = self.shaping.shaping(calls, answer_score=result["score"])
        return {
            **result,
            "score": result["score"] + shaping,
            "answer_score": result["score"],
            "tool_shaping": shaping,
            "tool_calls": calls,
        }


def make_tool_shaped_reward(
    answer_reward: str | RewardFunction,
    *,
    budget: int = 2,
    penalty_per_extra_call: float = 0.1,
    bonus: float = 0.0,
    correct_threshold: float = 1.0,
) -> ToolShapedReward:
    """``answer_reward`` with tool-use shaping (see the module docstring); picklable when ``answer_reward`` is."""
    shaping = ToolShaping(
        budget=budget, penalty_per_extra_call=penalty_per_extra_call, bonus=bonus, correct_threshold=correct_threshold
    )
    return ToolShapedReward(answer_reward=answer_reward, shaping=shaping)
