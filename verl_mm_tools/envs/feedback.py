"""Built-in environments: answer feedback with retries (AReaL's retry) and rotation feedback with an image."""

from __future__ import annotations

import math
from typing import Any

from verl_mm_tools.envs.base import Environment, Observation, Sample, register_environment
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.ops import rotate
from verl_mm_tools.rewards import get_reward_function, parse_angle_answer
from verl_mm_tools.rewards.common import as_result_dict


@register_environment
class AnswerFeedbackEnv(Environment):
    """Scores each answer with a reward function; when it is wrong, says so and lets the model try again.

    Args:
        reward_fn: A name from ``verl_mm_tools.rewards.REWARD_FUNCTIONS``, or None for verl's
            ``default_compute_score`` (which dispatches on the sample's ``data_source``).
        reward_fn_kwargs: Tunables passed to the reward function.
        max_attempts: Answers allowed, the first included.
        success_threshold: A score at or above it ends the trajectory as solved.
    """

    name = "answer_feedback"

    def __init__(
        self,
        reward_fn: str | None = None,
        reward_fn_kwargs: dict | None = None,
        max_attempts: int = 3,
        success_threshold: float = 1.0,
    ):
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"{self.name}: max_attempts must be a positive integer, got {max_attempts!r}")
        self.reward_fn = get_reward_function(reward_fn) if reward_fn else _verl_default_score
        self.reward_fn_kwargs = dict(reward_fn_kwargs or {})
        self.max_attempts = max_attempts
        self.success_threshold = float(success_threshold)
        self.sample: Sample | None = None
        self.attempts = 0

    def reset(self, sample: Sample) -> Observation | None:
        self.sample, self.attempts = sample, 0
        return None

    def current_sample(self) -> Sample:
        """The sample of the last ``reset``; a RuntimeError before the first one."""
        if self.sample is None:
            raise RuntimeError(f"environment {self.name!r}: step() before reset(sample)")
        return self.sample

    def score(self, assistant_text: str) -> dict[str, Any]:
        sample = self.current_sample()
        result = self.reward_fn(
            sample.data_source, assistant_text, sample.ground_truth, sample.extra_info, **self.reward_fn_kwargs
        )
        return as_result_dict(result)

    def step(self, assistant_text: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        self.attempts += 1
        result = self.score(assistant_text)
        score = float(result["score"])
        solved = score >= self.success_threshold
        done = solved or self.attempts >= self.max_attempts
        info = {"attempt": self.attempts, "solved": solved, **{k: v for k, v in result.items() if k != "score"}}
        if done:
            return Observation(), score, True, info
        return self.feedback(assistant_text, result), score, False, info

    def feedback(self, assistant_text: str, result: dict[str, Any]) -> Observation:
        left = self.max_attempts - self.attempts
        reason = result.get("reason")
        detail = f" ({reason})" if reason and reason != "ok" else ""
        return Observation(text=f"Your answer is not correct{detail}. Please try again; {left} attempt(s) left.")


@register_environment
class RotationFeedbackEnv(AnswerFeedbackEnv):
    """Answer feedback for rotation estimates, showing the prompt image turned back by the model's estimate: it is
    upright exactly when the estimate is right. The sample's first image is the rotated image (``image_id`` 1)."""

    name = "rotation"

    def __init__(self, reward_fn: str = "rotation_reward_45", show_image: bool = True, **kwargs: Any):
        super().__init__(reward_fn=reward_fn, **kwargs)
        self.show_image = show_image

    def feedback(self, assistant_text: str, result: dict[str, Any]) -> Observation:
        text = super().feedback(assistant_text, result).text
        angle, _ = parse_angle_answer(assistant_text)
        if not self.show_image or angle is None or not math.isfinite(angle) or not self.current_sample().images:
            return Observation(text=text)
        estimate = math.fmod(angle, 360.0)
        turned_back = rotate(self.current_sample().images[0], -estimate)
        return Observation(
            text=f"Image 1 turned back by your estimate of {estimate:g} degrees; it is upright only if the estimate "
            f"is right. {text}",
            images=(turned_back,),
        )


def _verl_default_score(
    data_source: str | None,
    solution_str: str,
    ground_truth: object,
    extra_info: dict[str, Any] | None = None,
    **kwargs: object,
) -> float | dict[str, Any]:
    from verl.utils.reward_score import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
