"""``ImageTool``: the thin verl ``BaseTool`` adapter every image tool derives from.

A tool is a pure op (``verl_mm_tools.ops``) plus a subclass that names a *schema function* (signature + Google
docstring, from which the OpenAI schema is derived as verl's function tools do; the image is not a parameter) and
implements ``apply(image, **arguments) -> (new_image, what_was_done)``. ``execute`` checks the arguments, resolves
the input image from the trajectory's workspace (``image_id``, default: the latest image), calls ``apply``, bounds
the result to ``max_pixels`` and answers ``ToolResponse(image=[new], text="Image N: ...")``. Invalid input is
answered as text (with reward 0.0 and metrics ``{"error": message}``), never raised.

``N`` is the workspace's ``next_id`` when the tool runs: exact under the mm_tool loop, which runs calls one by one
and adds each image right after its call. verl's plain ``tool_agent`` loop runs one turn's calls concurrently and
appends their images afterwards, so there the second image-returning call of a turn announces the same N.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from PIL import Image
from transformers.utils import get_json_schema
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from verl_mm_tools.errors import ConfigError, ToolInputError, did_you_mean
from verl_mm_tools.ops.argument_checks import show
from verl_mm_tools.ops.geometry import DEFAULT_MAX_PIXELS, MIN_MAX_PIXELS, fit_pixels
from verl_mm_tools.ops.transform import as_rgb
from verl_mm_tools.tools.arguments import ArgumentSpec
from verl_mm_tools.workspace import workspace_of

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

MAX_MAX_PIXELS = 1 << 26  # 64 Mpx: no configuration may let a tool answer with a larger image
# A metrics key any tool may set (with "error") on a failed call that should end the trajectory, as the python tool's
# on_error: end does: the mm_tool loop answers the call, runs none after it and stops (StopReason.TOOL_FAILED); the
# trajectory trains as usual. A metrics flag, not an exception: it crosses a remote actor as data, and verl's plain
# tool_agent loop, which does not know it, still answers the call as text and goes on.
END_TRAJECTORY = "end_trajectory"
# A metrics key a tool sets on a call that ended its environment's episode (a GUI action that finished the task): the
# loop answers the call, runs none after it and stops (StopReason.EPISODE_DONE).
EPISODE_DONE = "episode_done"


@dataclasses.dataclass(frozen=True)
class ImageToolConfig:
    """The ``config:`` block of an image tool in verl's tool YAML. Subclass it to add fields."""

    type: str = "native"
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if not MIN_MAX_PIXELS <= self.max_pixels <= MAX_MAX_PIXELS:
            raise ConfigError(
                f"max_pixels must be between {MIN_MAX_PIXELS} and {MAX_MAX_PIXELS}, got {self.max_pixels}"
            )

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None) -> Self:
        """Parse a config mapping once; unknown keys and wrongly typed values are ConfigErrors."""
        fields = {field.name: field for field in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        values = dict(config or {})
        for key, value in values.items():
            if key not in fields:
                raise ConfigError(
                    f"{cls.__name__}: unknown config key {key!r}.{did_you_mean(str(key), fields)} "
                    f"Known keys: {sorted(fields)}"
                )
            kind = hints[key]
            if isinstance(kind, type) and (not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)):
                raise ConfigError(f"{cls.__name__}: {key} must be a {kind.__name__}, got {value!r}")
        return cls(**values)


def build_schema(fn: Callable[..., object]) -> OpenAIFunctionToolSchema:
    """The OpenAI tool schema of a schema function (name, Google docstring, typed parameters), with the
    docstring's line breaks folded into spaces. A ConfigError naming the function when transformers'
    ``get_json_schema`` cannot read it (the tool is then not built, whether by ``check_tool`` or verl's tool YAML)."""
    try:
        json_schema = get_json_schema(fn)
    except Exception as error:  # noqa: BLE001  transformers' parsing errors share no base class worth naming
        where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        raise ConfigError(
            f"the tool schema cannot be built from {where} ({type(error).__name__}: {error}); give it a Google "
            "docstring with a description and an 'Args:' section describing every parameter, each with a type hint"
        ) from None
    schema = OpenAIFunctionToolSchema.model_validate(json_schema)
    schema.function.description = " ".join(schema.function.description.split())
    for prop in schema.function.parameters.properties.values():
        prop.description = " ".join((prop.description or "").split()) or None
    return schema


class SchemaFunctionTool(BaseTool):
    """A verl ``BaseTool`` whose schema is derived from its ``schema_fn`` (signature and Google docstring), which
    also checks the model's arguments (``self.arguments``). ``BaseTool.__init__`` is not called: it print()s the
    schema."""

    schema_fn: ClassVar[Callable[..., object]]

    def _set_schema(self, tool_schema: OpenAIFunctionToolSchema | Mapping | None) -> None:
        """``tool_schema`` from the YAML (a mapping or a schema), else the schema function's; the tool's name and
        argument checks from them."""
        if not callable(getattr(type(self), "schema_fn", None)):
            raise TypeError(f"{type(self).__name__} must set schema_fn, the function its schema is derived from")
        if isinstance(tool_schema, Mapping):
            tool_schema = OpenAIFunctionToolSchema.model_validate(tool_schema)
        self.tool_schema = tool_schema or build_schema(type(self).schema_fn)
        self.name = self.tool_schema.function.name
        self.arguments = ArgumentSpec(type(self).schema_fn)

    def _refuse(self, message: str) -> tuple[ToolResponse, float, dict]:
        """The answer to a call that cannot be done: the reason, as text the model reads."""
        return ToolResponse(text=f"Error from {self.name}: {message}"), 0.0, {"error": message}


# The config class of an ImageTool: ``class RotateTool(ImageTool[RotateConfig])`` types its ``settings``.
ConfigT = TypeVar("ConfigT", bound=ImageToolConfig)


class ImageTool(SchemaFunctionTool, Generic[ConfigT]):
    """Base of the image tools. Subclasses set ``schema_fn`` and implement ``apply``; a tool with a config class of
    its own derives from ``ImageTool[ItsConfig]`` and sets ``config_cls = ItsConfig``.

    Class attributes:
        schema_fn: the tool's argument function; its name, docstring and typed parameters give the schema, and
            the model's arguments are checked against its signature. ``image_id: int | None = None`` selects the
            input image (default: the latest); tools without it always use the latest image.
        config_cls: the frozen dataclass the YAML ``config`` is parsed into (``self.settings``).
        example_arguments: valid arguments for ``check_tool``'s probe image (64x48 px).
    """

    schema_fn: ClassVar[Callable[..., object]]
    # not a ClassVar, which cannot hold a type variable; a tool without a config class of its own keeps the default
    config_cls: type[ConfigT] = cast("type[ConfigT]", ImageToolConfig)
    example_arguments: ClassVar[dict[str, object]] = {}

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None):
        self.config = dict(config or {})
        self.settings: ConfigT = self.config_cls.from_dict(self.config)
        self._set_schema(tool_schema)

    # *args: Any, **arguments: Any: each subclass names its own arguments (those of its schema_fn), so
    # type checkers accept any override's keyword parameters; execute() passes them by name only.
    def apply(self, image: Image.Image, *args: Any, **arguments: Any) -> tuple[Image.Image, str]:
        """The new image and what was done to the input, e.g. ``(rotated, "rotated by 90 degrees")``."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply(image, **arguments)")

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        try:
            return self._run(parameters, kwargs.get("agent_data"))
        except ToolInputError as error:
            return self._refuse(str(error))
        except Exception as error:  # logged; the model must get an answer, never an exception
            logger.exception("%s failed on arguments %s", self.name, show(parameters))
            return self._refuse(f"the tool failed internally ({type(error).__name__}); try other arguments")

    def _run(self, parameters: object, agent_data: object) -> tuple[ToolResponse, float, dict]:
        arguments = self.arguments.parse(parameters)
        image_id = arguments.pop("image_id", None)
        workspace = workspace_of(agent_data)
        image = workspace.get(image_id)
        source_id = image_id if image_id is not None else workspace.latest_id
        result, what = self.apply(as_rgb(image), **arguments)
        result = fit_pixels(as_rgb(result), self.settings.max_pixels)
        text = f"Image {workspace.next_id}: Image {source_id} {what}, {result.width}x{result.height} px."
        return ToolResponse(image=[result], text=text), 0.0, {}
