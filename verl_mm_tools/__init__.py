"""verl-mm-tools: multimodal multi-turn tool use for verl, as a plugin."""

from verl_mm_tools.import_order import import_first

__version__ = "0.1.0"

# What the CLI needs to parse its arguments; none of them imports verl (tests/test_cli_on_cpu.py checks it).
LIGHT_MODULES = frozenset({
    "verl_mm_tools.arguments",
    "verl_mm_tools.cli",
    "verl_mm_tools.data",
    "verl_mm_tools.data.command",
    "verl_mm_tools.errors",
    "verl_mm_tools.import_order",
    "verl_mm_tools.tiny",
    "verl_mm_tools.tiny.builder",
    "verl_mm_tools.tiny.corpus",
    "verl_mm_tools.viewer",
    "verl_mm_tools.viewer.command",
})

# Every other module of ours is run after verl has been imported (and has loaded our plugin): see import_order.py.
import_first("verl", "verl_mm_tools", LIGHT_MODULES)
