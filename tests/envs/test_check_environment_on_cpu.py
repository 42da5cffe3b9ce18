"""check_environment: the README's environment passes and says what it checked; broken ones fail with every problem
listed; class paths select environments without registering them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verl_mm_tools.envs import Environment, EnvironmentCheckError, Observation, check_environment, make_environment

CUSTOM = Path(__file__).resolve().parents[2] / "examples" / "custom"


@pytest.fixture
def custom_examples(monkeypatch):
    monkeypatch.syspath_prepend(str(CUSTOM))
    yield
    for name in ("my_env", "my_tools"):
        sys.modules.pop(name, None)


def test_the_readme_environment_passes_and_the_report_lists_each_check(custom_examples):
    report = check_environment("my_env.RetryEnv", ground_truth="red", answer="<answer>red</answer>")
    assert str(report).splitlines() == [
        "environment RetryEnv: 6 checks passed",
        "  ok  RetryEnv is an Environment with a step method",
        "  ok  reset(sample)",
        "  ok  step('<answer>red</answer>')",
        "  ok  step('')",
        "  ok  step('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'...)",
        "  ok  close()",
    ]
    env = make_environment("my_env.RetryEnv")
    assert type(env).__name__ == "RetryEnv"


class Broken(Environment):
    name = "broken_for_check"

    def reset(self, sample):
        return "a string, not an Observation"

    def step(self, assistant_text):
        if not assistant_text:
            raise ValueError("empty answer")
        return Observation(text="again"), float("nan"), "no", []

    def close(self):
        raise OSError("disk gone")


def test_a_broken_environment_fails_with_every_problem():
    with pytest.raises(EnvironmentCheckError) as raised:
        check_environment(Broken)
    assert str(raised.value).splitlines() == [
        "environment Broken fails check_environment:",
        "- reset(sample) must return an Observation (or None), got str",
        "- step('<answer>1</answer>') must return a finite number as reward, got nan",
        "- step('') raised ValueError: empty answer",
        "- step('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'...) must return a finite number as reward, got nan",
        "- close() raised OSError: disk gone",
    ]
