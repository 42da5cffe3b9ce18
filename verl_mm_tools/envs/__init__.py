"""Environments for the mm_tool loop's feedback turns (see ``base`` for the API)."""

from verl_mm_tools.envs.base import ENVIRONMENTS, Environment, Observation, Sample, make_environment, register_environment
from verl_mm_tools.envs.feedback import AnswerFeedbackEnv, RotationFeedbackEnv

__all__ = [
    "ENVIRONMENTS",
    "AnswerFeedbackEnv",
    "Environment",
    "Observation",
    "RotationFeedbackEnv",
    "Sample",
    "make_environment",
    "register_environment",
]
