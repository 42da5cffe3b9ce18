"""Weighted sum of reward functions, e.g. a little format reward plus the answer reward.

Definition: ``score = sum_i weight_i * score_i``. The result also holds each component's score as
``"<name>_score"`` and the other fields of the components (the first component's value wins on a clash).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards.common import as_result_dict
from verl_mm_tools.rewards.registry import RewardFunction, resolve_reward_function

__all__ = ["WeightedReward", "make_weighted_reward"]


def _component_name(function: str | RewardFunction) -> str:
    return function if isinstance(function, str) else getattr(function, "__name__", type(function).__name__)


@dataclasses.dataclass(frozen=True)
class WeightedReward:
    """A picklable weighted sum of reward functions with verl's ``compute_score`` signature.

    Attributes:
        components: ``(function or built-in name, weight)`` pairs, in order.
    """

    components: tuple[tuple[str | RewardFunction, float], ...]

    def __post_init__(self) -> None:
        if not self.components:
            raise ConfigError("a weighted reward needs at least one (function, weight) component, got none")
        for function, weight in self.components:
            resolve_reward_function(function)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ConfigError(f"weight of {_component_name(function)!r} must be a finite number, got {weight!r}")

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: object, extra_info: dict | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        total = 0.0
        merged: dict[str, Any] = {}
        for function, weight in self.components:
            compute = resolve_reward_function(function)
            result = as_result_dict(compute(data_source, solution_str, ground_truth, extra_info, **kwargs))
            total += weight * result["score"]
            merged[f"{_component_name(function)}_score"] = result["score"]
            for key, value in result.items():
                if key != "score":
                    merged.setdefault(key, value)
        return {**merged, "score": total}


def make_weighted_reward(weights: Mapping[str | RewardFunction, float]) -> WeightedReward:
    """A weighted sum, e.g. ``make_weighted_reward({"format_reward": 0.1, "rotation_reward_45": 0.9})``."""
    return WeightedReward(components=tuple(weights.items()))
