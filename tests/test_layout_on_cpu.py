"""The package's layout, read from its source with ``ast`` (nothing is imported): the import graph (modules as nodes,
every import an edge: top-level, function-level and ``TYPE_CHECKING`` ones) has no cycle, no module imports one from
a layer above its own, and no module passes 500 lines."""

from __future__ import annotations

import ast

import pytest

from verl_mm_tools.adaptations.import_graph import MODULES, PACKAGE, our_imports

MAX_LINES = 500
# the state machine stays readable: its parts live beside it (``agent_loop/*``), not in it
LOOP_MODULE, LOOP_MAX_LINES = "verl_mm_tools.agent_loop.mm_tool_loop", 400

# Lowest first: a module may import from its own layer and the ones before it. A module belongs to the longest
# prefix listed (``verl_mm_tools.cpu.vllm_cpu`` is in ``cpu``'s layer unless it has its own entry).
LAYERS: list[set[str]] = [
    # the light base: errors, file access, the record, the loop's hand-off and the step metrics, token ids, the
    # compact image form, the pure image ops, the model families' records, the subprocess supervisor, the vLLM
    # settings (``cpu.vllm_cpu``: the vLLM plugin reads them in every engine process, so they sit far below the rest
    # of the CPU backend), and the adaptations' records and their guard (no verl import: the loop, the step hooks and
    # the runtime check the verl code they subclass or copy through them)
    {
        "errors",
        "files",
        "video",  # untrusted video files read with PyAV (the loop's prompt videos and qwen-vl-utils' reader)
        "workspace",
        "record",
        "image_window",  # which images a conversation keeps in context (the loop, rescore and export-sft)
        "handoff",  # what the loop hands the trainer, typed
        "step_metrics",  # the step metrics the step hook and eval's report compute from it
        "tokens",
        "compact_form",  # what the compact forms of images and videos share
        "compact_image",
        "compact_video",  # a prompt video's compact form (the frames its processor saw, as uint8)
        "ops",
        "check_report",
        "cli_types",
        "verl_registry",
        "adaptations.record",  # the adaptations' record type (the import hooks declare theirs)
        "adaptations.import_order",  # the import hooks: the package's __init__ and verl_registry's lazy registrations
        "adaptations.import_graph",  # the import graph (this test reads it) and the light modules it finds
        "adaptations.light_modules",
        "envs.gui.screen",  # what GUI environments and the GUI tools share (actions, the page map): pure
        "judge.context",  # what a judge sees of a trajectory: the loop hands it over (``handoff``), PIL only
        "envs.gui.tasks",  # the MiniWoB task names (the data writer checks them), found without importing miniwob
    },
    {"sandbox"},  # the python tool's sandbox: bubblewrap, the kernel script, the host's side (no verl, no torch)
    {"families", "supervise", "cpu.vllm_cpu", "adaptations.guard", "adaptations.touchpoints"},
    {"tools", "rewards", "judge", "data", "tiny", "parsers"},
    {"remote"},  # tools on Ray actor pools
    {"envs"},  # environments (a remote environment runs on the pools)
    {"agent_loop"},
    {"step_hook"},
    # verl's and vLLM's adaptations: the graph puts them here. They reach down into remote tools (verl's tool
    # loader learns them), the Gemma 4 parser and the vLLM settings; the CPU backend and the plugin apply them (the
    # package's __init__ installs only their import-order hook). Nothing of the loop or the hook imports them but
    # their records and guard (above).
    {"adaptations"},
    {"cpu"},  # the CPU backend (platform, hf rollout server)
    # verl's entry point: it registers the loop (by name), the reward managers and the CPU backend and applies the
    # adaptations, so it sits above them; the runtime, the test kit and the commands read its names
    {"plugin"},
    {"runtime"},
    {"testkit"},
    {"evaluate", "trajectories", "viewer"},
    {"demo", "bench"},
    # every row, collected from where each is declared, and its rendering
    {"cli", "adaptations.registry", "adaptations.inventory"},
    {""},  # the package's own __init__ (it only sets up the import order)
]


GRAPH = {module: our_imports(module) for module in MODULES}  # imports anywhere in the source, functions included


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> int:
    relative = module[len(PACKAGE) + 1 :] if module != PACKAGE else ""
    best, best_length = None, -1
    for number, names in enumerate(LAYERS):
        for name in names:
            matches = relative == name or (name and relative.startswith(name + "."))
            if matches and len(name) > best_length:
                best, best_length = number, len(name)
    if best is None:
        raise AssertionError(f"{module} has no layer: add its package or module to LAYERS in {__file__}")
    return best


def test_the_import_graph_has_no_cycle():
    found = cycles(GRAPH)
    assert found == [], "import cycles (modules of each): " + "; ".join(" <-> ".join(cycle) for cycle in found)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_one_from_a_layer_above_its_own(module):
    above = sorted(target for target in GRAPH[module] if layer_of(target) > layer_of(module))
    assert above == [], f"{module} (layer {layer_of(module)}) imports from higher layers: {above}"


def test_no_module_passes_500_lines_and_the_loop_400():
    lengths = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in MODULES.items()}
    too_long = {module: lines for module, lines in lengths.items() if lines > MAX_LINES}
    assert too_long == {}, f"modules over {MAX_LINES} lines (split them): {too_long}"
    assert lengths[LOOP_MODULE] <= LOOP_MAX_LINES, f"the loop module has {lengths[LOOP_MODULE]} lines: move a part out"


# The test kit stands in for parts of a run (a scripted server a model answers, marked images, sample dumps) for the
# tests; a command the user runs needs none of it: what the demo runs (its rollouts, scripted demonstrations, Ray
# nodes) is the runtime's.
DEMO, TESTKIT = f"{PACKAGE}.demo", f"{PACKAGE}.testkit"


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_demo_module_imports_the_test_kit():
    demo_modules = [module for module in GRAPH if in_package(module, DEMO)]
    assert demo_modules, f"no module of {DEMO} found"
    found = {
        module: sorted(target for target in GRAPH[module] if in_package(target, TESTKIT)) for module in demo_modules
    }
    found = {module: targets for module, targets in found.items() if targets}
    assert found == {}, f"demo modules import the test kit (move what they need into a product module): {found}"


# the keys of what the loop hands the trainer and the step metrics' names: defined once, in these two modules
KEY_MODULES = {f"{PACKAGE}.handoff", f"{PACKAGE}.step_metrics"}


def test_no_module_but_the_hand_off_and_the_step_metrics_spells_an_mm_tool_key():
    spelled = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            parts = node.values if isinstance(node, ast.JoinedStr) else [node]
            first = parts[0] if parts else None
            key = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
            if key.startswith("mm_tool/") and " " not in key and module not in KEY_MODULES:
                spelled.append(f"{module}:{node.lineno} {key!r}")
    assert spelled == [], "use handoff.SampleFields (a field) or a step_metrics name: " + ", ".join(spelled)
