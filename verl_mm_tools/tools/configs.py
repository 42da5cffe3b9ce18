"""verl tool YAML for our tools, as text for verl's loader (``multi_turn.tool_config_path``)."""

# The rotate tool alone: the demo's tasks, the tests and the benchmarks.
ROTATE_TOOLS_YAML = "tools:\n  - class_name: verl_mm_tools.tools.RotateTool\n    config:\n      type: native\n"
