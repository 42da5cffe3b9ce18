"""The six tools executed with verl's AgentData: image resolution, exact answers, refusals, config, schemas."""

import json
import logging

import numpy as np
import pytest
from PIL import Image
from verl.tools.schemas import ToolResponse

from verl_mm_tools import ops
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.files import FileRoots
from verl_mm_tools.tools import (
    CropTool,
    DrawBBoxTool,
    DrawLineTool,
    FlipTool,
    ImageTool,
    RotateConfig,
    RotateTool,
    ZoomInConfig,
    ZoomInTool,
)
from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

RED = (255, 0, 0)


def red_bbox(image):
    ys, xs = np.nonzero((np.asarray(image) == RED).all(-1))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


# Image 1 is a 64x48 black image with a red square at (8, 4, 24, 20); Image 2 is a 40x30 gray image.
ON_IMAGE_1 = [
    (RotateTool, {"degrees": 90}, "Image 1 rotated by 90 degrees counter-clockwise, 48x64 px.", (4, 40, 20, 56)),
    (RotateTool, {"degrees": -90.0}, "Image 1 rotated by -90 degrees counter-clockwise, 48x64 px.", (28, 8, 44, 24)),
    (
        FlipTool,
        {"direction": "horizontal"},
        "Image 1 flipped horizontally (left and right swapped), 64x48 px.",
        (40, 4, 56, 20),
    ),
    (
        FlipTool,
        {"direction": "vertical"},
        "Image 1 flipped vertically (top and bottom swapped), 64x48 px.",
        (8, 28, 24, 44),
    ),
    (
        CropTool,
        {"x1": 4, "y1": 2, "x2": 44, "y2": 40},
        "Image 1 cropped to box (4, 2, 44, 40), 40x38 px.",
        (4, 2, 20, 18),
    ),
    (
        CropTool,
        {"x1": -4, "y1": 0, "x2": 40, "y2": 100},
        "Image 1 cropped to box (0, 0, 40, 48) (requested (-4, 0, 40, 100), clipped to the image), 40x48 px.",
        (8, 4, 24, 20),
    ),
    (
        ZoomInTool,
        {"x1": 8, "y1": 4, "x2": 24, "y2": 20},
        "Image 1 zoomed in on box (8, 4, 24, 20), 448x448 px.",
        (0, 0, 448, 448),
    ),
]


@pytest.mark.parametrize(("tool_cls", "arguments", "what", "square"), ON_IMAGE_1)
def test_tool_on_selected_image(tool_cls, arguments, what, square, make_agent_data, two_images, execute):
    agent_data = make_agent_data(two_images)
    response, reward, metrics = execute(tool_cls(), {**arguments, "image_id": 1}, agent_data)
    assert response.text == f"Image 3: {what}"
    assert (reward, metrics) == (0.0, {})
    assert len(response.image) == 1 and response.image[0].mode == "RGB"
    assert red_bbox(response.image[0]) == square
    assert len(agent_data.image_data) == 2  # the agent loop, not the tool, adds the new image


@pytest.mark.parametrize(("tool_cls", "arguments", "what", "square"), ON_IMAGE_1)
def test_tool_defaults_to_the_latest_image(tool_cls, arguments, what, square, make_agent_data, two_images, execute):
    response, _, _ = execute(tool_cls(), arguments, make_agent_data(two_images[::-1]))
    assert response.text == f"Image 3: {what.replace('Image 1', 'Image 2', 1)}"
    assert red_bbox(response.image[0]) == square


def test_draw_tools_draw_on_the_selected_image(make_agent_data, two_images, execute):
    agent_data = make_agent_data(two_images)
    response, _, _ = execute(
        DrawBBoxTool(), {"x1": 2, "y1": 2, "x2": 12, "y2": 12, "color": "blue", "width": 1, "image_id": 1}, agent_data
    )
    assert response.text == "Image 3: Image 1 with a blue box drawn at (2, 2, 12, 12), 64x48 px."
    assert int((np.asarray(response.image[0]) == (0, 0, 255)).all(-1).sum()) == 36
    response, _, _ = execute(DrawLineTool(), {"x1": 0, "y1": 29, "x2": 39, "y2": 29, "width": 1}, agent_data)
    assert response.text == "Image 3: Image 2 with a red line drawn from (0, 29) to (39, 29), 40x30 px."
    assert int((np.asarray(response.image[0]) == RED).all(-1).sum()) == 40


def test_label_is_reported_as_drawn(make_agent_data, two_images, execute):
    arguments = {"x1": 2, "y1": 20, "x2": 30, "y2": 28, "label": " cat\n狗 "}
    response, _, _ = execute(DrawBBoxTool(), arguments, make_agent_data(two_images))
    assert response.text == "Image 3: Image 2 with a red box drawn at (2, 20, 30, 28) labeled 'cat??', 40x30 px."


def test_fractional_boxes_are_reported_as_rounded(make_agent_data, two_images, execute):
    response, _, _ = execute(CropTool(), {"x1": 0.5, "y1": 1, "x2": 30.2, "y2": 29}, make_agent_data(two_images))
    assert response.text == (
        "Image 3: Image 2 cropped to box (0, 1, 31, 29) (requested (0.5, 1, 30.2, 29), rounded outward to whole "
        "pixels), 31x28 px."
    )


def test_ids_follow_the_mm_tool_workspace(make_agent_data, two_images, execute):
    agent_data = make_agent_data([])
    attach_tool_context(
        agent_data, ToolContext(ImageWorkspace(list(two_images) + [Image.new("RGB", (30, 30))]), FileRoots())
    )
    response, _, _ = execute(FlipTool(), {"direction": "vertical", "image_id": 1}, agent_data)
    assert response.text == "Image 4: Image 1 flipped vertically (top and bottom swapped), 64x48 px."


def test_plain_namespace_and_tool_agent_without_images(execute):
    response, reward, metrics = execute(RotateTool(), {"degrees": 90}, None)
    message = "there is no image in this conversation yet, so there is nothing to operate on"
    assert response.text == f"Error from rotate: {message}"
    assert (response.image, reward, metrics) == (None, 0.0, {"error": message})


@pytest.mark.parametrize(
    ("tool_cls", "arguments", "message"),
    [
        (RotateTool, {"degrees": 720}, "degrees must be between -360 and 360, got 720"),
        (RotateTool, {"degrees": "90"}, "degrees must be a number, got '90' (a string)"),
        (RotateTool, {"degrees": 90, "image_id": 3}, "image_id must be between 1 and 2, got 3"),
        (RotateTool, {"degrees": 90, "image_id": True}, "image_id must be a whole number, got True (a boolean)"),
        (
            RotateTool,
            {"angle": 90},
            "unknown argument 'angle'. rotate takes: degrees (number, required), image_id (integer, optional)",
        ),
        (
            FlipTool,
            {"direction": "horizontaly"},
            "direction must be one of ['horizontal', 'vertical'], got 'horizontaly'. Did you mean 'horizontal'?",
        ),
        (
            CropTool,
            {"x1": 50, "y1": 0, "x2": 60, "y2": 10},
            "the box (50, 0, 60, 10) lies outside the image, which is 40x30 px",
        ),
        (
            ZoomInTool,
            {"x1": 10, "y1": 0, "x2": 5, "y2": 10},
            "x2 must be greater than x1 (the box's right edge), got x1=10, x2=5",
        ),
        (DrawBBoxTool, {"x1": 0, "y1": 0, "x2": 5, "y2": 5, "width": 0}, "width must be between 1 and 32, got 0"),
        (DrawLineTool, {"x1": 0, "y1": 0, "x2": 0, "y2": 0}, "a line needs two different end points, got (0, 0) twice"),
    ],
)
def test_invalid_calls_are_answered_as_text(tool_cls, arguments, message, make_agent_data, two_images, execute):
    tool = tool_cls()
    response, reward, metrics = execute(tool, arguments, make_agent_data(two_images))
    assert response.text.startswith(f"Error from {tool.name}: {message}")
    assert (response.image, reward) == (None, 0.0)
    assert metrics["error"].startswith(message)


def test_internal_failures_are_answered_and_logged(make_agent_data, two_images, execute, caplog):
    class Broken(RotateTool):
        def apply(self, image, degrees):
            raise ZeroDivisionError("boom")

    with caplog.at_level(logging.ERROR, logger="verl_mm_tools.tools.base"):
        response, reward, metrics = execute(Broken(), {"degrees": 1}, make_agent_data(two_images))
    message = "the tool failed internally (ZeroDivisionError); try other arguments"
    assert (response.text, reward, metrics) == (f"Error from rotate: {message}", 0.0, {"error": message})
    assert "rotate failed on arguments {'degrees': 1}" in caplog.text


def test_tools_never_modify_workspace_images(make_agent_data, two_images, execute):
    before = [np.asarray(image).copy() for image in two_images]
    agent_data = make_agent_data(two_images)
    execute(DrawBBoxTool(), {"x1": 0, "y1": 0, "x2": 30, "y2": 30, "label": "x"}, agent_data)
    execute(DrawLineTool(), {"x1": 0, "y1": 0, "x2": 30, "y2": 30, "image_id": 1}, agent_data)
    assert all(
        np.array_equal(np.asarray(a), b) for a, b in zip(agent_data.image_data, before, strict=False)
    )  # new images follow


def test_output_never_exceeds_max_pixels(make_agent_data, execute):
    images = [Image.new("RGB", (1000, 800), "white")]
    tool = ZoomInTool(config={"type": "native", "max_pixels": 40_000, "target_side": 4096})
    response, _, _ = execute(tool, {"x1": 0, "y1": 0, "x2": 2, "y2": 1}, make_agent_data(images))
    assert response.image[0].size == (283, 141)  # 39903 px: the 2:1 box at the largest size under 40000
    assert response.text == "Image 2: Image 1 zoomed in on box (0, 0, 2, 1), 283x141 px."
    flip = FlipTool(config={"max_pixels": 40_000})
    response, _, _ = execute(flip, {"direction": "vertical"}, make_agent_data(images))
    assert response.image[0].size == (223, 178)


def test_non_rgb_inputs_give_rgb_outputs(make_agent_data, execute):
    for mode in ("L", "RGBA", "P", "I;16"):
        response, _, _ = execute(RotateTool(), {"degrees": 45}, make_agent_data([Image.new(mode, (40, 30))]))
        assert response.image[0].mode == "RGB", mode


@pytest.mark.parametrize(
    ("tool_cls", "config", "message"),
    [
        (RotateTool, {"max_pixel": 10}, "RotateConfig: unknown config key 'max_pixel'. Did you mean 'max_pixels'?"),
        (RotateTool, {"max_pixels": 10}, "max_pixels must be between 39200 and 67108864, got 10"),
        (RotateTool, {"max_pixels": True}, "RotateConfig: max_pixels must be a int, got True"),
        (FlipTool, {"max_pixels": "1e6"}, "ImageToolConfig: max_pixels must be a int, got '1e6'"),
        (RotateTool, {"resample": "cubic"}, "resample must be one of ['bicubic', 'bilinear', 'nearest'], got 'cubic'"),
        (ZoomInTool, {"target_side": 10}, "target_side must be between 28 and 8192, got 10"),
        (ZoomInTool, {"target": 10}, "ZoomInConfig: unknown config key 'target'. Did you mean 'target_side'?"),
    ],
)
def test_config_errors_name_the_problem(tool_cls, config, message):
    with pytest.raises(ConfigError) as error:
        tool_cls(config=config, tool_schema=None)
    assert str(error.value).startswith(message)


def test_rotate_config_picks_the_interpolation(make_agent_data, execute):
    image = Image.new("RGB", (60, 40), "white")
    image.paste((255, 0, 0), (10, 10, 30, 30))
    tool = RotateTool(config={"resample": "nearest"}, tool_schema=None)
    assert tool.settings == RotateConfig(type="native", max_pixels=1280 * 28 * 28, resample="nearest")
    response, _, _ = execute(tool, {"degrees": 30}, make_agent_data([image]))
    assert response.image[0].tobytes() == ops.rotate(image, 30, resample="nearest").tobytes()
    assert response.image[0].tobytes() != ops.rotate(image, 30).tobytes()  # bicubic by default


def test_config_is_parsed_once_into_a_frozen_dataclass():
    tool = ZoomInTool(config={"type": "native", "target_side": 224}, tool_schema=None)
    assert tool.settings == ZoomInConfig(type="native", max_pixels=1280 * 28 * 28, target_side=224)
    with pytest.raises(AttributeError):
        tool.settings.target_side = 1


def test_rotate_schema_is_derived_from_the_schema_function():
    schema = RotateTool().tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert schema == {
        "type": "function",
        "function": {
            "name": "rotate",
            "description": "Rotate an image counter-clockwise by any angle; the canvas grows to keep the whole "
            "image, corners are black.",
            "parameters": {
                "type": "object",
                "properties": {
                    "degrees": {
                        "type": "number",
                        "description": "Angle in degrees between -360 and 360; positive turns counter-clockwise, "
                        "negative clockwise.",
                    },
                    "image_id": {
                        "type": "integer",
                        "description": "Number of the image to rotate (Image 1 is the first image). "
                        "Default: the latest image.",
                    },
                },
                "required": ["degrees"],
            },
        },
    }
    json.dumps(schema)


def test_every_tool_has_a_distinct_name_and_no_newlines_in_descriptions():
    tools = [cls() for cls in (RotateTool, FlipTool, CropTool, ZoomInTool, DrawBBoxTool, DrawLineTool)]
    assert [t.name for t in tools] == ["rotate", "flip", "crop", "zoom_in", "draw_bbox", "draw_line"]
    assert "\n" not in json.dumps([t.tool_schema.model_dump() for t in tools])
    assert DrawBBoxTool().tool_schema.function.parameters.properties["color"].enum[:3] == ["red", "green", "blue"]


def test_base_tool_apply_must_be_implemented(make_agent_data, two_images, execute):
    def noop(image_id: int | None = None):
        """Do nothing.

        Args:
            image_id: The image.
        """

    class Lazy(ImageTool):
        schema_fn = noop

    response, _, _ = execute(Lazy(), {}, make_agent_data(two_images))
    assert response.text == "Error from noop: the tool failed internally (NotImplementedError); try other arguments"
    assert isinstance(response, ToolResponse)


def test_a_tool_without_schema_function_fails_at_construction():
    class Nameless(ImageTool):
        def apply(self, image):
            return image, "unchanged"

    with pytest.raises(TypeError, match="Nameless must set schema_fn"):
        Nameless()
