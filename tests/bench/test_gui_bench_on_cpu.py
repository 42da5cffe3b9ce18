"""Figure 11, the GUI environment's costs, at tiny sizes on real Chromium: every figure, the counted facts (processes
per browser, episodes solved, samples per figure), no browser left after; and the figure skipped with a line where
it cannot run. Timed values are not asserted (they depend on the machine)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from verl_mm_tools.bench.gui import GuiSizes, gui_figures, process_memory_kib

pytestmark = pytest.mark.integration  # starts Chromium

TINY = GuiSizes(launches=1, episodes=2, shared=2, at_once=6, rounds=1)  # six at once: each offered task once


def chromedrivers_of_this_process() -> list[int]:
    """Live chromedriver children of this process: a browser's chromedriver, and with it everything it started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):  # not a process, or it ended while we looked
            continue
        if int(parent) == os.getpid() and b"chromedriver" in command and state != "Z":
            found.append(int(entry.name))
    return found


def test_the_gui_figures_at_tiny_sizes():
    from verl_mm_tools.envs.gui.miniwob_env import POOL

    figures = {each.name: each for each in gui_figures(TINY)}
    groups = ("gui/1_browser", "gui/2_browsers", "gui/6_at_once")
    memory = [f"{group}/{kind}_MiB" for group in groups for kind in ("rss", "pss", "own")]
    assert sorted(figures) == sorted(
        [
            "gui/launch_s",
            "gui/launch_cpu_s",
            "gui/processes_per_browser",
            "gui/click-button/reset_p50_ms",
            "gui/click-button/reset_p95_ms",
            "gui/click-button/step_p50_ms",
            "gui/click-button/step_p95_ms",
            *memory,
            "gui/6_at_once/idle_cpu_percent",
            "gui/6_at_once/cold_trajectories_per_s",
            "gui/6_at_once/warm_trajectories_per_s",
            "gui/6_at_once/warm_over_cold",
            "gui/6_at_once/solved_share",
        ]
    )
    counts = {name: len(each.samples) for name, each in figures.items()}
    assert counts["gui/launch_s"] == counts["gui/launch_cpu_s"] == counts["gui/1_browser/rss_MiB"] == 1
    assert counts["gui/click-button/reset_p50_ms"] == counts["gui/click-button/step_p50_ms"] == 2  # one click each
    assert counts["gui/2_browsers/pss_MiB"] == 2 and counts["gui/6_at_once/pss_MiB"] == 6
    assert counts["gui/processes_per_browser"] == 1 + 2 + 6  # every browser read
    # chromedriver, bwrap, Chromium's browser process, its zygotes, GPU, network and renderer processes
    assert min(figures["gui/processes_per_browser"].samples) >= 3
    for group in groups:  # a browser's own pages are part of its proportional share, which is part of its resident
        own, pss, rss = (figures[f"{group}/{kind}_MiB"].samples for kind in ("own", "pss", "rss"))
        assert all(0 < mine <= share <= resident for mine, share, resident in zip(own, pss, rss)), group
    for name in ("reset", "step"):
        assert figures[f"gui/click-button/{name}_p95_ms"].value >= figures[f"gui/click-button/{name}_p50_ms"].value
    solved = figures["gui/6_at_once/solved_share"]
    assert (solved.samples, solved.target, solved.missed) == ((1.0,), ">= 1", False)  # the oracle solved them all
    assert all(value > 0 for each in figures.values() for value in each.samples if "idle_cpu" not in each.name)
    assert POOL.idle == 0 and chromedrivers_of_this_process() == []  # every browser closed


def test_the_figure_is_skipped_with_a_line_where_chromium_is_missing(monkeypatch):
    monkeypatch.delenv("VERL_MM_TOOLS_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    said: list[str] = []
    assert gui_figures(TINY, said.append) == []
    assert said == [
        "bench: the GUI figures are skipped: the GUI environment needs chromium, which is not on PATH: run "
        "scripts/install_chromium.sh (Debian/Ubuntu packages chromium and chromium-driver)"
    ]


def test_the_figure_is_skipped_with_a_line_without_the_gui_extra(monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "miniwob"] + ["miniwob"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails, as where it is not installed
    monkeypatch.delitem(sys.modules, "verl_mm_tools.envs.gui.miniwob_env", raising=False)
    said: list[str] = []
    assert gui_figures(TINY, said.append) == []
    assert len(said) == 1 and said[0].startswith(
        "bench: the GUI figures are skipped: the gui extra is not installed (pip install '.[gui]'): "
    )


def test_process_memory_reads_rss_pss_and_own_pages_and_none_for_a_process_that_ended():
    memory = process_memory_kib(os.getpid())
    assert memory is not None and memory.own is not None and memory.pss is not None
    assert 0 < memory.own <= memory.pss <= memory.rss
    assert process_memory_kib(2**22 + 1) is None  # above the kernel's largest pid: never a process
