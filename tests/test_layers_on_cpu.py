"""The layers the code promises, checked by the modules a fresh interpreter actually loads: the pure image ops, the
trajectory record and the viewer import neither verl nor torch, and the viewer nothing of the agent loop; the CPU
backend (``cpu/``) nothing of the demo that runs on it (``demo/``)."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import verl_mm_tools.cpu

pytestmark = pytest.mark.integration  # fresh interpreters importing the package


def loaded_after(statement: str) -> list[str]:
    probe = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "statement",
    [
        "import verl_mm_tools.ops",
        "import verl_mm_tools.bench.ops",  # times the ops in a process that loads nothing else
        "import verl_mm_tools.bench.opencv_ops",  # the same, against OpenCV
        "import verl_mm_tools.cpu.vllm_cpu",  # the vLLM settings the plugin below reads
        # vLLM loads this plugin in each of its processes, `vllm serve` too
        "import verl_mm_tools.adaptations.vllm_plugin",
        "import verl_mm_tools.record",
        "import verl_mm_tools.viewer.site, verl_mm_tools.viewer.loading, verl_mm_tools.viewer.html",
        "import verl_mm_tools.viewer.curve",
    ],
)
def test_pure_layers_load_no_verl_no_torch_and_no_agent_loop(statement):
    modules = loaded_after(statement)
    heavy = [name for name in modules if name.split(".")[0] in ("verl", "torch")]
    agent_loop = [name for name in modules if name.startswith("verl_mm_tools.agent_loop")]
    assert heavy == [] and agent_loop == [], (heavy[:5], agent_loop)


CPU_DIR = Path(verl_mm_tools.cpu.__file__).parent
CPU_MODULES = ["verl_mm_tools.cpu"] + [
    f"verl_mm_tools.cpu.{info.name}" for info in pkgutil.iter_modules([str(CPU_DIR)])
]
DEMO = "verl_mm_tools.demo"


def test_the_cpu_backend_loads_nothing_of_the_demo():
    modules = loaded_after("import verl_mm_tools.plugin, " + ", ".join(CPU_MODULES))
    assert set(CPU_MODULES) <= set(modules)
    assert [name for name in modules if name == DEMO or name.startswith(DEMO + ".")] == []


def imported_names(path: Path) -> list[str]:
    """Every module an ``import`` in ``path`` names, function-level ones included (they load only when called)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("path", sorted(CPU_DIR.glob("*.py")), ids=lambda path: path.name)
def test_no_cpu_backend_module_imports_the_demo_even_inside_a_function(path):
    assert [name for name in imported_names(path) if name == DEMO or name.startswith(DEMO + ".")] == []


def test_the_record_keeps_the_reward_managers_keys():
    from verl_mm_tools.record import STATS_KEYS
    from verl_mm_tools.rewards.common import ATTEMPTS_KEY, TOOL_CALLS_KEY

    assert {ATTEMPTS_KEY, TOOL_CALLS_KEY} <= set(STATS_KEYS)
