"""Shared fixtures: the real embedded tiny models (built once per machine, cached), their processors, and a real
trajectory dump of the tiny model."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from verl_mm_tools.tiny import QWEN_VL_FAMILIES, tiny_model_path


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The default tiny Qwen2.5-VL."""
    return tiny_model_path()


@pytest.fixture(scope="session", params=QWEN_VL_FAMILIES)
def tiny_family_dir(request):
    """Each tiny Qwen-VL family (the other families have their own tests): (family, model directory)."""
    return request.param, tiny_model_path(family=request.param)


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    from verl.utils import hf_processor

    return hf_processor(str(tiny_model_dir))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from verl.utils import hf_tokenizer

    return hf_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="session")
def sample_dump(tiny_model_dir, tmp_path_factory):
    """A real dump shared by the viewer and trajectory tests: the tiny Qwen2.5-VL with the rotate tool, two steps
    of the four scripted trajectories (``sample_dump.SAMPLE_SCRIPTS``) through verl's AgentLoopWorker, reward worker
    (mm_turn_discount, rotation_reward_45) and MMToolAgentLoopManager. Returns the dump folder (``step_000001``,
    ``step_000002``); the viewer's site goes into its ``_site``; copy it to change a record."""
    from verl_mm_tools.testkit.sample_dump import write_sample_dump

    workdir = tmp_path_factory.mktemp("sample_dump")
    write_sample_dump(workdir / "dump", workdir / "work", model_dir=tiny_model_dir, steps=(1, 2))
    return workdir / "dump"


@pytest.fixture(autouse=True)
def _restore_verl_agent_loop_registry():
    """verl's AgentLoopWorker writes agent_loop_config_path entries into a process-wide registry; restore it after
    each test so one test's loop options never leak into the next."""
    from verl_mm_tools.runtime.workers import restored_loop_registry

    with restored_loop_registry():
        yield


# pytest-xdist (`-n 2`, pytest.ini): the modules that start processes holding both cores and GiBs (verl's trainer, vLLM
# engines, Ray clusters: any module with a slow test or a Ray cluster) run one after another on one worker, while the
# other worker takes the rest; every module stays whole on one worker, so its module-scoped fixtures are built once.
# (xdist's own --dist loadgroup cannot do this on pytest 9, whose node ids it can no longer rename.)
SERIAL_GROUP = "processes"
SERIAL_MARKS = ("pytest.mark.slow", "ray.init(")
TESTS = Path(__file__).resolve().parent


@functools.cache
def serial_modules() -> frozenset[str]:
    return frozenset(
        path.relative_to(TESTS.parent).as_posix()
        for path in TESTS.rglob("test_*.py")
        if any(mark in path.read_text() for mark in SERIAL_MARKS)
    )


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SerialProcessesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SERIAL_GROUP if module in serial_modules() else module

    return SerialProcessesScheduling(config, log)
