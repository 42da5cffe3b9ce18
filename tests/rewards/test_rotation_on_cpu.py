"""Rotation reward: circular error, linear tolerance, answer parsing, presets, factory, errors."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards import (
    RotationReward,
    circular_angle_error,
    make_rotation_reward,
    rotation_reward,
    rotation_reward_45,
    rotation_reward_180,
)

angles = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False)


@pytest.mark.parametrize(
    ("a", "b", "error"),
    [(359, 1, 2), (1, 359, 2), (0, 180, 180), (90, 90, 0), (-90, 270, 0), (720, 10, 10), (10, 200, 170), (0, 181, 179)],
)
def test_circular_angle_error_table(a: float, b: float, error: float) -> None:
    assert circular_angle_error(a, b) == error


@given(angles, angles)
def test_circular_error_is_symmetric_and_bounded(a: float, b: float) -> None:
    error = circular_angle_error(a, b)
    assert 0 <= error <= 180
    assert error == circular_angle_error(b, a)


@given(angles, st.integers(min_value=-20, max_value=20))
def test_circular_error_ignores_full_turns(a: float, turns: int) -> None:
    assert circular_angle_error(a, a + 360 * turns) == pytest.approx(0, abs=1e-9)


@given(angles, angles, angles)
def test_circular_error_triangle_inequality(a: float, b: float, c: float) -> None:
    assert circular_angle_error(a, c) <= circular_angle_error(a, b) + circular_angle_error(b, c) + 1e-6


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_circular_error_rejects_non_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        circular_angle_error(bad, 0)


# (response, ground truth, tolerance, score, angle error)
SCORED = [
    ("<answer>135</answer>", "90", 180, 0.75, 45.0),
    ("<answer>135</answer>", 90, 45, 0.0, 45.0),
    ("<answer>100</answer>", 90, 45, 1 - 10 / 45, 10.0),
    ("<answer>359</answer>", "1", 180, 1 - 2 / 180, 2.0),
    ("<answer>1</answer>", 359, 45, 1 - 2 / 45, 2.0),
    ("<answer>90</answer><|im_end|>", "90", 180, 1.0, 0.0),
    ("  <answer> 90° </answer>\n<|endoftext|>\n", "90", 45, 1.0, 0.0),
    ("<answer>-90</answer>", "270", 45, 1.0, 0.0),
    ("<answer>270 degrees</answer>", "90", 180, 0.0, 180.0),
    ("I see 45 and 135. <answer>rotated by 180</answer>", "0", 180, 0.0, 180.0),
    ("<answer>30</answer> earlier, final <answer>60</answer>", "60", 180, 1.0, 0.0),
    ("The angle is 120", "90", 180, 1 - 30 / 180, 30.0),
    ("<answer>12.5</answer>", "10", 45, 1 - 2.5 / 45, 2.5),
    ("<answer>90</answer>", "<answer>90</answer>", 180, 1.0, 0.0),
]


@pytest.mark.parametrize(("response", "truth", "tolerance", "score", "error"), SCORED)
def test_rotation_reward_table(response: str, truth: object, tolerance: float, score: float, error: float) -> None:
    result = rotation_reward("rotation", response, truth, tolerance=tolerance)
    assert result["score"] == pytest.approx(score, abs=1e-12)
    assert result["angle_error"] == pytest.approx(error, abs=1e-12)
    assert result["reason"] == "ok"


@pytest.mark.parametrize(
    ("response", "require_tag", "reason"),
    [
        ("I cannot tell", False, "no number in the response"),
        ("<answer>upside down</answer>", False, "no number inside <answer>...</answer>"),
        ("<answer>upside down</answer> 90", False, "no number inside <answer>...</answer>"),
        ("The angle is 90", True, "no <answer>...</answer> block"),
        ("<|im_end|>", False, "no number in the response"),
        ("", False, "no number in the response"),
    ],
)
def test_unparseable_answer_scores_zero_with_reason(response: str, require_tag: bool, reason: str) -> None:
    result = rotation_reward("rotation", response, "90", require_tag=require_tag)
    assert result == {"score": 0.0, "angle_error": None, "predicted_angle": None, "reason": reason}


def test_presets_match_tolerances() -> None:
    response, truth = "<answer>120</answer>", "90"
    assert rotation_reward_180("r", response, truth)["score"] == pytest.approx(1 - 30 / 180)
    assert rotation_reward_45("r", response, truth)["score"] == pytest.approx(1 - 30 / 45)
    assert rotation_reward_45("r", "120", truth, require_tag=True)["score"] == 0.0


def test_factory_is_picklable_and_equivalent() -> None:
    reward = make_rotation_reward(tolerance=60)
    clone = pickle.loads(pickle.dumps(reward))
    assert clone == RotationReward(tolerance=60)
    assert clone("r", "<answer>105</answer>", "90")["score"] == pytest.approx(0.75)


def test_verl_extra_kwargs_are_ignored() -> None:
    result = rotation_reward_180("r", "90", "90", None, reward_router_address="host:1", reward_model_tokenizer=None)
    assert result["score"] == 1.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rotation_reward("r", "1", "1", tolerance=0), r"tolerance .* \(0, 180\], got 0"),
        (lambda: rotation_reward("r", "1", "1", tolerance=270), r"got 270"),
        (lambda: make_rotation_reward(tolerance=-5), r"got -5"),
        (lambda: rotation_reward("r", "1", "1", tolerence=45), r"'tolerence'.*Did you mean 'tolerance'"),
        (lambda: rotation_reward_45("r", "1", "1", tolerance=30), r"rotation_reward_45\(\) .*'tolerance'"),
        (lambda: make_rotation_reward()("r", "1", "1", tolerance=30), r"fixed when it was made"),
        (lambda: rotation_reward("r", "1", "north"), r"ground truth .* got 'north'"),
        (lambda: rotation_reward("r", "1", None), r"got None"),
    ],
)
def test_config_errors_name_the_value(call, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()
