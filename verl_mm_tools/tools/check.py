"""``check_tool``: does a tool keep the image-tool contract?

``check_tool(tool)`` is synchronous (it runs its own event loop); from async code use ``await acheck_tool(tool)``.
Both raise ``ToolCheckError`` listing every problem found, and return what they checked (a ``CheckReport``; print
it) when the tool conforms:

* schema: a valid OpenAI function schema whose name is the tool's ``name`` (``[A-Za-z0-9_-]{1,64}``), with a
  description, object parameters, known JSON types, ``required`` a subset of the properties, and (for an
  ``ImageTool``) exactly the parameters of its schema function;
* a valid call (``arguments``, default ``tool.example_arguments``) on a 64x48 probe image returns
  ``(ToolResponse, float reward, dict metrics)`` with a list of PIL images no larger than the tool's
  ``settings.max_pixels``, a text starting with ``"Image 2:"``, and leaves the workspace unchanged;
* bad input (an unknown argument, a missing image, ``image_id`` 99, hostile values for every parameter) is
  answered as text, without images and without raising.

A video tool (one with a ``video_id`` parameter, e.g. ``get_frames``) gets a probe video of 4 frames of the probe
image's size, 0.5 s apart, as the conversation's Video 1; its bad input includes a conversation without videos and
``video_id`` 99. A tool that answers with a video (``clip``; ``answers_with = "video"``) must return one in verl's form,
``ToolResponse(video=[(frames, metadata)])``: a float T x 3 x H x W tensor of whole numbers 0-255, 2 frames or more,
within ``settings.max_pixels``, with qwen-vl-utils' metadata (``fps``, ``frames_indices`` of each frame,
``total_num_frames``), and a text starting ``"Video 2:"``; refusals carry neither images nor a video.

A GUI tool (``gui_tools.ScreenTool``) acts on an environment's page: ``verl_mm_tools.envs.check_gui_tool(tool,
env)`` resets ``env`` (any ``ScreenEnvironment``, e.g. ``MiniWoBEnv("click-test")``), runs these checks on its
screenshot in place of the 64x48 image (``acheck_tool``'s ``probe`` and ``screen``), and closes it.
"""

from __future__ import annotations

import asyncio
import math
import re
import types
from typing import Any, cast

from PIL import Image
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_mm_tools.check_report import CheckReport
from verl_mm_tools.errors import ConfigError, VerlMMToolsError
from verl_mm_tools.files import STATE_ATTR, FileRoots
from verl_mm_tools.tools.gui_tools import ScreenTool
from verl_mm_tools.video import VideoSource
from verl_mm_tools.workspace import ImageWorkspace

PROBE_SIZE = (64, 48)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object", "null"}
_HOSTILE_VALUES = (None, "", "ninety", math.nan, math.inf, -1e308, 10**30, -1, True, [1, 2], {"a": 1})


class ToolCheckError(VerlMMToolsError, AssertionError):
    """A tool does not keep the image-tool contract; the message lists every problem."""


def probe_image() -> Image.Image:
    """A 64x48 RGB gradient, different in every pixel row and column."""
    image = Image.new("RGB", PROBE_SIZE)
    image.putdata([(4 * x, 5 * y, 128) for y in range(PROBE_SIZE[1]) for x in range(PROBE_SIZE[0])])
    return image


def probe_video() -> VideoSource:
    """4 frames of the probe image's size, 0.5 s apart, each a different grey."""
    return VideoSource(frames=tuple(Image.new("RGB", PROBE_SIZE, (60 * i,) * 3) for i in range(4)), fps=2.0)


def takes_video(tool: BaseTool) -> bool:
    return "video_id" in tool.tool_schema.function.parameters.properties


def schema_problems(tool: object) -> list[str]:
    """Problems with a tool's name and OpenAI schema."""
    schema = getattr(tool, "tool_schema", None)
    if not isinstance(schema, OpenAIFunctionToolSchema):
        return [f"tool_schema must be an OpenAIFunctionToolSchema, got {type(schema).__name__}"]
    function, problems = schema.function, []
    if schema.type != "function":
        problems.append(f"tool_schema.type must be 'function', got {schema.type!r}")
    if not _NAME.match(function.name) or getattr(tool, "name", None) != function.name:
        problems.append(f"name must match {_NAME.pattern} and equal tool.name, got {function.name!r}")
    if not function.description.strip():
        problems.append("the schema has no description")
    parameters = function.parameters
    if parameters.type != "object":
        problems.append(f"parameters.type must be 'object', got {parameters.type!r}")
    for name, prop in parameters.properties.items():
        kinds = {prop.type} if isinstance(prop.type, str) else set(prop.type)
        if not kinds <= _JSON_TYPES or not prop.description:
            problems.append(f"parameter {name!r} needs a JSON type and a description, got {prop.model_dump()}")
    if missing := set(parameters.required) - set(parameters.properties):
        problems.append(f"required names unknown parameters: {sorted(missing)}")
    if OpenAIFunctionToolSchema.model_validate(schema.model_dump()) != schema:
        problems.append("the schema does not survive a model_dump/model_validate round trip")
    spec = getattr(tool, "arguments", None)
    if spec is not None and set(spec.parameters) != set(parameters.properties):
        problems.append(f"schema parameters {sorted(parameters.properties)} differ from the schema function's")
    return problems


async def _call(
    tool: BaseTool,
    arguments: dict[str, Any],
    images: list[Image.Image],
    screen: object | None = None,
    videos: list[VideoSource] | None = None,
) -> object:
    agent_data = types.SimpleNamespace(image_data=images)
    if screen is not None or videos is not None:  # what a GUI or video tool reads: the environment, the videos
        context = types.SimpleNamespace(workspace=ImageWorkspace(images), files=FileRoots(), env=screen, videos=videos)
        setattr(agent_data, STATE_ATTR, context)
    instance_id, _ = await tool.create()
    try:
        return await tool.execute(instance_id, arguments, agent_data=agent_data)
    finally:
        await tool.release(instance_id)


async def valid_call_problems(
    tool: BaseTool, arguments: dict[str, Any], probe: Image.Image | None = None, screen: object | None = None
) -> list[str]:
    """Problems with the answer to a valid call on the probe image (a GUI tool's: its environment's screenshot)."""
    images = [probe or probe_image()]
    try:
        result = await _call(tool, arguments, images, screen, [probe_video()] if takes_video(tool) else None)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return [f"a valid call {arguments} raised {type(error).__name__}: {error}"]
    if not (isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], ToolResponse)):
        return [f"execute must return (ToolResponse, reward, metrics), got {result!r:.200}"]
    response, reward, metrics = result
    problems = []
    if not isinstance(reward, (int, float)) or not isinstance(metrics, dict):
        problems.append(f"reward must be a number and metrics a dict, got {reward!r} and {metrics!r}")
    if response.video is not None:  # a tool that answers with a video (``clip``)
        return problems + video_answer_problems(tool, arguments, response) + _workspace_problems(images)
    if not response.image or not all(isinstance(image, Image.Image) for image in response.image):
        problems.append(f"a valid call {arguments} must return a list of PIL images, got {response!r:.300}")
    elif (limit := getattr(getattr(tool, "settings", None), "max_pixels", None)) is not None:
        oversized = [f"{i.width}x{i.height}" for i in response.image if i.width * i.height > limit]
        if oversized:
            problems.append(f"images of {oversized} px exceed max_pixels {limit}")
    if not (response.text or "").startswith("Image 2:"):
        problems.append(f"the text must start with 'Image 2:' (the new image's id), got {response.text!r}")
    return problems + _workspace_problems(images)


def _workspace_problems(images: list[Image.Image]) -> list[str]:
    return [] if len(images) == 1 else ["execute must not add images to the workspace itself (the agent loop does)"]


def _max_pixels(tool: BaseTool) -> float:
    limit = getattr(getattr(tool, "settings", None), "max_pixels", None)
    return math.inf if limit is None else limit


def video_answer_problems(tool: BaseTool, arguments: dict[str, Any], response: ToolResponse) -> list[str]:
    """Problems with a valid call's video answer: one video in verl's form, (frames, metadata), whose frames are a
    float T x C x H x W tensor of whole numbers 0-255 (qwen-vl-utils' form), at least 2, no larger than the tool's
    ``settings.max_pixels``, timed by qwen-vl-utils' metadata; its text names it ``Video 2`` (the probe video is 1)."""
    import torch

    videos = response.video if isinstance(response.video, list) else [response.video]
    shape = "a list of one (frames, metadata) video"
    if len(videos) != 1 or not (isinstance(videos[0], tuple) and len(videos[0]) == 2):
        return [f"a valid call {arguments} must return {shape}, got {response.video!r:.300}"]
    frames, metadata = videos[0]
    problems = []
    if not (isinstance(frames, torch.Tensor) and frames.ndim == 4 and frames.shape[1] == 3 and len(frames) >= 2):
        problems.append(f"the frames must be a T x 3 x H x W tensor of 2 frames or more, got {frames!r:.200}")
    elif not (frames.is_floating_point() and torch.equal(frames, frames.round().clamp(0, 255))):
        problems.append(f"the frames must be float whole numbers in 0..255 (qwen-vl-utils' form), got {frames.dtype}")
    elif frames.shape[2] * frames.shape[3] > _max_pixels(tool):
        problems.append(f"frames of {frames.shape[3]}x{frames.shape[2]} px exceed max_pixels {_max_pixels(tool)}")
    keys = ("fps", "frames_indices", "total_num_frames")
    if not isinstance(metadata, dict) or any(key not in metadata for key in keys):
        problems.append(f"the metadata must hold {list(keys)} (qwen-vl-utils'), got {metadata!r:.200}")
    elif isinstance(frames, torch.Tensor) and len(metadata["frames_indices"]) != len(frames):
        problems.append(f"frames_indices names {len(metadata['frames_indices'])} frames for {len(frames)} frames")
    if not (response.text or "").startswith("Video 2:"):
        problems.append(f"the text must start with 'Video 2:' (the new video's id), got {response.text!r}")
    return problems


def _bad_calls(
    tool: BaseTool, arguments: dict[str, Any], probe: Image.Image | None = None
) -> list[tuple[str, dict[str, Any], list, list[VideoSource] | None, bool]]:
    """(what, arguments, images, videos, must_refuse) for each bad input."""
    probe = probe or probe_image()
    properties = tool.tool_schema.function.parameters.properties
    videos = [probe_video()] if takes_video(tool) else None
    calls = [
        ("an unknown argument", {**arguments, "no_such_argument": 1}, [probe], videos, True),
        ("no image in the conversation", arguments, [], videos, not videos),
    ]
    if "image_id" in properties:
        calls.append(("image_id 99 of 1 image", {**arguments, "image_id": 99}, [probe], videos, True))
    if videos:
        calls.append(("no video in the conversation", arguments, [probe], [], True))
        calls.append(("video_id 99 of 1 video", {**arguments, "video_id": 99}, [probe], videos, True))
    for name in properties:
        calls += [
            (f"{name}={value!r}", {**arguments, name: value}, [probe], videos, False) for value in _HOSTILE_VALUES
        ]
    return calls


async def bad_input_problems(
    tool: BaseTool, arguments: dict[str, Any], probe: Image.Image | None = None, screen: object | None = None
) -> list[str]:
    """Problems with the answers to bad input: each must be a text ToolResponse; refusals carry no image."""
    problems = []
    for what, call_arguments, images, videos, must_refuse in _bad_calls(tool, arguments, probe):
        try:
            result = await _call(tool, call_arguments, images, screen, videos)
        except Exception as error:  # noqa: BLE001 - reported, not raised
            problems.append(f"{what}: raised {type(error).__name__}: {error}")
            continue
        response = result[0] if isinstance(result, tuple) and result else None
        if not isinstance(response, ToolResponse) or not response.text:
            problems.append(f"{what}: must be answered with a text ToolResponse, got {result!r:.200}")
        elif must_refuse and (response.image or response.video):
            problems.append(f"{what}: must be refused as text without an image, got {response.text!r}")
    return problems


def constructed(tool: BaseTool | type) -> tuple[BaseTool, list[str]]:
    """``tool``, built with no config when it is a class, and the problem when it cannot be: most often a schema
    function whose docstring transformers' ``get_json_schema`` cannot read (no ``Args:`` section, a parameter
    without a type or a description)."""
    if not isinstance(tool, type):
        return tool, []
    try:
        return tool(), []
    except ConfigError as error:  # its message says what to fix (build_schema's: the docstring)
        return cast("BaseTool", None), [f"the tool cannot be built: {error}"]
    except Exception as error:  # noqa: BLE001  any construction failure is the tool's problem to report
        return cast("BaseTool", None), [f"the tool cannot be built with no config ({type(error).__name__}: {error})"]


async def acheck_tool(
    given: BaseTool | type,
    arguments: dict[str, Any] | None = None,
    probe: Image.Image | None = None,
    screen: object | None = None,
) -> CheckReport:
    """Async ``check_tool``; a GUI tool's ``probe`` is its environment's screenshot and ``screen`` that environment,
    reset (``envs.check_gui_tool`` passes them)."""
    name = getattr(given, "name", getattr(given, "__name__", type(given).__name__))
    tool, problems = constructed(given)
    if problems:
        raise ToolCheckError(f"tool {name!r} fails check_tool:\n- " + "\n- ".join(problems))
    arguments = dict(getattr(tool, "example_arguments", {}) if arguments is None else arguments)
    name = getattr(tool, "name", type(tool).__name__)
    if isinstance(tool, ScreenTool) and screen is None:
        raise ToolCheckError(
            f"tool {name!r} acts on a GUI environment's page: check it with "
            "verl_mm_tools.envs.check_gui_tool(tool, environment), e.g. environment=MiniWoBEnv('click-test')"
        )
    problems = schema_problems(tool)
    if not problems:
        problems += await valid_call_problems(tool, arguments, probe, screen)
        problems += await bad_input_problems(tool, arguments, probe, screen)
    if problems:
        raise ToolCheckError(f"tool {name!r} fails check_tool:\n- " + "\n- ".join(problems))
    report = CheckReport(f"tool {name!r}")
    report.passed("schema: an OpenAI function schema named like the tool, with a description and typed parameters")
    width, height = (probe or probe_image()).size
    video = getattr(tool, "answers_with", "images") == "video"
    answer, named = ("a video (frames and metadata)", "Video 2:") if video else ("images", "Image 2:")
    report.passed(
        f"a valid call {arguments} on a {width}x{height} image returns {answer} within max_pixels and a text "
        f"starting '{named}', leaving the workspace to the loop"
    )
    for what, *_ in _bad_calls(tool, arguments, probe):
        report.passed(f"bad input answered as text: {what}")
    return report


def check_tool(tool: BaseTool | type, arguments: dict[str, Any] | None = None) -> CheckReport:
    """Raise ToolCheckError unless ``tool`` keeps the image-tool contract (see the module docstring); returns what
    was checked. ``tool``: an instance, or a class built with no config (a schema it cannot build is a problem).

    ``arguments``: a valid call for the 64x48 probe image (default: ``tool.example_arguments``). Synchronous: it
    runs its own event loop, so call ``await acheck_tool(tool)`` inside a running loop. A GUI tool:
    ``envs.check_gui_tool``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(acheck_tool(tool, arguments))
    raise RuntimeError("check_tool() runs its own event loop; inside async code use 'await acheck_tool(tool)'")
