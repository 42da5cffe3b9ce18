"""The verl.plugins entry point: a plain ``import verl`` registers our components whichever module is imported
first; failures are loud."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from verl_mm_tools.errors import PluginRegistrationError
from verl_mm_tools.verl_registry import register_unique

pytestmark = pytest.mark.integration  # fresh interpreters importing verl

MM_TOOL_TARGET = "verl_mm_tools.agent_loop.MMToolAgentLoop"


def run_python(code: str, tmp_path, sitecustomize: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if sitecustomize is not None:
        (tmp_path / "sitecustomize.py").write_text(sitecustomize)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_import_verl_registers_mm_tool_through_the_installed_entry_point(verl_imported_first):
    assert verl_imported_first["entry point"] == {"mm_tool": {"_target_": MM_TOOL_TARGET}, "imported": True}


@pytest.mark.parametrize(
    ("broken", "code", "message"),
    [
        # a module the plugin imports as verl loads it: verl's loader would log this at DEBUG only
        ("verl_mm_tools.adaptations.fixes", "import verl", "failed to register its components with verl"),
        # a module registered when verl imports its registry: verl's module stays usable without ours
        (
            "verl_mm_tools.rewards",
            "import verl; from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls; "
            "get_reward_manager_cls('naive')",
            "failed to register its reward managers with verl; they are NOT available",
        ),
    ],
)
def test_a_failing_plugin_is_reported_at_error_level_not_swallowed(broken, code, message, tmp_path):
    result = run_python(
        f"{code}; print('verl imported')", tmp_path, sitecustomize=f"import sys\nsys.modules[{broken!r}] = None\n"
    )
    assert result.returncode == 0, result.stderr
    assert "verl imported" in result.stdout
    assert "ERROR" in result.stderr and message in result.stderr
    assert "Traceback" in result.stderr and broken in result.stderr


def test_verls_own_loader_still_hides_a_failing_plugin_below_info(tmp_path):
    """Why the plugin reports its own failures at ERROR (``plugin._register_or_report``): verl's entry-point loader
    logs a plugin that fails to import at DEBUG. When a failure shows at INFO or above, verl reports it itself."""
    dist_info = tmp_path / "broken_plugin-0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.0\n")
    (dist_info / "entry_points.txt").write_text("[verl.plugins]\nbroken = no_such_module_of_a_plugin\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "VERL_USE_EXTERNAL_PLUGINS": "broken",
    }  # only the broken plugin: ours would log its own registrations
    code = "import logging; logging.basicConfig(level=logging.INFO); import verl; print('verl imported')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "verl imported"
    assert "no_such_module_of_a_plugin" not in result.stderr and "broken" not in result.stderr


def test_a_name_clash_with_another_package_raises_naming_both(tmp_path):
    result = run_python(
        """
        import os
        os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
        import verl
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        _agent_loop_registry["mm_tool"] = {"_target_": "other_package.loops.TheirLoop"}
        import verl_mm_tools.plugin
        """,
        tmp_path,
    )
    assert result.returncode != 0
    assert "PluginRegistrationError" in result.stderr
    assert "'mm_tool' as " + MM_TOOL_TARGET in result.stderr
    assert "already registered by other_package.loops.TheirLoop" in result.stderr


def test_register_unique_is_idempotent_for_the_same_entry_and_refuses_another():
    registry = {}
    register_unique(registry, "x", {"_target_": "a.B"}, "agent loop")
    register_unique(registry, "x", {"_target_": "a.B"}, "agent loop")
    assert registry == {"x": {"_target_": "a.B"}}
    with pytest.raises(PluginRegistrationError, match=r"agent loop 'x' as c\.D: .*already registered by a\.B"):
        register_unique(registry, "x", {"_target_": "c.D"}, "agent loop")
    assert registry == {"x": {"_target_": "a.B"}}


def test_import_verl_registers_the_reward_managers(verl_imported_first):
    assert verl_imported_first["reward manager class"] == "MMTurnDiscountRewardManager"


MODULES = "import json, sys, verl; print(json.dumps(sorted(sys.modules)))"


@pytest.mark.parametrize("platform", ["", "cpu"])
def test_the_plugin_adds_only_its_own_modules_to_import_verl(platform, tmp_path):
    """Every process that imports verl loads the plugin (the TaskRunner, each actor, rollout, agent-loop and reward
    worker): it registers each component when verl imports that component's registry, so ``import verl`` loads no
    module of verl's or anyone else's that it does not load without plugins (it loaded 1,323 more, vLLM and torch's
    inductor among them, 2.5 s and ~100 MiB more per process: issue #63), with the CPU platform selected too."""
    env = {**os.environ, "VERL_PLATFORM": platform}
    loaded = {}
    for plugins in ("auto", "none"):
        env["VERL_USE_EXTERNAL_PLUGINS"] = plugins
        done = subprocess.run([sys.executable, "-c", MODULES], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        loaded[plugins] = set(json.loads(done.stdout.splitlines()[-1]))
    added = loaded["auto"] - loaded["none"]
    assert "verl_mm_tools.plugin" in added
    assert sorted(name for name in added if name.split(".")[0] != "verl_mm_tools") == []


def test_each_registered_agent_loop_target_is_the_loop_class():
    import hydra

    from verl_mm_tools.agent_loop.mm_tool_loop import MMToolAgentLoop
    from verl_mm_tools.plugin import AGENT_LOOPS

    assert AGENT_LOOPS == {"mm_tool": MM_TOOL_TARGET}
    assert hydra.utils.get_class(MM_TOOL_TARGET) is MMToolAgentLoop


# Each module imported first in a fresh interpreter, then verl: before adaptations.import_order.import_first,
# importing one of ours that imports verl made the plugin find it half-initialised (ImportError, nothing registered).
# Each order costs a fresh interpreter importing verl (~20 s under load), so an order that runs exactly the same
# module code as one in the list is left out: "verl_mm_tools.rewards.managers" (the package's __init__ imports it,
# so importing it first runs verl_mm_tools.rewards's __init__ whole and then finds it loaded; checked below).
FIRST_IMPORTS = [
    "verl",
    "verl_mm_tools.plugin",
    "verl_mm_tools.agent_loop",
    "verl_mm_tools.tools",
    "verl_mm_tools.rewards",
    "verl_mm_tools.cpu",
    "verl_mm_tools.cpu.replica",
    "verl_mm_tools.envs",
    "verl_mm_tools.cli",
    "verl_mm_tools.adaptations.fixes",
]
REGISTRATIONS = """
import json, sys
import verl
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
from verl.plugin.platform import PlatformRegistry
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl_mm_tools.cpu.checkpoint_engine import CPUObjectStoreCheckpointEngine
from verl_mm_tools.cpu.platform import PlatformCPU
from verl_mm_tools.cpu.replica import HFReplica
from verl_mm_tools.rewards.managers import MMTurnDiscountRewardManager
from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME, compute_turn_grpo_advantage
ours = [module for name, module in sys.modules.items() if name.startswith("verl_mm_tools")]
print(json.dumps({
    "mm_tool": _agent_loop_registry.get("mm_tool"),
    # the very classes registered, not copies from a second run of a module
    "reward manager": REWARD_MANAGER.get("mm_turn_discount") is MMTurnDiscountRewardManager,
    "platform": PlatformRegistry._platforms.get("cpu") is PlatformCPU,
    "advantage estimator": ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME) is compute_turn_grpo_advantage,
    "checkpoint engine": CheckpointEngineRegistry._registry.get("cpu_object_store") is CPUObjectStoreCheckpointEngine,
    "hf rollout": RolloutReplicaRegistry._registry["hf"]() is HFReplica
    and rollout_base._ROLLOUT_REGISTRY.get(("hf", "async")) == "verl_mm_tools.cpu.replica.HFServerAdapter",
    "hook loaders left": sorted(module.__name__ for module in ours if "Hooked" in type(module.__loader__).__name__
                                or "Hooked" in type(module.__spec__.loader).__name__),
}))
"""


# With verl first, the same interpreter first answers the two tests of a plain ``import verl`` above: reading a
# registry imports its module, which registers ours right after that module's code ran.
VERL_FIRST = """
import verl
import json, sys
from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls
reward_manager_class = get_reward_manager_cls("mm_turn_discount").__qualname__
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
imported = "verl_mm_tools.plugin" in sys.modules
print(json.dumps({
    "reward manager class": reward_manager_class,
    "entry point": {"mm_tool": _agent_loop_registry.get("mm_tool"), "imported": imported},
}))
"""


def registrations_after(first: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    """A fresh interpreter importing ``first``, then reading the registrations: (the process, their JSON)."""
    result = run_python(f"import {first}\n" + textwrap.dedent(REGISTRATIONS), tmp_path)
    assert result.returncode == 0, result.stderr
    return result, json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def verl_imported_first(tmp_path_factory) -> dict:
    """One fresh interpreter, ``import verl`` first: what VERL_FIRST read, and "registrations": REGISTRATIONS'."""
    workdir = tmp_path_factory.mktemp("verl_first")
    result = run_python(VERL_FIRST + textwrap.dedent(REGISTRATIONS), workdir)
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout.splitlines()[-2])
    return {**read, "stderr": result.stderr, "registrations": json.loads(result.stdout.splitlines()[-1])}


def test_importing_the_reward_managers_module_first_is_importing_the_rewards_package_first():
    """Why FIRST_IMPORTS leaves verl_mm_tools.rewards.managers out: the package's __init__ imports it at its top."""
    import ast
    import importlib.util

    origin = importlib.util.find_spec("verl_mm_tools.rewards").origin
    with open(origin, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    assert "verl_mm_tools.rewards.managers" in [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]


@pytest.mark.parametrize("first", FIRST_IMPORTS)
def test_any_module_imported_first_registers_everything_once(first, tmp_path, request):
    if first == "verl":
        result = request.getfixturevalue("verl_imported_first")
        stderr, registrations = result["stderr"], result["registrations"]
    else:
        process, registrations = registrations_after(first, tmp_path)
        stderr = process.stderr
    assert "ERROR" not in stderr, stderr
    assert registrations == {
        "mm_tool": {"_target_": MM_TOOL_TARGET},
        "reward manager": True,
        "platform": True,
        "advantage estimator": True,
        "checkpoint engine": True,
        "hf rollout": True,
        "hook loaders left": [],
    }
