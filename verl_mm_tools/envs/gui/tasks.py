"""The MiniWoB++ tasks: those bundled with Farama's ``miniwob`` package (found without importing it), and those the
oracle solves. Light: the data writer checks task names through it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from verl_mm_tools.errors import ConfigError, did_you_mean

# the tasks the oracle solves (``runtime.miniwob_oracle``); any other MiniWoB task runs too, without an oracle
OFFERED_TASKS = ("click-test", "click-button", "click-link", "click-dialog", "enter-text", "focus-text")
INSTALL_HINT = "install the GUI extra: pip install 'verl-mm-tools[gui]'"


def known_tasks() -> list[str]:
    """Every MiniWoB task bundled with the package (its ``html/miniwob/*.html``)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the miniwob package is not installed; {INSTALL_HINT}")
    html = Path(next(iter(spec.submodule_search_locations))) / "html" / "miniwob"
    return sorted(path.stem for path in html.glob("*.html"))


def check_task(task: object) -> str:
    """``task`` when it is a bundled MiniWoB task; a ConfigError naming the close ones otherwise."""
    tasks = known_tasks()
    if not isinstance(task, str) or task not in tasks:
        hint = did_you_mean(task, tasks) if isinstance(task, str) else ""
        raise ConfigError(
            f"miniwob: unknown task {task!r}; tasks with an oracle: {list(OFFERED_TASKS)} ({len(tasks)} in all, "
            f"miniwob's html/miniwob/*.html).{hint}"
        )
    return task
