"""MiniWoB++ tasks (Farama's ``miniwob`` 1.1.0, its Gymnasium environments) in isolated headless Chromium, as the
mm_tool environment ``miniwob``: ``env: {name: miniwob, task: click-button}`` in a row's ``extra_info`` or the loop's
``env`` option.

An episode: ``reset`` shows the task's instruction and a screenshot of the page; the model acts with the GUI tools
(click, type, press, scroll: ``verl_mm_tools.tools.gui_tools``), each answered with the new screenshot; MiniWoB ends
the episode and gives its reward. An answer without a tool call ends the episode as MiniWoB's time-out does (reward
-1). The episode's seed is the row's ``extra_info.seed`` (``make-data miniwob`` writes it), else its ``index``.

Rewards (``reward``): ``raw`` (default), MiniWoB's reward without its time penalty; ``original``, MiniWoB's own, scaled
by the time left; ``binary``, 1 for a full success and -1 otherwise; ``success``, 1 for a full success and 0 otherwise
(an episode's reward is then its success, the rate ``eval`` reports). MiniWoB ends an episode after 10 s of wall time,
which counts the model's generation and its wait for the GPU; so by default the limit is lifted and the turn limit
bounds an episode (``time_limit_s`` sets one). ``max_actions`` ends an episode undone after that many actions (a click
that misses does not end click-test): the task then scores as MiniWoB's time-out (-1; 0 with ``success``).

``high_contrast: true`` paints the task area's buttons solid red (fill, border and label: ``HIGH_CONTRAST_CSS``), for
a model that cannot see MiniWoB's grey-on-white buttons (the tiny one: docs/experiments/gui_click.md). The page, the
boxes, the clicks and the reward are MiniWoB's own; only the paint differs. The rule is a style element set at every
episode's start, after MiniWoB renders the task, so every screenshot shows it, and removed again for an episode
without the option on a reused browser.

Browsers: one per environment instance, taken from a process-wide pool when a trajectory starts and given back when it
ends, reset for the next episode (not relaunched). Every browser call runs off the event loop with a timeout
(``browser_timeout_s``); a browser that fails or hangs is killed, its trajectory fails (masked) and the pool launches
a fresh one for the next. Launching, isolation and cleanup: ``browser.py``.

What this module adapts of ``miniwob`` (pinned at 1.1.0 in setup.py): ``SeleniumInstance.create_driver`` and
``close`` (the driver comes from ``browser.Browser``), ``begin_task`` (the time limit), and
``MiniWoBEnvironment._hard_reset_instance`` (our instance class).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from miniwob.action import ActionSpaceConfig, ActionTypes
from miniwob.constants import ASCII_CHARSET
from miniwob.environment import MiniWoBEnvironment
from miniwob.selenium_instance import HTML_DIR, SeleniumInstance
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from verl_mm_tools.envs.base import Environment, Observation, Sample, register_environment
from verl_mm_tools.envs.gui.browser import Browser, BrowserSettings
from verl_mm_tools.envs.gui.screen import (
    ActionResult,
    Click,
    PressKey,
    ScreenAction,
    Scroll,
    TypeText,
    mark_screenshot,
)
from verl_mm_tools.envs.gui.tasks import OFFERED_TASKS, check_task
from verl_mm_tools.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ACTIVE_EPISODE", "OFFERED_TASKS", "POOL", "BrowserLost", "BrowserPool", "MiniWoBEnv", "TaskBrowser"]

T = TypeVar("T")

REWARDS = ("raw", "original", "binary", "success")
NAMED_KEYS = (
    "Enter",
    "Tab",
    "Backspace",
    "Delete",
    "Escape",
    "Space",
    "ArrowUp",
    "ArrowDown",
    "ArrowLeft",
    "ArrowRight",
    "Home",
    "End",
    "PageUp",
    "PageDown",
)
NOT_ACTING_REWARD = -1.0  # MiniWoB's reward at its time-out: the episode ended without being done
NO_TIME_LIMIT_MS = 7 * 24 * 3600 * 1000
# browsers launching at once in a process: a launch is ~1 s of CPU, and dozens at once on few cores time out
LAUNCH_SLOTS = threading.BoundedSemaphore(max(1, min(8, os.cpu_count() or 1)))
# idle browsers a process keeps for the next episodes (~160 MiB each: docs/benchmarks.md, figure 11); a worker running
# more trajectories at once than this relaunches the others each step
MAX_IDLE_ENV = "VERL_MM_TOOLS_MAX_IDLE_BROWSERS"
TYPING_LIMIT = 64  # MiniWoB's TYPING_MAX_LENGTH
# high_contrast's paint: colours only (no size, margin or border width), so every box stays where MiniWoB put it
HIGH_CONTRAST_CSS = (
    "#area button { background: #f00 !important; border-color: #f00 !important; color: #f00 !important; }"
)
PAGE_STYLE_ID = "verl-mm-tools-page-style"
# sets (or, given "", removes) the page's own style element; in <head>, which MiniWoB's re-render of #area keeps
_SET_PAGE_STYLE_JS = """
let style = document.getElementById(arguments[0]);
if (!arguments[1]) { if (style) { style.remove(); } return; }
if (!style) { style = document.createElement('style'); style.id = arguments[0]; document.head.appendChild(style); }
style.textContent = arguments[1];
"""
_ACTION_TYPES = (
    ActionTypes.CLICK_COORDS,
    ActionTypes.SCROLL_UP_COORDS,
    ActionTypes.SCROLL_DOWN_COORDS,
    ActionTypes.PRESS_KEY,
    ActionTypes.TYPE_TEXT,
)
_KEYS = tuple(f"<{name}>" for name in NAMED_KEYS) + tuple(ASCII_CHARSET)

# The episode of the trajectory running in this asyncio task, set by ``reset``: the oracle reads the page through it
# where a scripted model stands in for the policy (tests, demonstrations).
ACTIVE_EPISODE: contextvars.ContextVar[MiniWoBEnv | None] = contextvars.ContextVar("miniwob_episode", default=None)


class BrowserLost(RuntimeError):
    """A browser failed or did not answer in time; it was killed, and its trajectory cannot go on."""


class _IsolatedInstance(SeleniumInstance):
    """miniwob's Selenium instance on an isolated ``Browser``, with a settable episode time limit."""

    settings: BrowserSettings
    time_limit_ms: int
    page_style: str = ""  # CSS set on the page at each episode's start ("" none)
    browser: Browser

    def create_driver(self) -> None:
        self.browser = Browser(self.settings)
        self.driver = self.browser.driver
        self.driver.get(self.url)
        WebDriverWait(self.driver, 10).until(expected_conditions.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
        self.inner_width, self.inner_height = self.driver.execute_script(
            "return [window.innerWidth, window.innerHeight];"
        )

    def close(self) -> None:
        if hasattr(self, "browser"):
            self.browser.close()
        self.died = True

    def begin_task(self, seed: Any = None) -> None:
        # a reused page starts like a fresh one: the last episode's focus (a text field some tasks keep) is dropped
        self.driver.execute_script(
            f"core.EPISODE_MAX_TIME = {int(self.time_limit_ms)};"
            "if (document.activeElement) { document.activeElement.blur(); }"
        )
        super().begin_task(seed=seed)
        # after the task rendered (a page MiniWoB reloads loses it), before the reset's screenshot
        self.driver.execute_script(_SET_PAGE_STYLE_JS, PAGE_STYLE_ID, self.page_style)


class _TaskEnvironment(MiniWoBEnvironment):
    """miniwob's Gymnasium environment of one task, on an ``_IsolatedInstance``."""

    instance: _IsolatedInstance | None

    def __init__(self, task: str, settings: BrowserSettings) -> None:
        # the task's page is read from the package (a virtual environment under /tmp is hidden in the sandbox)
        self._settings = dataclasses.replace(settings, pages=(*settings.pages, str(HTML_DIR)))
        config = ActionSpaceConfig(action_types=_ACTION_TYPES, allowed_keys=_KEYS, text_max_len=TYPING_LIMIT)
        super().__init__(subdomain=task, action_space_config=config)

    def _hard_reset_instance(self) -> None:
        if getattr(self, "instance", None) is not None:
            self.gym_instance.close()
        instance = _IsolatedInstance(index=0, **self.instance_kwargs)
        instance.settings = self._settings
        instance.time_limit_ms = NO_TIME_LIMIT_MS
        self.instance = instance
        instance.start()  # miniwob's unthreaded instance: start() is create_driver()

    @property
    def gym_instance(self) -> _IsolatedInstance:
        assert self.instance is not None, "built in __init__"
        return self.instance

    @property
    def browser(self) -> Browser:
        return self.gym_instance.browser


class TaskBrowser:
    """One browser serving one MiniWoB task, episode after episode. Its blocking calls run on its own thread
    (``executor``), so a slow or hung browser holds up no other, and a call's timeout counts only its own work."""

    def __init__(self, task: str, settings: BrowserSettings, executor: ThreadPoolExecutor) -> None:
        self.task = task
        self.executor = executor
        self.gym = _TaskEnvironment(task, settings)
        self.episodes = 0

    @classmethod
    async def launched(cls, task: str, settings: BrowserSettings, timeout_s: float) -> TaskBrowser:
        """A new browser, launched on a thread of its own once a launch slot is free (``LAUNCH_SLOTS``)."""
        while not LAUNCH_SLOTS.acquire(blocking=False):  # polled: the pool serves any event loop
            await asyncio.sleep(0.05)
        executor = ThreadPoolExecutor(1, thread_name_prefix="miniwob-browser")
        try:
            launch = asyncio.get_running_loop().run_in_executor(executor, cls, task, settings, executor)
            return await asyncio.wait_for(launch, timeout_s)
        except BaseException:
            executor.shutdown(wait=False)  # a launch that timed out cleans up after itself when it ends
            raise
        finally:
            LAUNCH_SLOTS.release()

    @property
    def alive(self) -> bool:
        return self.gym.browser.alive and not self.gym.gym_instance.died

    def reset(self, seed: int, time_limit_ms: int, page_style: str = "") -> dict[str, Any]:
        """A new episode; ``page_style``: CSS the page shows in it (the last episode's is dropped)."""
        self.gym.gym_instance.time_limit_ms = time_limit_ms
        self.gym.gym_instance.page_style = page_style
        observation, _ = self.gym.reset(seed=seed)
        self.episodes += 1
        return observation

    def step(self, action: ScreenAction) -> tuple[dict[str, Any], bool, dict[str, Any]]:
        observation, _, done, _, info = self.gym.step(self._gym_action(action))
        return observation, bool(done), info

    def _gym_action(self, action: ScreenAction) -> dict[str, Any]:
        def typed(kind: ActionTypes, **fields: Any) -> dict[str, Any]:
            return {**self.gym.create_action(kind), **fields}

        if isinstance(action, Click):
            return typed(ActionTypes.CLICK_COORDS, coords=np.array([action.x, action.y], dtype=np.float32))
        if isinstance(action, Scroll):
            kind = ActionTypes.SCROLL_UP_COORDS if action.direction == "up" else ActionTypes.SCROLL_DOWN_COORDS
            return typed(kind, coords=np.array([action.x, action.y], dtype=np.float32))
        if isinstance(action, PressKey):
            key = f"<{action.key}>" if action.key in NAMED_KEYS else action.key
            return typed(ActionTypes.PRESS_KEY, key=_KEYS.index(key))
        assert isinstance(action, TypeText)
        return typed(ActionTypes.TYPE_TEXT, text=action.text)

    def close(self) -> None:
        """Quit the browser (blocking: on its thread or any other), then let its thread go."""
        self.gym.browser.close()
        self.executor.shutdown(wait=False)

    def kill(self) -> None:
        """Kill it at once, from any thread: a call hung in it fails, and its thread ends."""
        self.gym.browser.kill()
        self.executor.shutdown(wait=False)


class BrowserPool:
    """Idle browsers per task, shared by the environments of one process (thread-safe). At most ``max_idle`` wait;
    the oldest beyond that is closed."""

    def __init__(self, max_idle: int | None = None) -> None:
        self.max_idle = max_idle if max_idle is not None else _max_idle_from_environment()
        self._idle: list[TaskBrowser] = []
        self._lock = threading.Lock()
        self.launched = 0

    async def take(self, task: str, launch_timeout_s: float) -> TaskBrowser:
        """An idle browser of ``task``, or a newly launched one."""
        with self._lock:
            for index, browser in enumerate(self._idle):
                if browser.task == task:
                    return self._idle.pop(index)
            self.launched += 1
        return await TaskBrowser.launched(task, BrowserSettings.found(), launch_timeout_s)

    def give_back(self, browser: TaskBrowser) -> None:
        """Keep a live browser for the next episode (blocking: closes the ones beyond ``max_idle``)."""
        if not browser.alive:
            browser.kill()
            return
        with self._lock:
            self._idle.append(browser)
            surplus = self._idle[: max(0, len(self._idle) - self.max_idle)]
            del self._idle[: len(surplus)]
        for old in surplus:
            old.close()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def close_all(self) -> None:
        """Close every idle browser (the ones in use close with their environments)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for browser in idle:
            browser.close()


def _max_idle_from_environment() -> int:
    raw = os.environ.get(MAX_IDLE_ENV, "64")
    if not raw.isdigit():
        raise ConfigError(f"{MAX_IDLE_ENV} must be a whole number of browsers, got {raw!r}")
    return int(raw)


POOL = BrowserPool()


def _screenshot(observation: dict[str, Any], token: str) -> Image.Image:
    return mark_screenshot(Image.fromarray(np.asarray(observation["screenshot"], dtype=np.uint8)), token)


@register_environment
class MiniWoBEnv(Environment):
    """One MiniWoB++ episode per trajectory (see the module docstring).

    Args:
        task: A MiniWoB task name, e.g. ``click-button`` (``OFFERED_TASKS`` have an oracle).
        reward: ``raw``, ``original`` or ``binary``.
        time_limit_s: MiniWoB's episode time limit in seconds of wall time; None: none.
        browser_timeout_s: The longest a browser call (reset, an action) may take before the browser is killed and
            the trajectory fails.
        launch_timeout_s: The longest a browser's launch may take (once one of the ``LAUNCH_SLOTS`` is free).
        max_actions: Actions after which an episode that has not ended ends undone; None: no limit.
        high_contrast: Paint the task area's buttons solid red (``HIGH_CONTRAST_CSS``); boxes and rewards unchanged.
    """

    name = "miniwob"
    keys = NAMED_KEYS

    def __init__(
        self,
        task: str,
        reward: str = "raw",
        time_limit_s: float | None = None,
        browser_timeout_s: float = 30.0,
        launch_timeout_s: float = 120.0,
        max_actions: int | None = None,
        high_contrast: bool = False,
    ) -> None:
        self.task = check_task(task)
        if reward not in REWARDS:
            raise ConfigError(f"miniwob: reward must be one of {list(REWARDS)}, got {reward!r}")
        if time_limit_s is not None and not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
            raise ConfigError(
                f"miniwob: time_limit_s must be a positive number (seconds) or None, got {time_limit_s!r}"
            )
        for name, value in (("browser_timeout_s", browser_timeout_s), ("launch_timeout_s", launch_timeout_s)):
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"miniwob: {name} must be a positive number, got {value!r}")
        if max_actions is not None and (
            isinstance(max_actions, bool) or not isinstance(max_actions, int) or max_actions < 1
        ):
            raise ConfigError(f"miniwob: max_actions must be a whole number >= 1 or None, got {max_actions!r}")
        if not isinstance(high_contrast, bool):
            raise ConfigError(
                f"miniwob: high_contrast must be true or false (a YAML boolean), got {high_contrast!r}; write "
                "`high_contrast: true` to paint the task's buttons red"
            )
        self.page_style = HIGH_CONTRAST_CSS if high_contrast else ""
        self.reward = reward
        self.max_actions = max_actions
        self.actions = 0
        self.time_limit_ms = NO_TIME_LIMIT_MS if time_limit_s is None else int(time_limit_s * 1000)
        self.browser_timeout_s = float(browser_timeout_s)
        self.launch_timeout_s = float(launch_timeout_s)
        self.screen_token = uuid.uuid4().hex
        self.browser: TaskBrowser | None = None
        self.page_size = (0, 0)
        self.observation: dict[str, Any] = {}  # miniwob's latest: utterance, fields, dom_elements, screenshot
        self.done = False

    async def reset(self, sample: Sample) -> Observation:  # type: ignore[override]  # async: the loop awaits it
        seed = episode_seed(sample)
        try:
            self.browser = await POOL.take(self.task, self.launch_timeout_s)
        except ConfigError:
            raise
        except (Exception, asyncio.TimeoutError) as error:
            what = f"no answer within {self.launch_timeout_s:g} s" if isinstance(error, TimeoutError) else error
            raise BrowserLost(f"miniwob {self.task}: launching a browser failed ({what})") from error
        self.observation = await self._blocking(self.browser.reset, seed, self.time_limit_ms, self.page_style)
        self.actions = 0
        ACTIVE_EPISODE.set(self)
        screenshot = _screenshot(self.observation, self.screen_token)
        self.page_size = screenshot.size
        text = (
            f"Task: {self.observation['utterance']}\n"
            "Act on the page with the tools; points are pixels of the latest screenshot."
        )
        return Observation(text=text, images=(screenshot,))

    def step(self, assistant_text: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        """An answer without a tool call ends the episode undone, as MiniWoB's time-out does."""
        self.done = True
        return Observation(), self._undone_reward(), True, {"task": self.task, "reason": "answered without acting"}

    async def act(self, action: ScreenAction) -> ActionResult:
        if self.browser is None or self.done:
            when = "before reset" if self.browser is None else "after the episode ended"
            raise RuntimeError(f"miniwob: act() {when}")
        observation, done, info = await self._blocking(self.browser.step, action)
        self.actions += 1
        reward = self._reward(info) if done else 0.0
        report = {"task": self.task, "done": done, "raw_reward": info.get("raw_reward"), "reason": info.get("reason")}
        if not done and self.max_actions is not None and self.actions >= self.max_actions:
            done, reward = True, self._undone_reward()
            report["reason"] = f"{self.actions} actions, the episode's max_actions, without ending it"
        self.done = done
        if done:
            return ActionResult(None, reward, True, report)
        self.observation = observation
        return ActionResult(_screenshot(observation, self.screen_token), reward, False, report)

    def _reward(self, info: dict[str, Any]) -> float:
        raw = float(info["raw_reward"])
        if self.reward == "original":
            return float(info["env_reward"])
        if self.reward in ("binary", "success"):
            return 1.0 if raw == 1.0 else self._undone_reward()
        return raw

    def _undone_reward(self) -> float:
        """The reward of an episode that ends undone (as MiniWoB's time-out scores it)."""
        return 0.0 if self.reward == "success" else NOT_ACTING_REWARD

    async def close(self) -> None:  # type: ignore[override]  # async: the loop awaits it
        browser, self.browser = self.browser, None
        if browser is None:
            return
        if not browser.alive:  # killed, or died: nothing to give back
            browser.kill()
            return
        await asyncio.get_running_loop().run_in_executor(browser.executor, POOL.give_back, browser)

    async def _blocking(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` off the event loop, within ``browser_timeout_s``; the browser is killed when the call
        fails or hangs (a hung call then fails too, and its thread ends)."""
        assert self.browser is not None, "a browser call outside an episode"
        try:  # a killed browser's thread is gone: run_in_executor raises at once
            call = asyncio.get_running_loop().run_in_executor(self.browser.executor, function, *args)
            return await asyncio.wait_for(call, self.browser_timeout_s)
        except (Exception, asyncio.TimeoutError) as error:
            browser, self.browser = self.browser, None
            if browser is not None:
                browser.kill()
            what = f"no answer within {self.browser_timeout_s:g} s" if isinstance(error, TimeoutError) else error
            raise BrowserLost(f"miniwob {self.task}: the browser failed ({what}); it was killed") from error


def episode_seed(sample: Sample) -> int:
    """The row's ``extra_info.seed``, else its ``index``: a ConfigError for a row with neither."""
    for key in ("seed", "index"):
        value = sample.extra_info.get(key)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
    raise ConfigError(
        "miniwob: a row needs an integer extra_info.seed (or index) to seed its episode; `verl-mm-tools make-data "
        f"miniwob` writes one. Got extra_info keys {sorted(sample.extra_info)}"
    )
