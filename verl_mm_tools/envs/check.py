"""``check_environment``: does an environment keep the mm_tool environment contract?

It runs the environment the way the loop does, on a probe sample (one 64x48 image; ground truth, extra info and the
first answer yours to choose), and raises ``EnvironmentCheckError`` listing every problem, or returns the list of
what it checked (``CheckReport``; print it):

* it is an ``Environment`` subclass with a ``step``, and a name or class path ``make_environment`` accepts;
* ``reset`` returns None or an ``Observation`` (text, PIL images);
* ``step`` answers each probe answer (yours, an empty one, a 10,000-character one) with ``(Observation or None,
  finite float reward, bool done, dict info)`` without raising;
* ``close`` runs without raising. ``reset``/``step``/``close`` may be plain or async.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from PIL import Image

from verl_mm_tools.check_report import CheckReport
from verl_mm_tools.envs.base import Environment, Observation, Sample, call, make_environment
from verl_mm_tools.errors import VerlMMToolsError

PROBE_ANSWERS = ("", "x" * 10_000)


class EnvironmentCheckError(VerlMMToolsError, AssertionError):
    """An environment does not keep the contract; the message lists every problem."""


def check_environment(
    spec: str | dict | type[Environment],
    *,
    ground_truth: object = "1",
    answer: str = "<answer>1</answer>",
    extra_info: dict | None = None,
) -> CheckReport:
    """Check an environment (a registered name, a class path, ``{"name": ..., **kwargs}``, or the class itself);
    raise EnvironmentCheckError unless it keeps the contract (see the module docstring). Synchronous: inside a running
    event loop use ``await acheck_environment(...)``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(acheck_environment(spec, ground_truth=ground_truth, answer=answer, extra_info=extra_info))
    raise RuntimeError(
        "check_environment() runs its own event loop; inside async code use 'await acheck_environment(...)'"
    )


async def acheck_environment(
    spec: str | dict | type[Environment],
    *,
    ground_truth: object = "1",
    answer: str = "<answer>1</answer>",
    extra_info: dict | None = None,
) -> CheckReport:
    environment = spec() if isinstance(spec, type) else make_environment(spec)
    name = type(environment).__qualname__
    report, problems = CheckReport(f"environment {name}"), []
    report.passed(f"{name} is an Environment with a step method")
    sample = Sample(
        data_source="check_environment",
        ground_truth=ground_truth,
        extra_info=dict(extra_info or {}),
        images=[Image.new("RGB", (64, 48), (90, 140, 200))],
    )
    problems += _checked(report, "reset(sample)", await _outcome(environment.reset, sample), _reset_problem)
    for probe in (answer, *PROBE_ANSWERS):
        label = f"step({probe[:30]!r}{'...' if len(probe) > 30 else ''})"
        problems += _checked(report, label, await _outcome(environment.step, probe), _step_problem)
    problems += _checked(report, "close()", await _outcome(environment.close), lambda _: None)
    if problems:
        raise EnvironmentCheckError(f"environment {name} fails check_environment:\n- " + "\n- ".join(problems))
    return report


async def _outcome(method: Callable[..., object], *args: object) -> tuple[bool, object]:
    try:
        return True, await call(method, *args)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return False, f"raised {type(error).__name__}: {error}"


def _checked(
    report: CheckReport, label: str, outcome: tuple[bool, object], problem_of: Callable[[object], str | None]
) -> list[str]:
    returned, value = outcome
    problem = problem_of(value) if returned else value
    if problem:
        return [f"{label} {problem}"]
    report.passed(label)
    return []


def _reset_problem(value: object) -> str | None:
    if value is None:
        return None
    return _observation_problem(value)


def _step_problem(value: object) -> str | None:
    if not (isinstance(value, tuple) and len(value) == 4):
        return f"must return (observation, reward, done, info), got {type(value).__name__} {value!r:.80}"
    observation, reward, done, info = value
    if observation is not None and (problem := _observation_problem(observation)):
        return problem
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return f"must return a finite number as reward, got {reward!r:.40}"
    if not isinstance(done, bool):
        return f"must return a bool as done, got {type(done).__name__}"
    if not isinstance(info, dict):
        return f"must return a dict as info, got {type(info).__name__}"
    return None


def _observation_problem(value: object) -> str | None:
    if not isinstance(value, Observation):
        return f"must return an Observation (or None), got {type(value).__name__}"
    if not isinstance(value.text, str):
        return f"returned an Observation whose text is a {type(value.text).__name__}, not a str"
    if not all(isinstance(image, Image.Image) for image in value.images):
        return "returned an Observation with images that are not PIL images"
    return None


def check_gui_tool(tool: object, environment: object, arguments: dict | None = None) -> CheckReport:
    """``check_tool`` for a GUI tool: ``environment`` (a ``ScreenEnvironment`` not yet reset, e.g.
    ``MiniWoBEnv("click-test")``) is reset with seed 0, the checks run on its screenshot, and it is closed. Raises
    ``ToolCheckError`` listing every problem; synchronous (its own event loop)."""
    from verl_mm_tools.tools.check import acheck_tool

    async def run_checks() -> CheckReport:
        sample = Sample(data_source=None, ground_truth=None, extra_info={"seed": 0})
        observation = await call(environment.reset, sample)  # type: ignore[attr-defined]
        try:
            if not isinstance(observation, Observation) or not observation.images:
                raise EnvironmentCheckError(f"{type(environment).__name__}.reset showed no screenshot: not a GUI one")
            return await acheck_tool(tool, arguments, probe=observation.images[0], screen=environment)  # type: ignore[arg-type]
        finally:
            await call(environment.close)  # type: ignore[attr-defined]

    return asyncio.run(run_checks())
