"""The ops are pure PIL: no module under verl_mm_tools/ops imports verl."""

import ast
from pathlib import Path

import verl_mm_tools.ops

OPS_DIR = Path(verl_mm_tools.ops.__file__).parent


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_ops_modules_do_not_import_verl():
    files = sorted(OPS_DIR.glob("*.py"))
    assert [f.name for f in files] == [
        "__init__.py",
        "argument_checks.py",
        "draw.py",
        "geometry.py",
        "text.py",
        "transform.py",
    ]
    for path in files:
        top_levels = {module.split(".")[0] for module in imported_modules(path)}
        assert "verl" not in top_levels, path.name
