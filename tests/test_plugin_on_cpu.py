"""The verl.plugins entry point: a plain ``import verl`` registers our components; failures are loud."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from verl_mm_tools.errors import PluginRegistrationError
from verl_mm_tools.registry import register_unique

MM_TOOL_TARGET = "verl_mm_tools.agent_loop.mm_tool_loop.MMToolAgentLoop"


def run_python(code: str, tmp_path, sitecustomize: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if sitecustomize is not None:
        (tmp_path / "sitecustomize.py").write_text(sitecustomize)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def test_import_verl_registers_mm_tool_through_the_installed_entry_point(tmp_path):
    result = run_python(
        """
        import json, sys
        import verl
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        print(json.dumps({"mm_tool": _agent_loop_registry.get("mm_tool"), "imported": "verl_mm_tools.plugin" in sys.modules}))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"mm_tool": {"_target_": MM_TOOL_TARGET}, "imported": True}


def test_a_failing_plugin_is_reported_at_error_level_not_swallowed(tmp_path):
    # Break one of our modules before verl loads the plugin: verl's loader would log this at DEBUG only.
    result = run_python(
        "import verl; print('verl imported')",
        tmp_path,
        sitecustomize="import sys\nsys.modules['verl_mm_tools.agent_loop'] = None\n",
    )
    assert result.returncode == 0, result.stderr
    assert "verl imported" in result.stdout
    assert "ERROR" in result.stderr
    assert "verl-mm-tools failed to register its components with verl" in result.stderr
    assert "Traceback" in result.stderr and "verl_mm_tools.agent_loop" in result.stderr


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


def test_import_verl_registers_the_reward_managers(tmp_path):
    result = run_python(
        """
        import verl
        from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls
        print(get_reward_manager_cls("mm_turn_discount").__qualname__)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "MMTurnDiscountRewardManager"
