"""Reward functions (verl's ``compute_score`` signature) and reward managers for multimodal multi-turn RL.

Functions, by name in :data:`REWARD_FUNCTIONS`; use one as verl's custom reward function with
``reward.custom_reward_function.path=pkg://verl_mm_tools.rewards`` and ``reward.custom_reward_function.name=<name>``
(tunables via ``reward.custom_reward_function.reward_kwargs``), or name it from the ``mm_turn_discount`` manager.

Managers, by name in :data:`REWARD_MANAGERS`, registered in verl's reward-loop registry as their module is imported.
"""

from verl_mm_tools.rewards.answer_format import check_answer_format, format_reward
from verl_mm_tools.rewards.combine import WeightedReward, make_weighted_reward
from verl_mm_tools.rewards.common import ATTEMPTS_KEY, LAST_ASSISTANT_TEXT_KEY, REWARD_FN_KEY, TOOL_CALLS_KEY
from verl_mm_tools.rewards.environment import environment_reward
from verl_mm_tools.rewards.exact import exact_answer_reward
from verl_mm_tools.rewards.geo3k import geo3k_reward
from verl_mm_tools.rewards.managers import (
    REWARD_EXTRA_KEYS,
    REWARD_MANAGERS,
    MMTurnDiscountRewardManager,
    TurnDiscountConfig,
)
from verl_mm_tools.rewards.registry import REWARD_FUNCTIONS, get_reward_function
from verl_mm_tools.rewards.rotation import (
    RotationReward,
    circular_angle_error,
    make_rotation_reward,
    parse_angle_answer,
    rotation_reward,
    rotation_reward_45,
    rotation_reward_180,
)
from verl_mm_tools.rewards.shaping import ToolShapedReward, ToolShaping, make_tool_shaped_reward, tool_use_shaping
from verl_mm_tools.rewards.text import strip_template_leftovers

__all__ = [
    "ATTEMPTS_KEY",
    "LAST_ASSISTANT_TEXT_KEY",
    "REWARD_EXTRA_KEYS",
    "REWARD_FN_KEY",
    "REWARD_FUNCTIONS",
    "REWARD_MANAGERS",
    "TOOL_CALLS_KEY",
    "MMTurnDiscountRewardManager",
    "RotationReward",
    "ToolShapedReward",
    "ToolShaping",
    "TurnDiscountConfig",
    "WeightedReward",
    "check_answer_format",
    "circular_angle_error",
    "environment_reward",
    "exact_answer_reward",
    "format_reward",
    "geo3k_reward",
    "get_reward_function",
    "make_rotation_reward",
    "make_tool_shaped_reward",
    "make_weighted_reward",
    "parse_angle_answer",
    "rotation_reward",
    "rotation_reward_45",
    "rotation_reward_180",
    "strip_template_leftovers",
    "tool_use_shaping",
]
