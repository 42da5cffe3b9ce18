"""Every file, module and symbol the user docs name exists: README_VLMRL.md and docs/*.md (docs/experiments/ are dated
records of runs and keep the names of their day).

What counts as a reference (in backticks; dotted ``verl_mm_tools.`` names in code blocks too):
- a path from the repository root (``tests/...``, ``examples/...``, ``scripts/...``, ``docs/...``,
  ``verl_mm_tools/...``) or from the package (``step_hook/step.py``, ``cpu/``); a bare ``name.py`` (some file of
  that name); a pytest node (``tests/x.py::test_y``: the test is defined there); a module and attribute
  (``remote/probe.BlockingTool``); ``verl/...`` paths are looked up in the installed verl;
- a Markdown link to a file of the repository (``[text](docs/x.md#anchor)``: the file);
- a dotted name ``verl_mm_tools.a.b.Name`` (the module file exists and defines ``Name``);
- a code identifier (``CamelCase``, ``snake_case``, ``UPPER``, ``Class.attr``, ``module.attr``) bound to a file
  ("`path.py`'s `Name`", "a `Name` member in `path.py`"), and every identifier of a docs/contributing.md table row
  ("where things go"): a file the row names defines it.
Definitions are read with ast, so no heavy module is imported."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verl_mm_tools"
ROOT_DIRS = ("verl_mm_tools/", "tests/", "examples/", "scripts/", "docs/", ".ci/")
SEARCHED_DIRS = ("verl_mm_tools", "tests", "examples", "scripts", "docs")

# Backticked text that looks like a path or name of ours and is not code: paths a user or a run creates, Ray actor
# names, placeholders. Keep it short: everything else must exist.
NOT_CODE = {
    "verl_mm_tools/tool/<name>/<digest>/<index>",  # a Ray actor's name (docs/remote.md)
    "examples/recipes/family/F.yaml",  # F stands for a family's name
    "trajectories/<step>/<id>/",  # a dump's folders (docs/trajectories.md)
    "ops/default_cap/zoom_in_ms",  # benchmark figures (docs/benchmarks.md)
    "ops/default_cap/NAME_over_transpose1024",
}

FOREIGN_PACKAGES = {"verl", "vllm", "torch", "transformers", "ray", "nn"}
LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]+)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"\bverl_mm_tools(?:\.[A-Za-z_]\w*)+")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
PATH_LIKE = re.compile(r"[\w.<>*{},/+:\[\]-]+")
PYTHON_FILE = re.compile(r"[\w/.-]+\.py")
# "`path.py`'s `Name`", "`Name` in `path.py`", "a `Name` member in `path.py`"
BINDING_FORMS = (
    re.compile(r"`(?P<file>[^`]+\.py)`'s `(?P<name>[^`]+)`"),
    re.compile(r"`(?P<name>[^`]+)`(?: \w+)? in `(?P<file>[^`]+\.py)`"),
)


def doc_files() -> list[Path]:
    return [ROOT / "README_VLMRL.md", *sorted((ROOT / "docs").glob("*.md"))]


@functools.cache
def subpackages() -> frozenset[str]:
    return frozenset(path.parent.name for path in PACKAGE.glob("*/__init__.py"))


@functools.cache
def files_named(name: str) -> tuple[Path, ...]:
    found = [path for folder in SEARCHED_DIRS for path in (ROOT / folder).rglob(name)]
    return tuple(found) + tuple(path for path in [ROOT / name] if path.exists())


@functools.cache
def verl_root() -> Path | None:
    spec = importlib.util.find_spec("verl")
    return Path(spec.origin).parent if spec and spec.origin else None


@functools.cache
def defined_names(path: Path) -> dict[str, frozenset[str]]:
    """Every name a module defines, anywhere in it (functions, classes, assignments, ``self.x = ...``, imports,
    dataclass fields), and for each class the names its body defines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: dict[str, frozenset[str]] = {"": frozenset(_names_in(tree))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names[node.name] = names.get(node.name, frozenset()) | frozenset(_names_in(node))
    return names


def _names_in(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
    return names


def defines(path: Path, dotted: str) -> bool:
    """``Name`` or ``Class.attr`` is defined in the module at ``path`` (a package: its ``__init__.py``)."""
    if path.is_dir():
        path = path / "__init__.py"
    if not path.is_file() or path.suffix != ".py":
        return False
    names = defined_names(path)
    head, _, rest = dotted.partition(".")
    if head not in names[""]:
        return False
    return not rest or rest.split(".")[0] in names.get(head, names[""])


def module_file(parts: list[str], base: Path) -> tuple[Path, list[str]] | None:
    """The longest prefix of ``parts`` that is a module or package under ``base``, and the attribute parts after it."""
    for end in range(len(parts), 0, -1):
        stem = base.joinpath(*parts[:end])
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file():
                return candidate, parts[end:]
    return None


def dotted_name_exists(name: str) -> bool:
    parts = name.split(".")
    found = module_file(parts[1:], PACKAGE) if len(parts) > 1 else (PACKAGE / "__init__.py", [])
    if found is None:
        return False
    path, attributes = found
    return not attributes or defines(path, ".".join(attributes))


def path_candidates(text: str) -> list[Path]:
    if text.startswith(ROOT_DIRS):
        return [ROOT / text]
    if text.startswith("verl/"):
        root = verl_root()
        return [root / text.removeprefix("verl/")] if root else []
    if "/" in text and text.split("/")[0] in subpackages():
        return [PACKAGE / text]
    if "/" not in text and text.endswith(".py"):
        return list(files_named(text))
    return []


def is_path_reference(text: str) -> bool:
    if not PATH_LIKE.fullmatch(text) or text in NOT_CODE:
        return False
    first = text.split("/")[0]
    return text.startswith(ROOT_DIRS + ("verl/",)) or ("/" in text and first in subpackages()) or text.endswith(".py")


def path_exists(text: str) -> bool:
    """A path (globs and ``<placeholders>`` match anything), a pytest node, or ``module/path.attribute``."""
    text, _, test_name = text.partition("::")
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", text)
    for candidate in path_candidates(pattern):
        matches = list(candidate.parent.glob(candidate.name)) if "*" in pattern else [candidate]
        if any(match.exists() for match in matches):
            return not test_name or defines(candidate, test_name.split("[")[0])
    return _module_attribute_exists(pattern)


def _module_attribute_exists(text: str) -> bool:
    """``remote/probe.BlockingTool``: the module ``remote/probe.py`` defines ``BlockingTool``."""
    folder, _, last = text.rpartition("/")
    module, dot, attribute = last.partition(".")
    if not dot or attribute == "py":
        return False
    stem = f"{folder}/{module}" if folder else module
    candidates = path_candidates(f"{stem}.py") + (path_candidates(stem) if folder else [])
    return any(defines(path, attribute) for path in candidates)


def is_code_identifier(text: str) -> bool:
    """``StopReason``, ``process_step``, ``EXPORTS``, ``ImageBudget._over_budget``; not plain words (``calls``)."""
    if not IDENTIFIER.fullmatch(text) or text.startswith("verl_mm_tools") or text.endswith(".py"):
        return False
    if text.split(".")[0] in FOREIGN_PACKAGES:
        return False
    return "_" in text or "." in text or any(char.isupper() for char in text)


def identifier_defined(name: str, files: list[Path]) -> bool:
    head, _, rest = name.partition(".")
    modules = [path for path in files if path.stem == head]
    if rest and modules:  # ``stats.aggregate_metrics``: the module named on the line
        return any(defines(path, rest) for path in modules)
    if rest and files_named(f"{head}.py") and not any(defines(path, head) for path in files):
        return any(defines(path, rest) for path in files_named(f"{head}.py"))
    return any(defines(path, name) for path in files)


def python_files_in(text: str) -> list[Path]:
    files: list[Path] = []
    for token in PYTHON_FILE.findall(text.partition("::")[0]):
        files.extend(path for path in path_candidates(token) if path.is_file())
    return files


def bound_names(line: str, doc: Path) -> list[tuple[str, list[Path]]]:
    """Identifiers and the files the text binds them to: each named form on any line; every identifier of a
    contributing.md table row (its "where things go" rows) to every file of the row."""
    pairs = [(match["name"], python_files_in(match["file"])) for form in BINDING_FORMS for match in form.finditer(line)]
    if doc.name == "contributing.md" and line.startswith("|"):
        files = [path for text in BACKTICKED.findall(line) for path in python_files_in(text)]
        pairs += [(text, files) for text in BACKTICKED.findall(line)]
    unique = {(name, tuple(files)) for name, files in pairs if files and is_code_identifier(name)}
    return [(name, list(files)) for name, files in sorted(unique)]


def missing_references(doc: Path) -> list[str]:
    missing = []
    in_code_block = False
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code_block = not in_code_block
        where = f"{doc.relative_to(ROOT)}:{number}"
        missing += [f"{where}: {name}" for name in DOTTED.findall(line) if not dotted_name_exists(name)]
        missing += [f"{where}: link {target}" for target in LINK.findall(line) if not (doc.parent / target).exists()]
        if in_code_block:
            continue
        missing += [
            f"{where}: {text}" for text in BACKTICKED.findall(line) if is_path_reference(text) and not path_exists(text)
        ]
        for name, files in bound_names(line, doc):
            if not identifier_defined(name, files):
                missing.append(f"{where}: {name} (not defined in {', '.join(sorted({p.name for p in files}))})")
    return missing


def test_every_file_module_and_symbol_the_docs_name_exists():
    missing = [entry for doc in doc_files() for entry in missing_references(doc)]
    assert not missing, (
        f"{len(missing)} names in the docs do not exist (moved or gone): fix the doc, or, for a path that is not "
        "code, add it to NOT_CODE in tests/test_doc_references_on_cpu.py:\n" + "\n".join(missing)
    )


def test_the_checker_finds_what_is_gone_and_accepts_what_exists():
    """The check itself: names that exist pass, made-up ones are reported."""
    assert dotted_name_exists("verl_mm_tools.agent_loop.MMToolAgentLoop")
    assert not dotted_name_exists("verl_mm_tools.agent_loop.NoSuchLoop")
    assert path_exists("tests/test_doc_references_on_cpu.py::test_every_file_module_and_symbol_the_docs_name_exists")
    assert not path_exists("tests/test_doc_references_on_cpu.py::test_that_does_not_exist")
    assert path_exists("plugin.py") and not path_exists("no_such_module.py")
    assert identifier_defined("StopReason", [PACKAGE / "agent_loop" / "state.py"])
    assert not identifier_defined("EXPORTS_GONE", [PACKAGE / "agent_loop" / "state.py"])


def test_contributing_has_a_where_things_go_row_for_each_kind_of_addition():
    """A contributor finds where each kind of addition goes (issue 45): one row each in the "where things go" table."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    table = text[text.index("## Where things go") :]
    kinds = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")}
    expected = {"a tool", "an environment", "a reward", "a model family", "a fix for a verl bug", "an export mode"}
    expected |= {"a metric", "a demo task"}
    assert expected <= kinds, f"docs/contributing.md has no row for {sorted(expected - kinds)}"
