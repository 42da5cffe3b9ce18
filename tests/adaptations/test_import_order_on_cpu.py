"""The import hooks (``adaptations/import_order.py``): ``import_first`` breaks the import cycle between verl's plugin
loader and our modules, ``call_after_import`` runs a function right after a module's code. That a real ``import verl``
registers everything whichever module of ours comes first: ``tests/test_plugin_on_cpu.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=cwd,
        timeout=300,
    )


def write_cycle_packages(root):
    """``dep`` stands in for verl (its __init__ ends by importing our plugin, as verl's entry-point loader does);
    ``pkg.plugin`` needs ``pkg.b``, which imports ``dep``: importing ``pkg.b`` first is the cycle."""
    (root / "dep").mkdir()
    (root / "dep" / "__init__.py").write_text("LOADS = []\nimport pkg.plugin\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "plugin.py").write_text("from pkg.b import VALUE\nREGISTERED = VALUE\n")
    (root / "pkg" / "b.py").write_text("import dep\ndep.LOADS.append(__name__)\nVALUE = object()\n")
    (root / "pkg" / "light.py").write_text("LIGHT = True\n")


@pytest.mark.parametrize("hooked", [True, False])
def test_import_first_breaks_the_plugin_import_cycle(hooked, tmp_path):
    write_cycle_packages(tmp_path)
    if hooked:
        (tmp_path / "pkg" / "__init__.py").write_text(
            "from verl_mm_tools.adaptations.import_order import import_first\n"
            "import_first('dep', 'pkg', {'pkg.light'})\n"
        )
    else:
        (tmp_path / "pkg" / "__init__.py").write_text("")
    result = run_python(
        """
        import json, sys
        import pkg.light
        light_alone = "dep" in sys.modules
        import pkg.b
        import dep, pkg.plugin
        print(json.dumps([light_alone, dep.LOADS, pkg.plugin.REGISTERED is pkg.b.VALUE,
                          type(pkg.b.__spec__.loader).__name__, type(pkg.b.__loader__).__name__]))
        """,
        tmp_path,
    )
    if hooked:
        assert result.returncode == 0, result.stderr
        # pkg.b ran once (imported by the plugin while dep loaded), its real loader back in place
        assert json.loads(result.stdout) == [False, ["pkg.b"], True, "SourceFileLoader", "SourceFileLoader"]
    else:
        assert "ImportError: cannot import name 'VALUE' from partially initialized module 'pkg.b'" in result.stderr


def test_call_after_import_runs_once_right_after_the_module_code(tmp_path):
    (tmp_path / "late.py").write_text("VALUE = 41\n")
    result = run_python(
        """
        import json, sys
        from verl_mm_tools.adaptations.import_order import call_after_import
        seen = []
        call_after_import("late", lambda module: seen.append(module.VALUE + 1))
        before = list(seen)
        import late
        import late
        call_after_import("late", lambda module: seen.append("at once"))
        print(json.dumps([before, seen, type(late.__spec__.loader).__name__, type(late.__loader__).__name__]))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[], [42, "at once"], "SourceFileLoader", "SourceFileLoader"]


def test_the_light_module_list_is_the_import_graphs():
    """``LIGHT_MODULES`` is generated from the sources, never kept by hand: a module whose import now reaches verl
    left the list, a new one that does not joined it."""
    from verl_mm_tools.adaptations import import_graph
    from verl_mm_tools.adaptations.light_modules import LIGHT_MODULES

    assert import_graph.GENERATED.read_text(encoding="utf-8") == import_graph.generated_source(), (
        "stale: run python -m verl_mm_tools.adaptations.import_graph"
    )
    assert {"verl_mm_tools.cli", "verl_mm_tools.record", "verl_mm_tools.handoff"} <= LIGHT_MODULES
    assert not {"verl_mm_tools.agent_loop.mm_tool_loop", "verl_mm_tools.rewards.managers"} & LIGHT_MODULES


def test_an_import_under_type_checking_or_in_a_function_leaves_a_module_light(tmp_path, monkeypatch):
    from verl_mm_tools.adaptations import import_graph

    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import verl\nelse:\n    import json\n"
        "def later():\n    import verl\n"
    )
    heavy = "try:\n    from verl.protocol import DataProto\nexcept ImportError:\n    pass\n"
    (tmp_path / "light.py").write_text(source)
    (tmp_path / "heavy.py").write_text(heavy)
    (tmp_path / "through.py").write_text("from verl_mm_tools import heavy\n")
    modules = {f"verl_mm_tools.{path.stem}": path for path in tmp_path.glob("*.py")}
    monkeypatch.setattr(import_graph, "MODULES", modules)
    assert import_graph.light_modules() == ["verl_mm_tools.light"]
    assert import_graph.our_imports("verl_mm_tools.through") == {"verl_mm_tools.heavy"}
