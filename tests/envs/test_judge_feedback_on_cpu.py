"""``judge_feedback``: a scripted judge on 127.0.0.1 scores each answer; exact turn rewards, feedback, done flags."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from PIL import Image

from verl_mm_tools.envs import Sample, make_environment
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards import judge as judge_module
from verl_mm_tools.testkit.judge import GullibleJudge, JudgeReply, ScriptedJudge


@pytest.fixture(autouse=True)
def fresh_clients():
    judge_module._client.cache_clear()
    yield
    judge_module._client.cache_clear()


def sample() -> Sample:
    row = {
        "data_source": "colours",
        "reward_model": {"ground_truth": "red"},
        "raw_prompt": [{"role": "user", "content": "<image>Which colour is the square?"}],
    }
    return Sample.from_row(row, [Image.new("RGB", (6, 4), (200, 0, 0))])


def test_each_answer_is_judged_with_the_prompt_image_and_a_low_score_asks_again():
    with ScriptedJudge(GullibleJudge("red")) as judge:
        env = make_environment({"name": "judge_feedback", "endpoint": judge.url, "model": "j", "max_attempts": 3})
        assert env.reset(sample()) is None
        observation, reward, done, info = asyncio.run(env.step("<|im_start|>blue"))
        assert reward == pytest.approx(0.2) and not done
        assert observation.text == "The judge gave your answer 2 of 10. Please try again; 2 attempt(s) left."
        assert (info["attempt"], info["solved"], info["judge_judged"]) == (1, False, 1.0)
        observation, reward, done, info = asyncio.run(env.step("red<|im_end|>"))
    assert reward == pytest.approx(0.9) and not done  # 0.9 is below success_score 1.0
    first = judge.requests[0]["messages"][1]["content"]
    assert first[0]["text"] == 'QUESTION: "Which colour is the square?"' and first[1]["text"] == "Image 1 (prompt):"
    png = base64.b64decode(first[2]["image_url"]["url"].split(",", 1)[1])
    assert png == sample_png()
    assert [json.loads(body["messages"][1]["content"][-1]["text"]) for body in judge.requests] == ["blue", "red"]


def sample_png() -> bytes:
    from verl_mm_tools.judge.context import ImageOrigin, JudgeImage

    return JudgeImage.of(1, ImageOrigin.PROMPT, Image.new("RGB", (6, 4), (200, 0, 0))).png


def test_a_score_at_the_bar_ends_the_episode_solved_and_a_silent_judge_falls_back():
    with ScriptedJudge(lambda body: "<score>8</score>") as judge:
        env = make_environment({"name": "judge_feedback", "endpoint": judge.url, "model": "j", "success_score": 0.8})
        env.reset(sample())
        observation, reward, done, info = asyncio.run(env.step("red"))
    assert (reward, done, info["solved"]) == (pytest.approx(0.8), True, True) and observation.text == ""
    with ScriptedJudge(lambda body: JudgeReply(status=400, body="no")) as judge:
        env = make_environment(
            {"name": "judge_feedback", "endpoint": judge.url, "model": "j", "fallback_score": 0.1, "max_attempts": 2}
        )
        env.reset(sample())
        observation, reward, done, info = asyncio.run(env.step("red"))
    assert (reward, done, info["judge_failed"]) == (0.1, False, 1.0)
    assert observation.text == "Your answer was not accepted. Please try again; 1 attempt(s) left."


def test_the_environment_needs_an_endpoint():
    with pytest.raises(ConfigError, match="judge_feedback: give the judge's endpoint"):
        make_environment({"name": "judge_feedback", "model": "j"})
