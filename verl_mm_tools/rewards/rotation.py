"""Rotation-estimation reward: linear tolerance on the circular angle error.

Answer format: the model writes its angle in degrees, preferably as ``<answer>123</answer>``. The predicted angle is
the last number inside the last complete ``<answer>`` block; without such a block (and unless ``require_tag``), the
last number in the whole response. Signs and units are fine (``-90``, ``90°``, ``90 degrees``); template leftovers
(``<|im_end|>`` ...) are stripped first. The ground truth is a number or a string holding one.

Definitions:
    circular error ``e(a, b) = min(d, 360 - d)`` with ``d = |a - b| mod 360``; always in [0, 180].
    reward ``= max(0, 1 - e / tolerance)``: 1 for the exact angle, 0 at ``tolerance`` degrees off or more.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards.common import check_tunables
from verl_mm_tools.rewards.text import extract_last_tagged, last_number, strip_template_leftovers

logger = logging.getLogger(__name__)

__all__ = [
    "RotationReward",
    "circular_angle_error",
    "make_rotation_reward",
    "parse_angle_answer",
    "rotation_reward",
    "rotation_reward_45",
    "rotation_reward_180",
]

_TUNABLES = ("tolerance", "require_tag")


def circular_angle_error(a: float, b: float) -> float:
    """Smallest rotation, in degrees, between angles ``a`` and ``b``: in [0, 180]; 359 vs 1 is 2."""
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"angles must be finite, got {a!r} and {b!r}")
    difference = math.fmod(abs(a - b), 360.0)
    return min(difference, 360.0 - difference)


def parse_angle_answer(solution_str: str, *, require_tag: bool = False) -> tuple[float | None, str]:
    """The predicted angle in ``solution_str`` (see the module docstring) and a reason ("ok" when found)."""
    text = strip_template_leftovers(solution_str)
    tagged = extract_last_tagged(text, "answer")
    if tagged is None and require_tag:
        return None, "no <answer>...</answer> block"
    angle = last_number(text if tagged is None else tagged)
    if angle is None:
        where = "inside <answer>...</answer>" if tagged is not None else "in the response"
        return None, f"no number {where}"
    return angle, "ok"


def _ground_truth_angle(ground_truth: object) -> float:
    angle: float | None
    if isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool):
        angle = float(ground_truth)
    else:
        angle = last_number(str(ground_truth))
    if angle is None or not math.isfinite(angle):
        # A dataset column is user configuration: say which value broke.
        raise ConfigError(f"rotation ground truth must be a number of degrees, got {ground_truth!r}")
    return angle


def _check_tolerance(tolerance: float) -> None:
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance <= 180:
        raise ConfigError(f"rotation reward tolerance must be a number of degrees in (0, 180], got {tolerance!r}")


def rotation_reward(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: dict | None = None,
    *,
    tolerance: float = 180.0,
    require_tag: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score a rotation estimate: ``max(0, 1 - circular_error / tolerance)``.

    Args:
        data_source: Unused; part of verl's signature.
        solution_str: The decoded response.
        ground_truth: The true angle in degrees (number or numeric string).
        extra_info: Unused; part of verl's signature.
        tolerance: Error in degrees at which the reward reaches 0, in (0, 180].
        require_tag: Score 0 unless the angle is inside ``<answer>...</answer>``.
        **kwargs: Only the arguments verl passes to every reward function; anything else is a ConfigError.

    Returns:
        ``{"score", "angle_error", "predicted_angle", "reason"}``; an unparseable answer scores 0 with
        ``angle_error`` and ``predicted_angle`` None and the reason saying why.
    """
    check_tunables("rotation_reward()", kwargs, _TUNABLES)
    _check_tolerance(tolerance)
    target = _ground_truth_angle(ground_truth)
    predicted, reason = parse_angle_answer(solution_str, require_tag=require_tag)
    if predicted is None:
        return {"score": 0.0, "angle_error": None, "predicted_angle": None, "reason": reason}
    error = circular_angle_error(predicted, target)
    score = max(0.0, 1.0 - error / tolerance)
    return {"score": score, "angle_error": error, "predicted_angle": predicted, "reason": "ok"}


def rotation_reward_180(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: dict | None = None,
    *,
    require_tag: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`rotation_reward` with ``tolerance=180``: 1 - error/180 (only the opposite angle earns nothing)."""
    check_tunables("rotation_reward_180()", kwargs, ("require_tag",))
    return rotation_reward(
        data_source, solution_str, ground_truth, extra_info, tolerance=180.0, require_tag=require_tag, **kwargs
    )


def rotation_reward_45(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: dict | None = None,
    *,
    require_tag: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`rotation_reward` with ``tolerance=45``: 1 - error/45, 0 at 45 degrees off or more."""
    check_tunables("rotation_reward_45()", kwargs, ("require_tag",))
    return rotation_reward(
        data_source, solution_str, ground_truth, extra_info, tolerance=45.0, require_tag=require_tag, **kwargs
    )


@dataclasses.dataclass(frozen=True)
class RotationReward:
    """A picklable :func:`rotation_reward` with fixed tunables (Ray pickles reward functions; closures don't)."""

    tolerance: float = 180.0
    require_tag: bool = False

    def __post_init__(self) -> None:
        _check_tolerance(self.tolerance)

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: object, extra_info: dict | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        check_tunables(f"{self!r}", kwargs)  # tunables are fixed by the factory
        return rotation_reward(
            data_source,
            solution_str,
            ground_truth,
            extra_info,
            tolerance=self.tolerance,
            require_tag=self.require_tag,
            **kwargs,
        )


def make_rotation_reward(*, tolerance: float = 180.0, require_tag: bool = False) -> RotationReward:
    """A rotation reward with the given tolerance (degrees, in (0, 180]); picklable."""
    return RotationReward(tolerance=tolerance, require_tag=require_tag)
