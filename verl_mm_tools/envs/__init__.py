"""Environments for the mm_tool loop's feedback turns (see ``base`` for the API)."""

from verl_mm_tools.envs.base import (
    ENVIRONMENTS,
    Environment,
    Observation,
    Sample,
    make_environment,
    register_environment,
)
from verl_mm_tools.envs.check import EnvironmentCheckError, acheck_environment, check_environment, check_gui_tool
from verl_mm_tools.envs.feedback import AnswerFeedbackEnv, RotationFeedbackEnv
from verl_mm_tools.envs.judge_feedback import JudgeFeedbackEnv

__all__ = [
    "ENVIRONMENTS",
    "AnswerFeedbackEnv",
    "EnvironmentCheckError",
    "Environment",
    "JudgeFeedbackEnv",
    "Observation",
    "RotationFeedbackEnv",
    "Sample",
    "acheck_environment",
    "check_environment",
    "check_gui_tool",
    "make_environment",
    "register_environment",
]
