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


def test_a_failing_plugin_is_reported_at_error_level_not_swallowed(tmp_path):
    # Break one of the modules the plugin imports before verl loads it: verl's loader would log this at DEBUG only.
    result = run_python(
        "import verl; print('verl imported')",
        tmp_path,
        sitecustomize="import sys\nsys.modules['verl_mm_tools.rewards'] = None\n",
    )
    assert result.returncode == 0, result.stderr
    assert "verl imported" in result.stdout
    assert "ERROR" in result.stderr
    assert "verl-mm-tools failed to register its components with verl" in result.stderr
    assert "Traceback" in result.stderr and "verl_mm_tools.rewards" in result.stderr


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
from verl_mm_tools.cpu.platform import PlatformCPU
from verl_mm_tools.rewards.managers import MMTurnDiscountRewardManager
from verl_mm_tools.rewards.turn_credit import ESTIMATOR_NAME, compute_turn_grpo_advantage
ours = [module for name, module in sys.modules.items() if name.startswith("verl_mm_tools")]
print(json.dumps({
    "mm_tool": _agent_loop_registry.get("mm_tool"),
    # the very classes registered, not copies from a second run of a module
    "reward manager": REWARD_MANAGER.get("mm_turn_discount") is MMTurnDiscountRewardManager,
    "platform": PlatformRegistry._platforms.get("cpu") is PlatformCPU,
    "advantage estimator": ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME) is compute_turn_grpo_advantage,
    "hook loaders left": sorted(module.__name__ for module in ours if "Hooked" in type(module.__loader__).__name__
                                or "Hooked" in type(module.__spec__.loader).__name__),
}))
"""


# With verl first, the same interpreter first answers the two tests of a plain ``import verl`` above. Their reads run
# no module code of their own before REGISTRATIONS: verl's import has loaded the reward-manager registry (checked),
# and the agent-loop module is imported next by REGISTRATIONS itself.
VERL_FIRST = """
import verl
import json, sys
registry_loaded = "verl.experimental.reward_loop.reward_manager.registry" in sys.modules
from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls
reward_manager_class = get_reward_manager_cls("mm_turn_discount").__qualname__
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
imported = "verl_mm_tools.plugin" in sys.modules
print(json.dumps({
    "registry loaded by verl": registry_loaded,
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
    assert read.pop("registry loaded by verl"), "verl no longer imports the registry: VERL_FIRST's reads run code"
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
        "hook loaders left": [],
    }
