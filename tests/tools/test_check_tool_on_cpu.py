"""check_tool on every shipped tool loaded by verl's YAML loader, on a custom tool, and on broken tools."""

import asyncio
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.tools.tool_registry import initialize_tools_from_config

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.tools import (
    BUILTIN_TOOLS,
    RotateTool,
    ToolCheckError,
    ZoomInConfig,
    acheck_tool,
    check_tool,
)

YAML = Path(__file__).resolve().parents[2] / "examples" / "tools" / "image_tools.yaml"


# ---- the README example (examples/custom/my_tools.py): a custom tool is one pure function plus a small class ------


def _readme_tools():
    """examples/custom/my_tools.py, loaded from its file (not put on sys.path)."""
    spec = importlib.util.spec_from_file_location("readme_my_tools", YAML.parents[1] / "custom" / "my_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GrayscaleTool = _readme_tools().GrayscaleTool


def test_custom_grayscale_tool(make_agent_data, execute):
    tool = GrayscaleTool(config={"type": "native"}, tool_schema=None)
    check_tool(tool)
    response, _, _ = execute(tool, {}, make_agent_data([Image.new("RGB", (40, 30), (255, 0, 0))]))
    assert response.text == "Image 2: Image 1 converted to grayscale, 40x30 px."
    assert (np.asarray(response.image[0]) == 76).all()  # ITU-R 601 luma of pure red


# ---- shipped tools through verl's own loader ----------------------------------------------------------------------


def test_yaml_loads_all_six_tools_and_each_passes_check_tool():
    tools = initialize_tools_from_config(str(YAML))
    assert [type(t) for t in tools] == list(BUILTIN_TOOLS)
    assert [t.name for t in tools] == ["rotate", "flip", "crop", "zoom_in", "draw_bbox", "draw_line"]
    assert tools[3].settings == ZoomInConfig(type="native", max_pixels=1003520, target_side=448)
    for tool in tools:
        check_tool(tool)


def test_yaml_tool_schema_overrides_the_derived_one(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        """
tools:
  - class_name: verl_mm_tools.tools.RotateTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: rotate_image
        description: Turn the picture.
        parameters:
          type: object
          properties:
            degrees: {type: number, description: Counter-clockwise angle.}
            image_id: {type: integer, description: Which image.}
          required: [degrees]
"""
    )
    [tool] = initialize_tools_from_config(str(path))
    assert (tool.name, tool.tool_schema.function.description) == ("rotate_image", "Turn the picture.")
    check_tool(tool)


def test_a_yaml_schema_with_other_parameters_fails_check_tool():
    schema = RotateTool().tool_schema.model_copy(deep=True)
    schema.function.parameters.properties["angle"] = schema.function.parameters.properties.pop("degrees")
    with pytest.raises(ToolCheckError, match="schema parameters \\['angle', 'image_id'\\] differ"):
        check_tool(RotateTool(config=None, tool_schema=schema))


# ---- broken tools are caught ----------------------------------------------------------------------------------------


def _schema(name="broken"):
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "A broken tool.",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "number", "description": "A number."}},
                    "required": ["x"],
                },
            },
        }
    )


class RaisingTool(BaseTool):
    def __init__(self, config=None, tool_schema=None):
        self.config, self.tool_schema, self.name = config, tool_schema or _schema(), "broken"

    async def execute(self, instance_id, parameters, **kwargs):
        x = float(parameters["x"])  # raises on bad input
        return ToolResponse(image=[Image.new("RGB", (8, 8))], text=f"Image 2: x={x}"), 0.0, {}


class TextOnlyTool(RaisingTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="done"), 0.0, {}


class AppendingTool(GrayscaleTool):
    async def execute(self, instance_id, parameters, **kwargs):
        result = await super().execute(instance_id, parameters, **kwargs)
        if result[0].image:
            kwargs["agent_data"].image_data.append(result[0].image[0])
        return result


@pytest.mark.parametrize(
    ("tool", "problems"),
    [
        (
            RaisingTool(),
            [
                "an unknown argument: must be refused as text without an image, got 'Image 2: x=1.0'",
                "no image in the conversation: must be refused",
                "x='ninety': raised ValueError",
                "x=None: raised TypeError",
            ],
        ),
        (TextOnlyTool(), ["must return a list of PIL images", "the text must start with 'Image 2:'"]),
        (AppendingTool(), ["execute must not add images to the workspace itself"]),
    ],
)
def test_check_tool_reports_every_problem(tool, problems):
    with pytest.raises(ToolCheckError) as error:
        check_tool(tool, {"x": 1} if isinstance(tool, RaisingTool) else None)
    for problem in problems:
        assert problem in str(error.value)


def test_check_tool_rejects_bad_names():
    tool = TextOnlyTool(tool_schema=_schema("has space"))
    with pytest.raises(ToolCheckError, match="name must match"):
        check_tool(tool)


def test_check_tool_inside_a_running_loop_points_to_acheck_tool():
    async def inside():
        with pytest.raises(RuntimeError, match="await acheck_tool"):
            check_tool(RotateTool())
        await acheck_tool(RotateTool())

    asyncio.run(inside())


def test_the_readme_tool_passes_and_the_report_lists_what_was_checked():
    lines = str(check_tool(GrayscaleTool())).splitlines()
    assert lines[0] == "tool 'to_grayscale': 16 checks passed"
    assert lines[2] == (
        "  ok  a valid call {} on a 64x48 image returns images within max_pixels and a text starting "
        "'Image 2:', leaving the workspace to the loop"
    )
    assert "  ok  bad input answered as text: image_id 99 of 1 image" in lines


def test_a_tool_class_whose_schema_cannot_be_built_is_reported_as_a_problem():
    """A docstring without ``Args:``: transformers' get_json_schema fails at construction; check_tool says why."""
    from verl_mm_tools.tools import ImageTool

    def undocumented(factor: float) -> None:
        """Brighten the image."""

    class Undocumented(ImageTool):
        schema_fn = undocumented

        def apply(self, image, **arguments):
            return image

    with pytest.raises(ToolCheckError) as raised:
        check_tool(Undocumented)
    assert str(raised.value).startswith(
        "tool 'Undocumented' fails check_tool:\n- the tool cannot be built: the tool schema cannot be built from "
        f"{__name__}.test_a_tool_class_whose_schema_cannot_be_built_is_reported_as_a_problem.<locals>.undocumented ("
    )
    assert "an 'Args:' section describing every parameter" in str(raised.value)
    assert check_tool(RotateTool).checks  # a class that builds is checked as its instance


def test_verls_tool_loader_says_which_schema_function_cannot_be_read(tmp_path, monkeypatch):
    """The same tool listed in a tool YAML: verl's loader builds it, and the error names the function and the fix
    (not transformers' docstring exception)."""
    module = tmp_path / "undocumented_tools.py"
    module.write_text(
        "from verl_mm_tools.tools import ImageTool\n\n\n"
        "def brighten(factor: float) -> None:\n"
        '    """Brighten the image."""\n\n\n'
        "class BrightenTool(ImageTool):\n"
        "    schema_fn = brighten\n\n"
        "    def apply(self, image, **arguments):\n"
        "        return image\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: undocumented_tools.BrightenTool\n    config: {type: native}\n")
    with pytest.raises(ConfigError, match=r"^the tool schema cannot be built from undocumented_tools\.brighten \("):
        initialize_tools_from_config(str(path))
