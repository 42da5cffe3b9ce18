"""environment_reward: the environment's rewards as the score when its episode ended, ``unfinished`` otherwise, and
what the loop hands over checked before it is summed."""

from __future__ import annotations

import pytest

from verl_mm_tools.errors import ConfigError, TrajectoryValidationError
from verl_mm_tools.rewards import environment_reward, get_reward_function


def score(extra_info, **kwargs):
    return environment_reward("miniwob/click-test", "", "", extra_info, **kwargs)


def test_an_ended_episode_scores_the_sum_of_its_rewards():
    ended = {"mm_tool/stop_reason": "episode_done", "tool_rewards": [0.0, 0.0, 1.0], "turn_scores": []}
    assert score(ended) == {"score": 1.0, "acc": 1.0, "reason": "ended"}
    answered = {"mm_tool/stop_reason": "answered", "tool_rewards": [0.0], "turn_scores": [-1.0]}
    assert score(answered) == {"score": -1.0, "acc": 0.0, "reason": "ended"}
    partial = {"mm_tool/stop_reason": "episode_done", "tool_rewards": [0.25]}
    assert score(partial) == {"score": 0.25, "acc": 1.0, "reason": "ended"}


@pytest.mark.parametrize("stop", ["turn_limit", "length_limit", "budget", "tool_failed", "error", None])
def test_an_unfinished_episode_scores_unfinished(stop):
    info = {"mm_tool/stop_reason": stop, "tool_rewards": [0.0, 0.0]}
    assert score(info) == {"score": -1.0, "acc": 0.0, "reason": str(stop)}
    assert score(info, unfinished=0.0)["score"] == 0.0


@pytest.mark.parametrize(
    ("rewards", "message"),
    [
        ("1.0", "must be a list of rewards, got str"),
        ({"a": 1}, "must be a list of rewards, got dict"),
        ([1.0, float("nan")], "must hold finite numbers"),
        ([True], "must hold finite numbers"),
        (["1"], "must hold finite numbers"),
    ],
)
def test_what_the_loop_handed_over_is_checked(rewards, message):
    with pytest.raises(TrajectoryValidationError, match=message):
        score({"mm_tool/stop_reason": "episode_done", "tool_rewards": rewards})


def test_it_is_a_built_in_and_refuses_unknown_tunables():
    assert get_reward_function("environment_reward") is environment_reward
    with pytest.raises(ConfigError, match="unfinshed"):
        score({}, unfinshed=0.0)
