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
