"""MiniWoB++ tasks (Farama's ``miniwob`` 1.1.0, its Gymnasium environments) in isolated headless Chromium, as the
mm_tool environment ``miniwob``: ``env: {name: miniwob, task: click-button}`` in a row's ``extra_info`` or the loop's
``env`` option.

An episode: ``reset`` shows the task's instruction and a screenshot of the page; the model acts with the GUI tools
(click, type, press, scroll: ``verl_mm_tools.tools.gui_tools``), each answered with the new screenshot; MiniWoB ends
the episode and gives its reward. An answer without a tool call ends the episode as MiniWoB's time-out does (reward
-1). The episode's seed is the row's ``extra_info.seed`` (``make-data miniwob`` writes it), else its ``index``.

Rewards (``reward``): ``raw`` (default), MiniWoB's reward without its time penalty; ``original``, MiniWoB's own, scaled
by the time left; ``binary``, 1 for a full success and -1 otherwise. MiniWoB ends an episode after 10 s of wall time,
which counts the model's generation and its wait for the GPU; so by default the limit is lifted and the turn limit
bounds an episode (``time_limit_s`` sets one).

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
import logging
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
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
from verl_mm_tools.errors import ConfigError, did_you_mean

logger = logging.getLogger(__name__)

T = TypeVar("T")

# the tasks the oracle solves (``oracle.py``); any other MiniWoB task runs too, without an oracle
OFFERED_TASKS = ("click-test", "click-button", "click-link", "click-dialog", "enter-text", "focus-text")
REWARDS = ("raw", "original", "binary")
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
TYPING_LIMIT = 64  # MiniWoB's TYPING_MAX_LENGTH
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


def known_tasks() -> list[str]:
    """Every MiniWoB task bundled with the package (its HTML files)."""
    return sorted(path.stem for path in (Path(HTML_DIR) / "miniwob").glob("*.html"))


def check_task(task: object) -> str:
    tasks = known_tasks()
    if not isinstance(task, str) or task not in tasks:
        hint = did_you_mean(task, tasks) if isinstance(task, str) else ""
        raise ConfigError(
            f"miniwob: unknown task {task!r}; tasks with an oracle: {list(OFFERED_TASKS)} ({len(tasks)} in all, "
            f"miniwob's html/miniwob/*.html).{hint}"
        )
    return task


class _IsolatedInstance(SeleniumInstance):
    """miniwob's Selenium instance on an isolated ``Browser``, with a settable episode time limit."""

    settings: BrowserSettings
    time_limit_ms: int
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
        self.driver.execute_script(f"core.EPISODE_MAX_TIME = {int(self.time_limit_ms)};")
        super().begin_task(seed=seed)


class _TaskEnvironment(MiniWoBEnvironment):
    """miniwob's Gymnasium environment of one task, on an ``_IsolatedInstance``."""

    instance: _IsolatedInstance | None

    def __init__(self, task: str, settings: BrowserSettings) -> None:
        self._settings = settings
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
    """One browser serving one MiniWoB task, episode after episode (blocking calls: run them off the event loop)."""

    def __init__(self, task: str, settings: BrowserSettings) -> None:
        self.task = task
        self.gym = _TaskEnvironment(task, settings)
        self.episodes = 0

    @property
    def alive(self) -> bool:
        return self.gym.browser.alive and not self.gym.gym_instance.died

    def reset(self, seed: int, time_limit_ms: int) -> dict[str, Any]:
        self.gym.gym_instance.time_limit_ms = time_limit_ms
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
        self.gym.browser.close()

    def kill(self) -> None:
        self.gym.browser.kill()


class BrowserPool:
    """Idle browsers per task, shared by the environments of one process (thread-safe). At most ``max_idle`` wait;
    the oldest beyond that is closed."""

    def __init__(self, max_idle: int = 64) -> None:
        self.max_idle = max_idle
        self._idle: list[TaskBrowser] = []
        self._lock = threading.Lock()
        self.launched = 0

    def take(self, task: str, settings: Callable[[], BrowserSettings]) -> TaskBrowser:
        """An idle browser of ``task``, or a new one (blocking: launching takes about a second)."""
        with self._lock:
            for index, browser in enumerate(self._idle):
                if browser.task == task:
                    return self._idle.pop(index)
            self.launched += 1
        return TaskBrowser(task, settings())

    def give_back(self, browser: TaskBrowser) -> None:
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
        browser_timeout_s: The longest a browser call (launch, reset, an action) may take before the browser is
            killed and the trajectory fails.
    """

    name = "miniwob"
    keys = NAMED_KEYS

    def __init__(
        self,
        task: str,
        reward: str = "raw",
        time_limit_s: float | None = None,
        browser_timeout_s: float = 30.0,
    ) -> None:
        self.task = check_task(task)
        if reward not in REWARDS:
            raise ConfigError(f"miniwob: reward must be one of {list(REWARDS)}, got {reward!r}")
        if time_limit_s is not None and not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
            raise ConfigError(
                f"miniwob: time_limit_s must be a positive number (seconds) or None, got {time_limit_s!r}"
            )
        if not (isinstance(browser_timeout_s, (int, float)) and browser_timeout_s > 0):
            raise ConfigError(f"miniwob: browser_timeout_s must be a positive number, got {browser_timeout_s!r}")
        self.reward = reward
        self.time_limit_ms = NO_TIME_LIMIT_MS if time_limit_s is None else int(time_limit_s * 1000)
        self.browser_timeout_s = float(browser_timeout_s)
        self.screen_token = uuid.uuid4().hex
        self.browser: TaskBrowser | None = None
        self.page_size = (0, 0)
        self.observation: dict[str, Any] = {}  # miniwob's latest: utterance, fields, dom_elements, screenshot
        self.done = False
        self.rewards: list[float] = []

    async def reset(self, sample: Sample) -> Observation:  # type: ignore[override]  # async: the loop awaits it
        seed = episode_seed(sample)
        self.browser = await self._blocking(POOL.take, self.task, BrowserSettings.found)
        self.observation = await self._blocking(self.browser.reset, seed, self.time_limit_ms)
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
        self.rewards.append(NOT_ACTING_REWARD)
        return Observation(), NOT_ACTING_REWARD, True, {"task": self.task, "reason": "answered without acting"}

    async def act(self, action: ScreenAction) -> ActionResult:
        if self.browser is None or self.done:
            when = "before reset" if self.browser is None else "after the episode ended"
            raise RuntimeError(f"miniwob: act() {when}")
        observation, done, info = await self._blocking(self.browser.step, action)
        reward = self._reward(info) if done else 0.0
        self.done = done
        self.rewards.append(reward)
        report = {"task": self.task, "done": done, "raw_reward": info.get("raw_reward"), "reason": info.get("reason")}
        if done:
            return ActionResult(None, reward, True, report)
        self.observation = observation
        return ActionResult(_screenshot(observation, self.screen_token), reward, False, report)

    def _reward(self, info: dict[str, Any]) -> float:
        raw = float(info["raw_reward"])
        if self.reward == "original":
            return float(info["env_reward"])
        if self.reward == "binary":
            return 1.0 if raw == 1.0 else -1.0
        return raw

    async def close(self) -> None:  # type: ignore[override]  # async: the loop awaits it
        browser, self.browser = self.browser, None
        if browser is not None:
            await asyncio.to_thread(POOL.give_back, browser)

    async def _blocking(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` off the event loop, within ``browser_timeout_s``; the browser is killed when the call
        fails or hangs (a hung call then fails too, and its thread ends)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(function, *args), self.browser_timeout_s)
        except ConfigError:
            raise
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
