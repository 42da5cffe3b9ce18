"""Figure 11: the GUI environment (MiniWoB++ in isolated headless Chromium, ``envs.gui``): what a browser costs and
how many trajectories a machine serves.

One at a time: a browser's launch as the pool launches one (chromedriver, Chromium in bubblewrap, the task's page
loaded), in wall seconds and in the CPU seconds of its processes; then reset and step (one oracle action) latency, p50
with the spread and p95, over ``click-button`` episodes one after another on one reused browser. Memory per browser,
after an episode and mid-episode (waiting for an action, as while the model generates), summed over chromedriver and
every process of the browser, in MiB, alone, with ``shared`` browsers at once and with ``at_once``: RSS counts the
pages its processes share (Chromium's code and libraries) in each; PSS splits each page among every process mapping
it, other Chromium processes on the host included, so it falls as browsers are added; ``own`` is the PSS of its
anonymous and shared-memory pages (no file pages), which only its own processes share: N browsers take about N x own
plus their files' pages once. And the share of a core each warm browser uses while it waits (the page redraws
MiniWoB's countdown every second). Throughput: ``at_once`` oracle-solved episodes of the six offered tasks gathered
on one event loop (reset, oracle actions until done, close), first on cold browsers (the pool emptied: launches
included), then again on the warm pooled ones.

Wall time: the work happens in Chromium's processes, not this one. Informational figures, no targets; the share
of episodes the oracle solved is a check (target 1). Without miniwob, Chromium, chromedriver or bubblewrap the
figure is skipped with a line saying why.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.errors import ConfigError

if TYPE_CHECKING:  # loaded when the figure runs: envs.base registers into verl's registries (seconds)
    from verl_mm_tools.envs.base import Sample
    from verl_mm_tools.envs.gui.browser import Browser
    from verl_mm_tools.envs.gui.miniwob_env import MiniWoBEnv

logger = logging.getLogger(__name__)

TASK = "click-button"  # one click solves it: a step is one action
MAX_ACTIONS = 6  # the oracle solves an offered task in at most 3; more means it went wrong
KIB_PER_MIB = 1024
LAUNCH_TIMEOUT_S = 120.0  # the environment's default
IDLE_WINDOW_S = 3.0  # how long a reading watches browsers wait for an action (the countdown ticks every second)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class GuiSizes:
    """``launches`` browsers launched one at a time, ``episodes`` timed episodes on a reused browser, ``shared``
    browsers up at once for memory, ``at_once`` episodes gathered at once, ``rounds`` cold-then-warm rounds of them."""

    launches: int
    episodes: int
    shared: int
    at_once: int
    rounds: int

    @classmethod
    def of(cls, quick: bool, repeats: int | None) -> GuiSizes:
        """The full sizes, fewer samples with ``quick``; with ``repeats`` (a check of the output's shape) that many
        launches and episodes, and fewer browsers at once (12 cold launches take ~25 s on 2 cores, 32 take ~65)."""
        if repeats is not None:
            return cls(launches=repeats, episodes=repeats, shared=4, at_once=12, rounds=1)
        return cls(launches=3, episodes=12, shared=8, at_once=32, rounds=1) if quick else cls(5, 30, 8, 32, 3)


class ProcessMemory(NamedTuple):
    """A process's resident KiB: all of them (RSS), its proportional share of each (PSS), and that share of its
    anonymous and shared-memory pages alone (``own``: no file pages); PSS and own None where ``smaps_rollup`` cannot
    be read."""

    rss: int
    pss: int | None
    own: int | None


@dataclass(frozen=True)
class BrowserReading:
    """One warm browser mid-episode, waiting for an action as while the model generates: its processes (chromedriver
    included), their summed memory in MiB (None: unreadable), and the share of a core they used meanwhile (MiniWoB's
    page redraws its countdown every second)."""

    processes: int
    rss: float
    pss: float | None
    own: float | None
    idle_cpu_percent: float


def gui_figures(sizes: GuiSizes, say: Callable[[str], object] = lambda line: None) -> list[Figure]:
    """Figure 11's figures (``gui/...``); none, with a line saying why, where the GUI environment cannot run."""
    try:
        from verl_mm_tools.envs.gui.browser import BrowserSettings
        from verl_mm_tools.envs.gui.miniwob_env import POOL

        BrowserSettings.found()
    except ImportError as error:
        say(f"bench: the GUI figures are skipped: the gui extra is not installed (pip install '.[gui]'): {error}")
        return []
    except ConfigError as error:
        say(f"bench: the GUI figures are skipped: {error}")
        return []
    POOL.close_all()  # browsers another user of this process left idle would share memory with the ones measured
    try:
        return asyncio.run(_measure(sizes))
    finally:
        POOL.close_all()


async def _measure(sizes: GuiSizes) -> list[Figure]:
    from verl_mm_tools.envs.gui.miniwob_env import OFFERED_TASKS, POOL

    launch_s, launch_cpu_s, alone = await _launched_one_at_a_time(sizes.launches)
    resets, steps = await _latency_on_a_reused_browser(sizes.episodes)
    shared = await _warm_readings([TASK] * sizes.shared)
    POOL.close_all()
    tasks = [OFFERED_TASKS[i % len(OFFERED_TASKS)] for i in range(sizes.at_once)]
    cold, warm, solved = await _throughput(tasks, sizes.rounds)
    everyone = await _held_at_once(tasks)  # the warm pool's browsers
    at_once = f"gui/{sizes.at_once}_at_once"
    return [
        figure("gui/launch_s", launch_s),
        figure("gui/launch_cpu_s", launch_cpu_s),
        figure("gui/processes_per_browser", [each.processes for each in alone + shared + everyone]),
        figure(f"gui/{TASK}/reset_p50_ms", [s * 1e3 for s in resets]),
        figure(f"gui/{TASK}/reset_p95_ms", [_percentile(resets, 95) * 1e3]),
        figure(f"gui/{TASK}/step_p50_ms", [s * 1e3 for s in steps]),
        figure(f"gui/{TASK}/step_p95_ms", [_percentile(steps, 95) * 1e3]),
        *_memory_figures("gui/1_browser", alone),
        *_memory_figures(f"gui/{sizes.shared}_browsers", shared),
        *_memory_figures(at_once, everyone),
        # on browsers warm for minutes: one fresh from its launch still runs start-up work for several seconds
        figure(f"{at_once}/idle_cpu_percent", [each.idle_cpu_percent for each in everyone]),
        figure(f"{at_once}/cold_trajectories_per_s", [len(tasks) / s for s in cold]),
        figure(f"{at_once}/warm_trajectories_per_s", [len(tasks) / s for s in warm]),
        figure(f"{at_once}/warm_over_cold", [c / w for c, w in zip(cold, warm)]),
        figure(f"{at_once}/solved_share", [solved], ">= 1"),
    ]


def _memory_figures(prefix: str, readings: Sequence[BrowserReading]) -> list[Figure]:
    """Each browser's RSS, PSS and own memory (where readable), one figure each over ``readings``."""
    figures = []
    for kind in ("rss", "pss", "own"):
        values = [getattr(each, kind) for each in readings]
        if None not in values:
            figures.append(figure(f"{prefix}/{kind}_MiB", values))
    return figures


async def _launched_one_at_a_time(count: int) -> tuple[list[float], list[float], list[BrowserReading]]:
    """``count`` browsers launched each alone: the launch's wall and CPU seconds (its live processes'), and a reading
    of it mid-episode."""
    from verl_mm_tools.envs.gui.browser import BrowserSettings
    from verl_mm_tools.envs.gui.miniwob_env import POOL, TaskBrowser

    seconds: list[float] = []
    cpu_seconds: list[float] = []
    readings: list[BrowserReading] = []
    for _ in range(count):
        began = time.perf_counter()
        browser = await TaskBrowser.launched(TASK, BrowserSettings.found(), timeout_s=LAUNCH_TIMEOUT_S)
        seconds.append(time.perf_counter() - began)
        cpu_seconds.append(cpu_seconds_of(browser_pids(browser.gym.browser)))
        POOL.give_back(browser)  # the episodes below take it from the pool, as an environment would
        readings += await _warm_readings([TASK])
        POOL.close_all()
    logger.info("gui: %d launches, median %.2f s", count, statistics.median(seconds))
    return seconds, cpu_seconds, readings


async def _latency_on_a_reused_browser(episodes: int) -> tuple[list[float], list[float]]:
    """Seconds of each reset and each action over ``episodes`` episodes one after another on one browser."""
    from verl_mm_tools.envs.gui.miniwob_env import MiniWoBEnv

    resets: list[float] = []
    steps: list[float] = []
    for seed in range(episodes + 1):  # the first launches the browser: not timed
        env = MiniWoBEnv(TASK)
        try:
            began = time.perf_counter()
            await env.reset(_sample(seed))
            reset_s = time.perf_counter() - began
            solved, step_s = await _solve(env)
        finally:
            await env.close()
        if not solved:
            raise RuntimeError(f"the oracle did not solve {TASK} (seed {seed}): the GUI figures would be wrong")
        if seed > 0:
            resets.append(reset_s)
            steps += step_s
    return resets, steps


async def _warm_readings(tasks: Sequence[str]) -> list[BrowserReading]:
    """``_held_at_once`` after an episode on each browser (launched where the pool has none), as the pool serves."""
    await asyncio.gather(*(_episode(task, seed) for seed, task in enumerate(tasks)))
    return await _held_at_once(tasks)


async def _held_at_once(tasks: Sequence[str]) -> list[BrowserReading]:
    """A reading of each browser with one episode of each of ``tasks`` reset at once and waiting for an action (as
    while the model generates), over ``IDLE_WINDOW_S``; then the oracle solves them."""
    from verl_mm_tools.envs.gui.miniwob_env import MiniWoBEnv

    envs = [MiniWoBEnv(task) for task in tasks]
    try:
        await asyncio.gather(*(env.reset(_sample(seed)) for seed, env in enumerate(envs)))
        pids = [browser_pids(_browser_of(env)) for env in envs]
        before = [cpu_seconds_of(each) for each in pids]
        began = time.perf_counter()
        await asyncio.sleep(IDLE_WINDOW_S)
        elapsed = time.perf_counter() - began
        readings = [_reading(each, (cpu_seconds_of(each) - cpu) / elapsed * 100) for each, cpu in zip(pids, before)]
        await asyncio.gather(*(_solve(env) for env in envs))
        return readings
    finally:
        await asyncio.gather(*(env.close() for env in envs))


async def _throughput(tasks: Sequence[str], rounds: int) -> tuple[list[float], list[float], float]:
    """Seconds of each round's gathered episodes of ``tasks`` on cold browsers then on warm ones, and the share of
    all these episodes the oracle solved."""
    from verl_mm_tools.envs.gui.miniwob_env import POOL

    cold: list[float] = []
    warm: list[float] = []
    solved: list[bool] = []
    for number in range(rounds):
        for times, label in ((cold, "cold"), (warm, "warm")):
            if label == "cold":
                POOL.close_all()
            seeds = range(len(solved), len(solved) + len(tasks))
            began = time.perf_counter()
            outcomes = await asyncio.gather(*(_episode(task, seed) for task, seed in zip(tasks, seeds)))
            times.append(time.perf_counter() - began)
            solved += outcomes
            logger.info("gui: round %d, %d episodes at once, %s: %.1f s", number, len(tasks), label, times[-1])
    return cold, warm, sum(solved) / len(solved)


async def _episode(task: str, seed: int) -> bool:
    """One episode solved by the oracle, its browser given back: whether it was solved (a lost browser: not)."""
    from verl_mm_tools.envs.gui.miniwob_env import BrowserLost, MiniWoBEnv

    env = MiniWoBEnv(task)
    try:
        await env.reset(_sample(seed))
        solved, _ = await _solve(env)
        return solved
    except BrowserLost as error:  # under load a browser may miss its timeout: a failed trajectory, counted
        logger.warning("gui: an episode of %s (seed %d) lost its browser: %s", task, seed, error)
        return False
    finally:
        await env.close()


async def _solve(env: MiniWoBEnv) -> tuple[bool, list[float]]:
    """The oracle's actions until the episode ends: whether it was solved, and each action's seconds."""
    from verl_mm_tools.envs.gui.screen import Click, TypeText
    from verl_mm_tools.runtime.miniwob_oracle import oracle_action

    seconds: list[float] = []
    for _ in range(MAX_ACTIONS):
        name, arguments = oracle_action(env.task, env.observation)
        action = Click(arguments["x"], arguments["y"]) if name == "click" else TypeText(arguments["text"])
        began = time.perf_counter()
        result = await env.act(action)
        seconds.append(time.perf_counter() - began)
        if result.done:
            return result.reward == 1.0, seconds
    return False, seconds


def browser_pids(browser: Browser) -> list[int]:
    """chromedriver's pid and those of every live process of ``browser`` (bwrap, Chromium's)."""
    from verl_mm_tools.envs.gui.browser import live_processes

    return sorted({browser.process.pid, *live_processes(str(browser.workdir))})


def _reading(pids: Sequence[int], idle_cpu_percent: float) -> BrowserReading:
    memory = [reading for reading in map(process_memory_kib, pids) if reading is not None]

    def total_mib(kind: str) -> float | None:
        values = [getattr(each, kind) for each in memory]
        return None if None in values else sum(values) / KIB_PER_MIB

    return BrowserReading(
        processes=len(memory),
        rss=sum(each.rss for each in memory) / KIB_PER_MIB,
        pss=total_mib("pss"),
        own=total_mib("own"),
        idle_cpu_percent=idle_cpu_percent,
    )


def cpu_seconds_of(pids: Sequence[int]) -> float:
    """The CPU seconds (user and system) the live processes ``pids`` have used so far."""
    ticks = 0
    for pid in pids:
        try:
            fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    return ticks / CLOCK_TICKS


def process_memory_kib(pid: int) -> ProcessMemory | None:
    """The memory of process ``pid`` (``ProcessMemory``), RSS alone where ``smaps_rollup`` cannot be read; None once
    it ended."""
    proc = Path("/proc") / str(pid)
    try:
        fields = _kib_fields((proc / "smaps_rollup").read_text())
        return ProcessMemory(fields["Rss"], fields["Pss"], fields["Pss_Anon"] + fields["Pss_Shmem"])
    except (PermissionError, KeyError):  # another user's process, or a kernel without these fields
        pass
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return ProcessMemory(_kib_fields((proc / "status").read_text())["VmRSS"], None, None)
    except (OSError, KeyError):  # it ended while we looked (a zombie has no VmRSS)
        return None


def _kib_fields(text: str) -> dict[str, int]:
    """``Name:  123 kB`` lines of a /proc file as {name: KiB}."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[name.strip()] = int(parts[0])
    return fields


def _browser_of(env: MiniWoBEnv) -> Browser:
    assert env.browser is not None, "read during an episode"
    return env.browser.gym.browser


def _sample(seed: int) -> Sample:
    from verl_mm_tools.envs.base import Sample

    return Sample(data_source="miniwob/bench", ground_truth=None, extra_info={"seed": seed})


def _percentile(samples: Sequence[float], percent: float) -> float:
    """The ``percent``-th percentile, linear between the closest ranks (numpy's default)."""
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * percent / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
