"""``judge_feedback``: a VLM judge scores each answer, turn by turn; below the bar the model is told and tries again.

The per-turn form of ``rewards.judge.judge_reward``: the same rubric, messages (the answer as quoted data), strict
verdicts, cache and retries, asked from an OpenAI-compatible endpoint (``endpoint`` and ``model``: an environment
runs in the rollout workers, which verl does not tell its reward-model router). The judge sees the question and the
prompt's images. Each answer's turn reward is its scaled score (``fallback_score`` when the judge gave none); the
episode ends once a score reaches ``success_score`` or after ``max_attempts`` answers. The verdict's fields go to the
step's ``info`` (the dumps and the viewer show them).

    env: {name: judge_feedback, endpoint: http://judge:8000/v1, model: Qwen/Qwen2.5-VL-7B-Instruct, max_attempts: 2}
"""

from __future__ import annotations

from typing import Any

from verl_mm_tools.envs.base import Environment, Observation, Sample, register_environment
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.judge.context import ImageOrigin, JudgeContext, JudgeImage
from verl_mm_tools.rewards.judge import JudgeSettings, judge_answer


@register_environment
class JudgeFeedbackEnv(Environment):
    """Args: ``max_attempts`` (answers allowed, the first included), ``success_score`` (a scaled score in [0, 1] that
    ends the episode as solved), ``show_score`` (the feedback says the judge's score), and ``judge_reward``'s options
    (``endpoint`` and ``model`` required)."""

    name = "judge_feedback"

    def __init__(self, max_attempts: int = 3, success_score: float = 1.0, show_score: bool = True, **judge: Any):
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"{self.name}: max_attempts must be a positive integer, got {max_attempts!r}")
        if not judge.get("endpoint"):
            raise ConfigError(f"{self.name}: give the judge's endpoint (an OpenAI-compatible URL) and model")
        self.settings = JudgeSettings.from_options(judge)
        self.max_attempts, self.success_score, self.show_score = max_attempts, float(success_score), show_score
        self.sample: Sample | None = None
        self.context: JudgeContext | None = None
        self.attempts = 0

    def reset(self, sample: Sample) -> Observation | None:
        images = tuple(JudgeImage.of(index, ImageOrigin.PROMPT, image) for index, image in enumerate(sample.images, 1))
        self.sample, self.context, self.attempts = sample, JudgeContext(sample.question, images), 0
        return None

    async def step(  # type: ignore[override]  # the loop awaits an async step (envs.base.call)
        self, assistant_text: str
    ) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self.sample is None or self.context is None:
            raise RuntimeError(f"environment {self.name!r}: step() before reset(sample)")
        self.attempts += 1
        verdict = await judge_answer(self.settings, self.context, self.sample.ground_truth, assistant_text)
        score = verdict["judge_score"]
        solved = bool(verdict["judge_judged"]) and score >= self.success_score
        done = solved or self.attempts >= self.max_attempts
        info = {"attempt": self.attempts, "solved": solved, **verdict}
        if done:
            return Observation(), score, True, info
        return self.feedback(verdict), score, False, info

    def feedback(self, verdict: dict[str, float]) -> Observation:
        left = self.max_attempts - self.attempts
        rubric = self.settings.rubric
        if verdict["judge_judged"] and self.show_score:
            raw = rubric.min_score + verdict["judge_score"] * (rubric.max_score - rubric.min_score)
            said = f"The judge gave your answer {raw:g} of {rubric.max_score:g}."
        else:
            said = "Your answer was not accepted."
        return Observation(text=f"{said} Please try again; {left} attempt(s) left.")
