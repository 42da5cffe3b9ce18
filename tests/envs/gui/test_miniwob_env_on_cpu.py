"""The miniwob environment on real Chromium: seeded episodes, MiniWoB's own rewards and termination, browsers reused
through the pool, and a browser that dies or hangs failing only its own trajectory."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from verl_mm_tools.envs import Sample, make_environment
from verl_mm_tools.envs.gui.browser import live_processes
from verl_mm_tools.envs.gui.miniwob_env import POOL, BrowserLost, MiniWoBEnv
from verl_mm_tools.envs.gui.screen import SCREEN_INFO_KEY, Click, TypeText
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.runtime.miniwob_oracle import oracle_action

pytestmark = pytest.mark.integration  # starts Chromium


def run(coroutine):
    return asyncio.run(coroutine)


def sample(seed: int) -> Sample:
    return Sample(data_source="miniwob/test", ground_truth=None, extra_info={"seed": seed})


async def episode(task: str, seed: int, **kwargs):
    env = MiniWoBEnv(task, **kwargs)
    observation = await env.reset(sample(seed))
    return env, observation


def oracle_click(env: MiniWoBEnv) -> Click:
    name, arguments = oracle_action(env.task, env.observation)
    assert name == "click"
    return Click(arguments["x"], arguments["y"])


def test_a_seed_fixes_the_episode_and_the_oracle_solves_it():
    async def main():
        first, shown = await episode("click-button", 3)
        again, shown_again = await episode("click-button", 3)
        other, shown_other = await episode("click-button", 4)
        try:
            assert (
                shown.text
                == shown_again.text
                == (
                    'Task: Click on the "no" button.\n'
                    "Act on the page with the tools; points are pixels of the latest screenshot."
                )
            )
            assert shown.images[0].size == first.page_size == (160, 210)
            assert shown.images[0].info[SCREEN_INFO_KEY] == first.screen_token != again.screen_token
            assert np.array_equal(np.asarray(shown.images[0]), np.asarray(shown_again.images[0]))
            assert shown_other.text != shown.text
            result = await first.act(oracle_click(first))
            assert (result.screenshot, result.reward, result.done) == (None, 1.0, True)
            assert result.info == {"task": "click-button", "done": True, "raw_reward": 1, "reason": None}
        finally:
            for env in (first, again, other):
                await env.close()

    run(main())


def test_a_wrong_click_ends_the_episode_with_minus_one_and_binary_rewards():
    async def main():
        env, _ = await episode("click-button", 3, reward="binary")
        try:
            no_button = Click(150.0, 200.0)  # the page's corner: no button there, nothing happens
            result = await env.act(no_button)
            assert (result.reward, result.done) == (0.0, False)
            assert result.screenshot is not None and result.screenshot.size == (160, 210)
            target = dict(env.observation["fields"])["target"]
            wrong = next(e for e in env.observation["dom_elements"] if e["tag"] == "button" and e["text"] != target)
            result = await env.act(Click(float(wrong["left"][0]) + 2, float(wrong["top"][0]) + 2))
            assert (result.reward, result.done, result.info["raw_reward"]) == (-1.0, True, -1)
            with pytest.raises(RuntimeError, match="act\\(\\) after the episode ended"):
                await env.act(no_button)
        finally:
            await env.close()

    run(main())


def test_max_actions_ends_an_episode_undone_and_success_scores_it_zero():
    async def main():
        success, _ = await episode("click-button", 3, reward="success", max_actions=2)
        raw, _ = await episode("click-test", 3, max_actions=1)
        try:
            no_button = Click(150.0, 200.0)
            assert (await success.act(no_button)).done is False  # one action left
            result = await success.act(no_button)
            assert (result.reward, result.done, result.screenshot) == (0.0, True, None)
            assert result.info["reason"] == "2 actions, the episode's max_actions, without ending it"
            result = await raw.act(no_button)
            assert (result.reward, result.done, result.info["raw_reward"]) == (-1.0, True, 0.0)
            again, _ = await episode("click-test", 3, reward="success", max_actions=1)
            try:
                assert (await again.act(oracle_click(again))).reward == 1.0  # a hit ends it first: MiniWoB's reward
            finally:
                await again.close()
            wrong, _ = await episode("click-button", 3, reward="success")
            try:
                target = dict(wrong.observation["fields"])["target"]
                other = next(
                    e for e in wrong.observation["dom_elements"] if e["tag"] == "button" and e["text"] != target
                )
                result = await wrong.act(Click(float(other["left"][0]) + 2, float(other["top"][0]) + 2))
                assert (result.reward, result.done) == (0.0, True)  # MiniWoB's -1 failure, as no success
                assert wrong.step("no call")[1] == 0.0  # an answer without acting: no success either
            finally:
                await wrong.close()
        finally:
            await success.close()
            await raw.close()

    run(main())


def test_typing_into_a_field_and_submitting():
    async def main():
        env, shown = await episode("enter-text", 5)
        try:
            target = dict(env.observation["fields"])["target"]
            assert f'Enter "{target}" into the text field' in shown.text
            steps = 0
            while True:
                name, arguments = oracle_action(env.task, env.observation)
                action = Click(arguments["x"], arguments["y"]) if name == "click" else TypeText(arguments["text"])
                result = await env.act(action)
                steps += 1
                if result.done:
                    break
            assert (steps, result.reward) == (3, 1.0)  # click the field, type, click Submit
        finally:
            await env.close()

    run(main())


def test_an_answer_without_acting_ends_the_episode_as_a_time_out():
    async def main():
        env, _ = await episode("click-test", 0)
        try:
            observation, reward, done, info = env.step("I clicked it.")
            assert (observation.text, observation.images, reward, done) == ("", (), -1.0, True)
            assert info == {"task": "click-test", "reason": "answered without acting"}
        finally:
            await env.close()

    run(main())


def test_miniwobs_time_limit_applies_only_when_set():
    async def main():
        env, _ = await episode("click-test", 0, time_limit_s=0.3)
        try:
            await asyncio.sleep(0.8)
            result = await env.act(oracle_click(env))
            assert (result.reward, result.done) == (-1.0, True)  # MiniWoB's time-out
        finally:
            await env.close()
        env, _ = await episode("click-test", 0)  # no limit: the same wait does not end it
        try:
            await asyncio.sleep(0.8)
            assert (await env.act(oracle_click(env))).reward == 1.0
        finally:
            await env.close()

    run(main())


def test_the_pool_reuses_a_browser_across_episodes():
    async def main():
        env, _ = await episode("focus-text", 1)
        await env.close()
        launched, idle = POOL.launched, POOL.idle
        env, _ = await episode("focus-text", 2)
        assert (POOL.launched, POOL.idle) == (launched, idle - 1)
        result = await env.act(oracle_click(env))
        assert result.reward == 1.0
        await env.close()
        assert POOL.idle == idle

    run(main())


def test_a_browser_that_dies_fails_its_trajectory_and_is_replaced():
    async def main():
        env, _ = await episode("click-test", 7)
        browser = env.browser
        assert browser is not None
        workdir = browser.gym.browser.workdir
        browser.kill()  # Chromium and chromedriver gone mid-episode
        with pytest.raises(BrowserLost, match="miniwob click-test: the browser failed"):
            await env.act(Click(10.0, 10.0))
        await env.close()
        assert live_processes(str(workdir)) == [] and browser not in POOL._idle
        replacement, _ = await episode("click-test", 7)
        assert (await replacement.act(oracle_click(replacement))).reward == 1.0
        await replacement.close()

    run(main())


def test_a_hung_browser_is_killed_after_its_timeout():
    async def main():
        env, _ = await episode("click-test", 8, browser_timeout_s=2.0)
        browser = env.browser
        assert browser is not None
        workdir = browser.gym.browser.workdir
        browser.gym.gym_instance.driver.execute_script("setTimeout(() => { while (true) {} }, 300);")
        await asyncio.sleep(0.6)  # the page's script now spins forever: the next call cannot be answered
        started = time.monotonic()
        with pytest.raises(BrowserLost, match=r"the browser failed \(no answer within 2 s\); it was killed"):
            await env.act(Click(10.0, 10.0))
        assert time.monotonic() - started < 10
        await env.close()
        assert live_processes(str(workdir)) == []

    run(main())


RED = (255, 0, 0)


def button_centre(env: MiniWoBEnv) -> tuple[float, float, tuple[float, ...]]:
    """The click-test button's centre in page px, and its box (left, top, width, height) from MiniWoB's DOM."""
    (button,) = [element for element in env.observation["dom_elements"] if element["tag"] == "button"]
    box = tuple(float(button[key][0]) for key in ("left", "top", "width", "height"))
    return box[0] + box[2] / 2, box[1] + box[3] / 2, box


def pixel(image, x: float, y: float) -> tuple[int, ...]:
    return tuple(image.convert("RGB").getpixel((int(x), int(y))))


def test_high_contrast_paints_the_button_red_and_keeps_its_box_clicks_and_reward():
    async def main():
        plain, plain_shown = await episode("click-test", 3)
        x, y, plain_box = button_centre(plain)
        assert pixel(plain_shown.images[0], x, y) != RED
        browser = plain.browser
        await plain.close()
        red, red_shown = await episode("click-test", 3, high_contrast=True, reward="success")
        try:
            assert red.browser is browser  # the pool's browser, reused
            assert button_centre(red) == (x, y, plain_box) == (89.0, 166.0, (47.0, 124.0, 84.0, 84.0))
            assert pixel(red_shown.images[0], x, y) == RED
            missed = await red.act(Click(5.0, 205.0))  # the area's corner: no button, the episode goes on
            assert (missed.reward, missed.done) == (0.0, False)
            assert pixel(missed.screenshot, x, y) == RED
            hit = await red.act(Click(x, y))
            assert (hit.reward, hit.done, hit.info["raw_reward"]) == (1.0, True, 1)
        finally:
            await red.close()
        again, again_shown = await episode("click-test", 4, high_contrast=True)  # MiniWoB re-renders the task
        try:
            assert again.browser is browser
            assert pixel(again_shown.images[0], *button_centre(again)[:2]) == RED
        finally:
            await again.close()
        plain_again, plain_again_shown = await episode("click-test", 3)  # the style goes with the option
        try:
            assert plain_again.browser is browser
            assert np.array_equal(np.asarray(plain_again_shown.images[0]), np.asarray(plain_shown.images[0]))
        finally:
            await plain_again.close()

    run(main())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "miniwob", "task": "click-buton"}, r"unknown task 'click-buton'.*Did you mean 'click-button'"),
        ({"name": "miniwob", "task": "click-test", "reward": "time"}, r"reward must be one of \['raw', 'original'"),
        ({"name": "miniwob", "task": "click-test", "time_limit_s": 0}, r"time_limit_s must be a positive number"),
        ({"name": "miniwob", "task": "click-test", "browser_timeout_s": "5"}, "browser_timeout_s must be a positive"),
        ({"name": "miniwob", "task": "click-test", "max_actions": 0}, r"max_actions must be a whole number >= 1"),
        ({"name": "miniwob", "task": "click-test", "max_actions": 1.5}, r"max_actions must be a whole number >= 1"),
        ({"name": "miniwob", "task": "click-test", "headless": False}, r"does not accept \['headless', 'task'\]"),
        (
            {"name": "miniwob", "task": "click-test", "high_contrast": "yes"},
            r"high_contrast must be true or false.*'yes'",
        ),
        ({"name": "minwob", "task": "click-test"}, r"unknown environment 'minwob'.*Did you mean 'miniwob'"),
    ],
)
def test_bad_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        make_environment(spec)


def test_a_row_without_a_seed_is_a_config_error():
    env = MiniWoBEnv("click-test")
    row = Sample(data_source=None, ground_truth=None, extra_info={"seed": "7"})
    with pytest.raises(ConfigError, match=r"a row needs an integer extra_info.seed \(or index\).*Got extra_info keys"):
        run(env.reset(row))
