"""Tool-use shaping and the weighted-sum combinator."""

from __future__ import annotations

import pickle

import pytest

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards import (
    ToolShapedReward,
    ToolShaping,
    make_tool_shaped_reward,
    make_weighted_reward,
    rotation_reward_45,
    tool_use_shaping,
)

# (calls, answer right, budget, penalty per extra call, bonus, shaping)
SHAPING = [
    (0, True, 2, 0.1, 0.5, 0.0),  # no tool used: no bonus
    (1, True, 2, 0.1, 0.5, 0.5),
    (2, False, 2, 0.1, 0.5, 0.0),  # wrong answer: no bonus
    (3, False, 2, 0.1, 0.5, -0.1),
    (5, True, 2, 0.1, 0.5, 0.5 - 0.3),
    (5, True, 0, 0.25, 0.0, -1.25),
    (4, False, 4, 1.0, 1.0, 0.0),
]


@pytest.mark.parametrize(("calls", "right", "budget", "penalty", "bonus", "expected"), SHAPING)
def test_tool_use_shaping_table(calls: int, right: bool, budget: int, penalty: float, bonus: float, expected: float):
    shaping = tool_use_shaping(calls, answer_correct=right, budget=budget, penalty_per_extra_call=penalty, bonus=bonus)
    assert shaping == pytest.approx(expected, abs=1e-12)


def test_shaping_rejects_negative_calls() -> None:
    with pytest.raises(ValueError, match="got -1"):
        tool_use_shaping(-1, answer_correct=True)


# (response, extra_info, num_tool_calls kwarg, score, tool_calls)
SHAPED = [
    ("<answer>90</answer>", {"tool_call_counts": 1}, None, 1.0 + 0.2, 1),
    ("<answer>90</answer>", {"tool_call_counts": 4}, None, 1.0 + 0.2 - 0.3, 4),
    ("<answer>90</answer>", {"tool_call_counts": {"rotate": 2, "zoom_in": 2}}, None, 1.0 + 0.2 - 0.3, 4),
    ("<answer>90</answer>", {"tool_call_counts": 4}, 0, 1.0, 0),  # the kwarg wins
    ("<answer>90</answer>", None, None, 1.0, 0),  # nothing recorded: 0 calls
    ("<answer>112.5</answer>", {"tool_call_counts": 2}, None, 0.5 - 0.1, 2),  # partly right: no bonus
    ("<answer>180</answer>", {"tool_call_counts": 3}, None, 0.0 - 0.1 * 2, 3),
]


@pytest.mark.parametrize(("response", "extra_info", "kwarg", "score", "calls"), SHAPED)
def test_tool_shaped_rotation_reward(response: str, extra_info, kwarg, score: float, calls: int) -> None:
    reward = make_tool_shaped_reward("rotation_reward_45", budget=1, penalty_per_extra_call=0.1, bonus=0.2)
    result = reward("rotation", response, "90", extra_info, num_tool_calls=kwarg)
    assert result["score"] == pytest.approx(score, abs=1e-12)
    assert result["tool_calls"] == calls
    assert result["answer_score"] + result["tool_shaping"] == pytest.approx(result["score"])
    assert "angle_error" in result  # the answer reward's fields are kept


def test_correct_threshold_decides_the_bonus() -> None:
    reward = make_tool_shaped_reward(rotation_reward_45, bonus=0.2, correct_threshold=0.5)
    assert reward("r", "<answer>112.5</answer>", "90", {"tool_call_counts": 1})["score"] == pytest.approx(0.7)


def test_shaped_reward_pickles() -> None:
    reward = make_tool_shaped_reward("rotation_reward_180", budget=3, bonus=0.1)
    assert pickle.loads(pickle.dumps(reward)) == reward


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ToolShaping(budget=-1), r"budget .* got -1"),
        (lambda: ToolShaping(budget=1.5), r"budget .* got 1.5"),
        (lambda: ToolShaping(penalty_per_extra_call=-0.1), r"penalty_per_extra_call .* got -0.1"),
        (lambda: ToolShaping(bonus=float("nan")), r"bonus .* got nan"),
        (lambda: ToolShapedReward("rotation_reward_60"), r"unknown reward function 'rotation_reward_60'"),
        (lambda: make_tool_shaped_reward("rotation_reward_180")("r", "1", "1", budget=3), r"'budget'"),
    ],
)
def test_shaping_config_errors(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_tool_call_count_must_be_a_count() -> None:
    reward = make_tool_shaped_reward("rotation_reward_180")
    with pytest.raises(ValueError, match="tool_call_counts must be a non-negative integer"):
        reward("r", "90", "90", {"tool_call_counts": "three"})


# (response, score, format component, rotation component)
WEIGHTED = [
    ("<answer>90</answer>", 0.1 * 1.0 + 0.9 * 1.0, 1.0, 1.0),
    ("<answer>135</answer>", 0.1 * 1.0 + 0.9 * 0.75, 1.0, 0.75),
    ("the angle is 135", 0.1 * 0.0 + 0.9 * 0.75, 0.0, 0.75),
    ("no idea", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize(("response", "score", "format_score", "rotation_score"), WEIGHTED)
def test_weighted_reward(response: str, score: float, format_score: float, rotation_score: float) -> None:
    reward = make_weighted_reward({"format_reward": 0.1, "rotation_reward_180": 0.9})
    result = pickle.loads(pickle.dumps(reward))("rotation", response, "90")
    assert result["score"] == pytest.approx(score, abs=1e-12)
    assert result["format_reward_score"] == format_score
    assert result["rotation_reward_180_score"] == rotation_score
    assert result["reason"] != ""  # first component's field wins: the format reason


@pytest.mark.parametrize(
    ("weights", "message"),
    [({}, "at least one"), ({"format_reward": "high"}, r"'format_reward' .* got 'high'"), ({"fmt": 1.0}, "'fmt'")],
)
def test_weighted_reward_config_errors(weights: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_weighted_reward(weights)
