"""Image tools for verl: thin ``BaseTool`` adapters over ``verl_mm_tools.ops``.

Load them with verl's own YAML loader (``class_name: verl_mm_tools.tools.RotateTool``, ``config: {type: native}``;
``tool_schema`` may be omitted), see ``examples/tools/image_tools.yaml``. Write a new one as a pure function plus
a small ``ImageTool`` subclass, and check it with ``check_tool``.
"""

from verl_mm_tools.tools.base import ImageTool, ImageToolConfig, build_schema
from verl_mm_tools.tools.check import ToolCheckError, acheck_tool, check_tool
from verl_mm_tools.tools.image_tools import (
    CropTool,
    DrawBBoxTool,
    DrawLineTool,
    FlipTool,
    RotateConfig,
    RotateTool,
    ZoomInConfig,
    ZoomInTool,
)
from verl_mm_tools.tools.python_tool import PythonTool, PythonToolConfig
from verl_mm_tools.tools.video_tools import ClipConfig, ClipTool, GetFramesConfig, GetFramesTool

BUILTIN_TOOLS = (RotateTool, FlipTool, CropTool, ZoomInTool, DrawBBoxTool, DrawLineTool)

__all__ = [
    "BUILTIN_TOOLS",
    "ClipConfig",
    "ClipTool",
    "CropTool",
    "DrawBBoxTool",
    "DrawLineTool",
    "FlipTool",
    "GetFramesConfig",
    "GetFramesTool",
    "ImageTool",
    "ImageToolConfig",
    "PythonTool",
    "PythonToolConfig",
    "RotateConfig",
    "RotateTool",
    "ToolCheckError",
    "ZoomInConfig",
    "ZoomInTool",
    "acheck_tool",
    "build_schema",
    "check_tool",
]
