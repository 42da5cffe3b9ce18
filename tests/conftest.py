"""Shared fixtures: the real embedded tiny models (built once per machine, cached), their processors, and a real
trajectory dump of the tiny model."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from hypothesis import settings

from verl_mm_tools.tiny import QWEN_VL_FAMILIES, tiny_model_path

# No timed assertions: Hypothesis's default 200 ms deadline per example failed a pure-arithmetic test on a loaded
# machine (555 ms), so no property test has a deadline; speed lives in `verl-mm-tools bench`.
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")


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


# pytest-xdist (`-n 2`, pytest.ini): the slow tests (verl's trainer, vLLM engines: both cores and GiBs each) run one
# after another on one worker while the other worker takes the rest; every other module stays whole on one worker, so
# its module-scoped fixtures are built once. Two trainer runs side by side never pay: at the landing of 2026-11-29 a
# second line of hf-server runs beside the slow line made both 2-6x slower (the main job 198 s -> 1,139 s) and the CI
# 2,065 s -> 4,641 s. (xdist's own --dist loadgroup cannot do this on pytest 9, whose node ids it can no longer
# rename; the scheduler sees node ids only, so the marks are read from the source.)
SERIAL_GROUP = "slow"
TESTS = Path(__file__).resolve().parent


@functools.cache
def slow_tests(module: str) -> frozenset[str]:
    """``module``'s test functions marked ``pytest.mark.slow``."""
    tree = ast.parse((TESTS.parent / module).read_text())
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and "pytest.mark.slow" in {ast.unparse(decorator) for decorator in node.decorator_list}
    )


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SlowTestsInOneLine(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module, _, rest = nodeid.partition("::")
            function = rest.split("[", 1)[0].rsplit("::", 1)[-1]
            return SERIAL_GROUP if function in slow_tests(module) else module

    return SlowTestsInOneLine(config, log)
