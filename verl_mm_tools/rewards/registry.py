"""Built-in reward functions by name, as configs and dataset rows name them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.rewards.answer_format import format_reward
from verl_mm_tools.rewards.environment import environment_reward
from verl_mm_tools.rewards.exact import exact_answer_reward
from verl_mm_tools.rewards.geo3k import geo3k_reward
from verl_mm_tools.rewards.rotation import rotation_reward, rotation_reward_45, rotation_reward_180

__all__ = ["REWARD_FUNCTIONS", "RewardFunction", "get_reward_function", "resolve_reward_function"]

# verl's compute_score signature (data_source, solution_str, ground_truth, extra_info, **kwargs): a score, or a dict
# with one under "score"
RewardFunction = Callable[..., float | Mapping[str, Any]]

REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "rotation_reward": rotation_reward,
    "rotation_reward_180": rotation_reward_180,
    "rotation_reward_45": rotation_reward_45,
    "geo3k_reward": geo3k_reward,
    "format_reward": format_reward,
    "exact_answer_reward": exact_answer_reward,
    "environment_reward": environment_reward,
}
"""Every built-in function has verl's ``compute_score`` signature; factories (``make_*``) are not listed."""


def get_reward_function(name: str) -> RewardFunction:
    """The built-in reward function called ``name``; ConfigError naming the choices when there is none."""
    if not isinstance(name, str) or name not in REWARD_FUNCTIONS:
        choices = sorted(REWARD_FUNCTIONS)
        suggestion = did_you_mean(name, choices) if isinstance(name, str) else ""
        raise ConfigError(f"unknown reward function {name!r}; built-in ones are {choices}.{suggestion}")
    return REWARD_FUNCTIONS[name]


def resolve_reward_function(function: str | RewardFunction) -> RewardFunction:
    """A callable as is, or the built-in reward function of that name."""
    return function if callable(function) else get_reward_function(function)
