"""Built-in environments: exact scores, feedback texts, done flags, the rotation environment's turned-back image."""

from __future__ import annotations

import pytest
from PIL import Image

from verl_mm_tools.envs import AnswerFeedbackEnv, Environment, RotationFeedbackEnv, Sample, make_environment
from verl_mm_tools.errors import ConfigError


def upright() -> Image.Image:
    image = Image.new("RGB", (84, 56), (128, 128, 128))
    image.paste((255, 0, 0), (0, 0, 28, 28))
    return image


def sample(ground_truth="90", images=()):
    return Sample(data_source="verl_mm_tools/rotation", ground_truth=ground_truth, extra_info={}, images=list(images))


def test_answer_feedback_retries_until_right_or_out_of_attempts():
    env = make_environment({"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 3})
    assert env.reset(sample()) is None
    observation, reward, done, info = env.step("<answer>45</answer><|im_end|>")
    assert (reward, done) == (0.0, False)
    assert observation.text == "Your answer is not correct. Please try again; 2 attempt(s) left."
    assert info == {"attempt": 1, "solved": False, "angle_error": 45.0, "predicted_angle": 45.0, "reason": "ok"}
    observation, reward, done, info = env.step("It is <answer>80</answer>")
    assert reward == pytest.approx(1 - 10 / 45) and not done
    observation, reward, done, info = env.step("no idea")
    assert (reward, done, info["attempt"], info["solved"]) == (0.0, True, 3, False)


def test_a_right_first_answer_ends_the_episode():
    env = AnswerFeedbackEnv(reward_fn="rotation_reward_180")
    env.reset(sample("270"))
    assert env.step("<answer>-90</answer>")[1:3] == (1.0, True)


def test_rotation_feedback_shows_the_image_turned_back_by_the_estimate():
    rotated = upright().rotate(90, expand=True)
    env = RotationFeedbackEnv(max_attempts=2)
    env.reset(sample("90", [rotated]))
    observation, reward, done, _ = env.step("<answer>180</answer>")
    assert (reward, done) == (0.0, False)
    assert observation.text.startswith("Image 1 turned back by your estimate of 180 degrees")
    # rotated by +90, turned back by -180: the upright image rotated by -90
    assert list(observation.images[0].getdata()) == list(upright().rotate(-90, expand=True).getdata())


@pytest.mark.parametrize("answer", ["90", "-270", "450"])
def test_turning_back_by_the_right_angle_restores_the_upright_image(answer):
    env = RotationFeedbackEnv(reward_fn="rotation_reward_180", success_threshold=2.0, max_attempts=5)
    env.reset(sample("90", [upright().rotate(90, expand=True)]))
    observation, reward, done, _ = env.step(f"<answer>{answer}</answer>")
    assert (reward, done) == (1.0, False)
    assert list(observation.images[0].getdata()) == list(upright().getdata())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("answer_feedbak", r"unknown environment 'answer_feedbak'.*Did you mean 'answer_feedback'"),
        ({"name": "rotation", "tolerance": 3}, r"environment 'rotation' does not accept \['tolerance'\]"),
        ({"max_attempts": 2}, "selected by a name or a mapping with a 'name' key"),
        ({"name": "answer_feedback", "max_attempts": 0}, "max_attempts must be a positive integer, got 0"),
    ],
)
def test_bad_environment_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        make_environment(spec)


def test_registering_a_taken_name_is_refused():
    from verl_mm_tools.envs import register_environment
    from verl_mm_tools.errors import PluginRegistrationError

    class Impostor(Environment):
        name = "rotation"

        def step(self, assistant_text):
            return None, 0.0, True, {}

    with pytest.raises(PluginRegistrationError, match="environment 'rotation'"):
        register_environment(Impostor)


def test_an_environment_without_step_is_refused_at_registration():
    from verl_mm_tools.envs import register_environment

    class Mute(Environment):
        name = "mute"

    with pytest.raises(ConfigError, match=r"environment class .*Mute does not implement step\(assistant_text\)"):
        register_environment(Mute)
    with pytest.raises(NotImplementedError, match=r"environment .*Mute does not implement step"):
        Mute().step("<answer>1</answer>")
