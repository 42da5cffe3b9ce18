"""Shared fixtures: the real embedded tiny models (built once per machine, cached), their processors, and a real
trajectory dump of the tiny model."""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterator
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


# pytest-xdist (`-n 2`, pytest.ini): the slow tests that start verl's trainer or a Ray cluster (both cores and GiBs
# each) run one after another on one worker while the other worker takes the rest; every other module stays whole on
# one worker, so its module-scoped fixtures are built once. Two trainer runs side by side never pay: at the landing of
# 2026-11-29 a second line of hf-server runs beside the slow line made both 2-6x slower (the main job 198 s -> 1,139 s)
# and the CI 2,065 s -> 4,641 s. (xdist's own --dist loadgroup cannot do this on pytest 9, whose node ids it can no
# longer rename; the scheduler sees node ids only, so the marks are read from the source.)
SERIAL_GROUP = "slow"
# Slow modules that start no RL trainer and no Ray cluster (one vLLM engine, a fit in this process, verl's SFT trainer
# under torchrun): they run with the other worker's modules at nice 10, beside the serial line. At the landing of
# 2026-11-30 the serial line took 2,095 s and the other 1,755 s. Ray does not belong here: a raylet started at nice
# 10 beside a trainer aborted waiting for its dashboard agent (``_ray_daemons_at_full_priority``).
SLOW_WITHOUT_RAY = frozenset(
    {
        "tests/tiny/test_vllm_engine_on_cpu.py",
        "tests/evaluate/test_eval_on_cpu.py",
        "tests/bench/test_bench_on_cpu.py",
        "tests/demo/test_warm_start_on_cpu.py",
        "tests/cpu/test_verl_sft_on_cpu.py",
    }
)
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


def serial_scope(nodeid: str) -> str:
    """The xdist scope of a test: the serial line for a slow test that starts a trainer, else its module."""
    module, _, rest = nodeid.partition("::")
    function = rest.split("[", 1)[0].rsplit("::", 1)[-1]
    in_serial_line = module not in SLOW_WITHOUT_RAY and function in slow_tests(module)
    return SERIAL_GROUP if in_serial_line else module


# Fixtures that load the tiny model or its tokenizer, a trajectory dump, verl's worker or event loop, TransferQueue or
# Ray: a test using one is an ``integration`` test (the unit lane, ``-m "not slow and not integration"``, leaves it
# out). A module that loads such things by itself says so with ``pytestmark = pytest.mark.integration``.
INTEGRATION_FIXTURES = frozenset(
    {
        "tiny_model_dir",
        "tiny_family_dir",
        "tiny_processor",
        "tiny_tokenizer",
        "sample_dump",
        "rollout",
        "transfer_queue",
        "event_loop_for_verl",
        "tokenizer_dir",
        "start_ray",
        "ray_cluster",
        "local_ray",
        "verl_imported_first",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.integration)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SlowTestsInOneLine(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return serial_scope(nodeid)

    return SlowTestsInOneLine(config, log)


# The serial line is the run's critical path, and it was the one starved: Ray runs its workers at nice 15, so a
# trainer's actors got a few percent of a core whenever the other worker's test (nice 0) computed. Now every Ray
# worker keeps the nice of the process that started Ray, the serial line runs at nice 0 and every other test at nice
# 10: the other worker fills the cycles a trainer leaves idle. Lowering a nice value back needs privilege (CI runs as
# root); without it a worker stays at 10, which costs time, not correctness.
os.environ.setdefault("RAY_worker_niceness", "0")
OTHER_TESTS_NICE = 10
_log = logging.getLogger(__name__)


def set_niceness(value: int) -> None:
    """Give every thread of this process the nice ``value`` (on Linux, setpriority acts per thread, and torch's
    threads would keep the old one)."""
    for thread in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(thread), value)
        except (PermissionError, ProcessLookupError) as refused:
            _log.debug("nice %d for thread %s refused: %s", value, thread, refused)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        set_niceness(0 if serial_scope(item.nodeid) == SERIAL_GROUP else OTHER_TESTS_NICE)


@contextlib.contextmanager
def _ray_daemons_at_full_priority() -> Iterator[None]:
    """Start Ray inside this block: its GCS, raylet and agents at nice 0, its workers at this test's nice.

    A raylet waits 20 s (not configurable in Ray 2.60) for its dashboard agent to write its port, then aborts; at nice
    10 beside a trainer at nice 0, that Python process took 21 s to start, and ``ray.init`` failed with "The current
    node timed out during startup" (CI, 2026-11-30). Ray's daemons are idle once started; its workers keep the nice
    of this test (RAY_worker_niceness is read by the raylet as it starts)."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    worker_niceness = os.environ.get("RAY_worker_niceness")
    os.environ["RAY_worker_niceness"] = str(nice)
    set_niceness(0)
    try:
        yield
    finally:
        set_niceness(nice)
        if worker_niceness is None:
            del os.environ["RAY_worker_niceness"]
        else:
            os.environ["RAY_worker_niceness"] = worker_niceness


RAY_STARTS = 3  # tries of ray.init on this 2-core machine (``start_ray``)


def _start_ray(**init_kwargs: object) -> None:
    """``ray.init(**init_kwargs)`` with its daemons at full priority (``_ray_daemons_at_full_priority``), tried again
    when the node times out during startup: beside a trainer starting its own cluster on the other worker, GCS and
    raylet can miss Ray's startup deadline even at nice 0 (CI, 2026-12-03: ``test_shared_images_on_cpu.py`` beside
    the fully async trainer's start). Any other error raises at once."""
    import ray

    for attempt in range(1, RAY_STARTS + 1):
        with _ray_daemons_at_full_priority():
            try:
                ray.init(**init_kwargs)
                return
            except Exception as error:
                if "timed out during startup" not in str(error) or attempt == RAY_STARTS:
                    raise
                _log.warning("ray.init, try %d of %d: %s; starting it again", attempt, RAY_STARTS, error)
                ray.shutdown()


@pytest.fixture(scope="session")
def start_ray():
    """``start_ray(**ray_init_kwargs)``: see ``_start_ray``."""
    return _start_ray


# A test phase this long is named as it ends, with the run's elapsed time, so that a CI run cut off by its time limit
# still shows where the time went (pytest's own --durations table prints only at the end).
LONG_PHASE_S = 30.0
STARTED = time.monotonic()


def pytest_runtest_logreport(report):
    reporter = _CONTROLLER[0].pluginmanager.getplugin("terminalreporter") if _CONTROLLER else None
    if reporter is None or report.duration < LONG_PHASE_S:
        return
    elapsed_min = (time.monotonic() - STARTED) / 60
    phase = f"{report.when} {report.outcome} in {report.duration:.0f} s"
    reporter.write("\n")  # after the progress dots
    reporter.write_line(f"[{elapsed_min:5.1f} min] {phase}: {report.nodeid}")


# the controller's config (an xdist worker's output is not shown, so workers report nothing)
_CONTROLLER: list[pytest.Config] = []


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        _CONTROLLER.append(config)


@pytest.fixture(scope="module")
def transfer_queue(start_ray):
    """A Ray cluster and verl's TransferQueue (one storage unit) for the tests of a module."""
    import ray
    import transfer_queue as tq
    import verl
    from omegaconf import OmegaConf

    start_ray(num_cpus=4, include_dashboard=False)
    config = OmegaConf.load(
        os.path.join(os.path.dirname(verl.__file__), "trainer/config/transfer_queue/transfer_queue.yaml")
    )
    config.backend.SimpleStorage.num_data_storage_units = 1
    tq.init(config)
    yield tq
    tq.close()
    ray.shutdown()
