"""The layers the code promises, checked by the modules a fresh interpreter actually loads: the pure image ops, the
trajectory record and the viewer import neither verl nor torch, and the viewer nothing of the agent loop."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_after(statement: str) -> list[str]:
    probe = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("statement", [
    "import verl_mm_tools.ops",
    "import verl_mm_tools.bench_ops",  # times the ops in a process that loads nothing else
    "import verl_mm_tools.cpu.vllm_cpu",  # vLLM loads this plugin in each of its processes, `vllm serve` too
    "import verl_mm_tools.record",
    "import verl_mm_tools.viewer.site, verl_mm_tools.viewer.records, verl_mm_tools.viewer.html, verl_mm_tools.viewer.curve",
])
def test_pure_layers_load_no_verl_no_torch_and_no_agent_loop(statement):
    modules = loaded_after(statement)
    heavy = [name for name in modules if name.split(".")[0] in ("verl", "torch")]
    agent_loop = [name for name in modules if name.startswith("verl_mm_tools.agent_loop")]
    assert heavy == [] and agent_loop == [], (heavy[:5], agent_loop)


def test_the_record_keeps_the_reward_managers_keys():
    from verl_mm_tools.record import STATS_KEYS
    from verl_mm_tools.rewards.common import ATTEMPTS_KEY, TOOL_CALLS_KEY

    assert {ATTEMPTS_KEY, TOOL_CALLS_KEY} <= set(STATS_KEYS)
