"""What reward functions and managers share: the trajectory keys the agent loop writes, and argument checks.

Trajectory keys (the contract with the agent loop and environments). The agent loop writes them into
``AgentLoopOutput.extra_fields``; verl hands that dict to the reward manager as
``non_tensor_batch["tool_extra_fields"]`` (streaming reward path, ``AgentLoopWorker._compute_score``) or as top-level
``non_tensor_batch`` columns (batch path, ``AgentLoopWorker._postprocess`` then ``RewardLoopManager``). Reward managers
merge them into ``extra_info``, which is where reward functions read them. A dataset may also put them in its own
``extra_info`` column (offline scoring); the agent loop's value wins.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Collection, Mapping
from typing import Any

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.handoff import ATTEMPTS_KEY, LAST_ASSISTANT_TEXT_KEY, TOOL_CALLS_KEY

logger = logging.getLogger(__name__)

__all__ = [
    "ATTEMPTS_KEY",
    "LAST_ASSISTANT_TEXT_KEY",
    "REWARD_FN_KEY",
    "TOOL_CALLS_KEY",
    "VERL_CALL_KWARGS",
    "as_result_dict",
    "check_tunables",
    "read_tool_calls",
]

# The keys of what the loop hands over (``handoff.SampleFields``) that reward functions read in ``extra_info``:
# ATTEMPTS_KEY, int >= 1: how many answers the model gave in the trajectory (1 + the number of retries after
# feedback); missing means 1 (a loop without environment turns). TOOL_CALLS_KEY, int >= 0: tool calls the model made
# in the trajectory (all tools together), the column verl's ``compute_data_metrics`` logs as
# ``tool_call_counts/{min,max,mean}``; a ``{tool_name: count}`` dict is accepted too and summed; missing means 0.
# LAST_ASSISTANT_TEXT_KEY, str, optional: the text of the final assistant turn; when present, managers score it
# instead of the decoded whole response, which in a multi-turn trajectory also holds tool responses, feedback turns
# and earlier answers.
REWARD_FN_KEY = "reward_fn"
"""str, optional, in a dataset row's ``extra_info``: the name of a built-in reward function (see
``REWARD_FUNCTIONS``) that scores this row."""

VERL_CALL_KWARGS = frozenset(
    {"reward_router_address", "reward_model_tokenizer", "sandbox_fusion_url", "concurrent_semaphore", "memory_limit_mb"}
)
"""Keyword arguments verl's reward managers may pass to any ``compute_score``; reward functions ignore them."""


def check_tunables(function_name: str, kwargs: Mapping[str, Any], tunables: Collection[str] = ()) -> None:
    """Raise ConfigError for a keyword argument that is neither a tunable nor one verl passes to every function.

    verl forwards ``reward.custom_reward_function.reward_kwargs`` as keyword arguments, so a misspelt tunable
    would otherwise be silently ignored.
    """
    for name in kwargs:
        if name not in VERL_CALL_KWARGS:
            allowed = sorted(tunables)
            accepted = f"its tunables are {allowed}" if allowed else "its tunables were fixed when it was made"
            raise ConfigError(
                f"{function_name} got an unknown keyword argument {name!r}; {accepted}." + did_you_mean(name, allowed)
            )


def read_tool_calls(extra_info: Mapping[str, Any] | None) -> int:
    """Tool calls recorded under :data:`TOOL_CALLS_KEY` in ``extra_info``; 0 when missing."""
    value = (extra_info or {}).get(TOOL_CALLS_KEY)
    if value is None:
        return 0
    if isinstance(value, Mapping):
        return sum(_count(v) for v in value.values())
    return _count(value)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{TOOL_CALLS_KEY} must be a non-negative integer or a dict of them, got {value!r}")
    return int(value)


def as_result_dict(result: float | Mapping[str, Any]) -> dict[str, Any]:
    """A reward function's result as a dict with a float ``"score"`` (verl accepts a bare number or such a dict)."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"a reward function returned a dict without a 'score' key: keys {sorted(result)}")
        return {**result, "score": float(result["score"])}
    return {"score": float(result)}
