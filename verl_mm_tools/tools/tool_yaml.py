"""verl tool YAML for our tools, as text for verl's loader (``multi_turn.tool_config_path``)."""

# The rotate tool alone: the demo's tasks, the tests and the benchmarks.
ROTATE_TOOLS_YAML = "tools:\n  - class_name: verl_mm_tools.tools.RotateTool\n    config:\n      type: native\n"

# zoom_in alone, its image at 224 px (the tiny processor's largest, so the processor does not resize it again): the
# learn_zoom task zooms its 16 px centre box 14x.
ZOOM_TOOLS_YAML = (
    "tools:\n  - class_name: verl_mm_tools.tools.ZoomInTool\n    config:\n      type: native\n"
    "      target_side: 224\n      max_pixels: 50176\n"
)

# The click tool alone: the demo's GUI task (demo.click_task), one action per episode.
CLICK_TOOLS_YAML = "tools:\n  - class_name: verl_mm_tools.tools.gui_tools.ClickTool\n    config:\n      type: native\n"
GET_FRAMES_TOOLS_YAML = (
    "tools:\n  - class_name: verl_mm_tools.tools.video_tools.GetFramesTool\n    config:\n      type: native\n"
)
