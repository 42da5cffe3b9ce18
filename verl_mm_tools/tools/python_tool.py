"""``PythonTool``: the model writes Python over its images; the code runs in a sandbox (``verl_mm_tools.sandbox``).

A thin verl adapter: ``create`` opens the trajectory's session (its kernel starts on the first call), ``execute`` runs
the code with the trajectory's images readable (``images[id]``, ``image_<id>.png``) and answers the images the code
saved or showed (``Image N: ...``, ids from the workspace's ``next_id`` as the image tools do, each downscaled to
``max_pixels``) and its output as text; ``release`` kills the kernel. Errors in the code, time-outs, limits and a lost
kernel are answered as text, never raised; with ``on_error: end`` that answer also ends the trajectory
(``END_TRAJECTORY`` in its metrics). The whole answer (image lines, output, errors, notes) is valid text of at most
``limits.max_output_chars`` characters. See docs/python_tool.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from PIL import Image
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from verl_mm_tools.errors import ConfigError, ToolInputError
from verl_mm_tools.ops.geometry import fit_pixels
from verl_mm_tools.ops.text import valid_text
from verl_mm_tools.ops.transform import as_rgb
from verl_mm_tools.sandbox import SANDBOX_MODES, KernelProcess, RunResult, SandboxLimits, check_bwrap
from verl_mm_tools.sandbox.bwrap import default_packages, package_binds
from verl_mm_tools.tools.arguments import ArgumentSpec
from verl_mm_tools.tools.base import END_TRAJECTORY, ImageToolConfig, build_schema
from verl_mm_tools.workspace import workspace_of

logger = logging.getLogger(__name__)

LOST_SESSION = "The Python session was restarted: variables, imports and files of earlier calls are gone."
ON_ERROR = ("answer", "end")


def python(code: str) -> None:
    """Run Python code in this conversation's own sandboxed Python session, like a notebook cell: variables, imports
    and files persist between calls. The conversation's images are images[1], images[2], ... (PIL images; Image 1 is
    the first) and the files image_1.png, image_2.png, ... in the working directory. Every image the code saves
    (img.save("crop.png")) or shows (img.show(), an open matplotlib figure) comes back as a new image. Printed output
    and the value of the last line come back as text. numpy and PIL (and matplotlib, where installed) are
    available; there is no network.

    Args:
        code: Python source to run, for example: images[1].crop((0, 0, 100, 100)).save("crop.png")
    """


@dataclasses.dataclass(frozen=True)
class PythonToolConfig(ImageToolConfig):
    """PythonTool's config: ``sandbox`` ("bwrap"; "none" runs the code unisolated, with a warning at every kernel
    start), ``bwrap`` (the bubblewrap executable), ``packages`` (top-level modules bound into the sandbox; default
    numpy and PIL, plus matplotlib when installed), ``limits`` (``SandboxLimits`` fields), ``on_error`` ("answer": a
    failed call is answered to the model as text and the trajectory goes on; "end": the trajectory ends at that
    answer, its tokens trained as usual). ``max_pixels`` downscales each returned image."""

    sandbox: str = "bwrap"
    bwrap: str = "bwrap"
    packages: list | None = None
    limits: dict | None = None
    on_error: str = "answer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sandbox not in SANDBOX_MODES:
            raise ConfigError(
                f"the python tool's sandbox must be one of {list(SANDBOX_MODES)}, got {self.sandbox!r}; 'none' runs "
                "model-written code without isolation"
            )
        if self.on_error not in ON_ERROR:
            raise ConfigError(
                f"the python tool's on_error must be one of {list(ON_ERROR)}, got {self.on_error!r}: 'answer' tells "
                "the model what failed and goes on, 'end' ends the trajectory at the failed call"
            )
        if self.packages is not None and not all(isinstance(name, str) and name for name in self.packages):
            raise ConfigError(f"the python tool's packages must be a list of module names, got {self.packages!r}")


class PythonTool(BaseTool):
    """The ``python`` tool: one sandboxed kernel per trajectory (see the module docstring)."""

    schema_fn = staticmethod(python)
    config_cls: ClassVar[type[PythonToolConfig]] = PythonToolConfig
    example_arguments: ClassVar[dict[str, object]] = {"code": "images[1].crop((8, 8, 40, 32)).save('crop.png')"}

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None):
        # BaseTool.__init__ is not called on purpose: it print()s the schema.
        self.config = dict(config or {})
        self.settings = self.config_cls.from_dict(self.config)
        self.limits = SandboxLimits.from_dict(self.settings.limits)
        if self.settings.sandbox == "bwrap":
            check_bwrap(self.settings.bwrap)  # refuse to start where the sandbox cannot run
        self.packages = None if self.settings.packages is None else tuple(self.settings.packages)
        package_binds(default_packages() if self.packages is None else self.packages)  # checked now, not at a call
        if isinstance(tool_schema, Mapping):
            tool_schema = OpenAIFunctionToolSchema.model_validate(tool_schema)
        self.tool_schema = tool_schema or build_schema(python)
        self.name = self.tool_schema.function.name
        self.arguments = ArgumentSpec(python)
        self.kernels: dict[str, KernelProcess] = {}

    def _kernel(self) -> KernelProcess:
        return KernelProcess(self.limits, self.settings.sandbox, self.packages, self.settings.bwrap)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        key = instance_id or uuid.uuid4().hex
        self.kernels[key] = self._kernel()  # started by the first call
        return key, ToolResponse()

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        try:
            code = self.arguments.parse(parameters)["code"]
        except ToolInputError as error:
            return self._refuse(str(error))
        kernel = self.kernels.get(instance_id)
        if kernel is None:  # executed without create: a session of its own all the same
            kernel = self.kernels[instance_id] = self._kernel()
        workspace = workspace_of(kwargs.get("agent_data"))
        if not kernel.alive:
            kernel.launch()  # on the event loop's thread, which outlives the call (--die-with-parent)
        result = await asyncio.to_thread(kernel.run, code, list(workspace.images))
        response, reward, metrics = self._answer(result, workspace.next_id)
        if self.settings.on_error == "end" and metrics.get("error"):
            metrics[END_TRAJECTORY] = True
        return response, reward, metrics

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        kernel = self.kernels.pop(instance_id, None)
        if kernel is not None:
            await asyncio.to_thread(kernel.close)

    def _answer(self, result: RunResult, next_id: int) -> tuple[ToolResponse, float, dict]:
        lines: list[str] = []
        images: list[Image.Image] = []
        for image, origin in result.images:
            fitted = fit_pixels(as_rgb(image), self.settings.max_pixels)
            resized = f" (downscaled from {image.width}x{image.height})" if fitted.size != image.size else ""
            lines.append(f"Image {next_id + len(images)}: {origin}, {fitted.width}x{fitted.height} px{resized}.")
            images.append(fitted)
        if result.lost:
            lines.append(f"Error: {result.lost}. {LOST_SESSION}")
        more = [f"{result.more_refused} more images were not returned"] if result.more_refused else []
        notes = result.refused + more
        tail = ["Note: " + "; ".join(notes) + "."] if notes else []
        text = bounded_answer(lines, result, tail, self.limits.max_output_chars) or "Done (no output, no image)."
        text = valid_text(text)
        failed = result.lost or (result.output.strip().splitlines() or [""])[-1] if result.failed else result.lost
        response = ToolResponse(text=text, image=images) if images else ToolResponse(text=text)
        return response, 0.0, ({"error": valid_text(failed[:300])} if failed else {})

    def _refuse(self, message: str) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text=f"Error from {self.name}: {message}"), 0.0, {"error": message}


def bounded_answer(head: list[str], result: RunResult, tail: list[str], limit: int) -> str:
    """The answer's lines (``head``, the output, ``tail``) in at most ``limit`` characters: the output is cut first,
    its last line counting every character cut (the kernel's and these); where the other lines alone are too long,
    the end of the whole answer is cut."""
    parts = list(head)
    if result.output or result.cut:
        label = "Error:\n" if result.failed else "Output:\n"
        room = limit - len("\n".join(head + tail)) - len(label) - (1 if head else 0) - (1 if tail else 0)
        parts.append(label + _fitted_output(result.output.rstrip("\n"), result.cut, room))
    text = "\n".join(parts + tail)
    if len(text) <= limit:
        return text
    marker = f"\n... (the answer was cut at {limit} characters)"
    return text[: max(0, limit - len(marker))] + marker


def _fitted_output(output: str, cut: int, room: int) -> str:
    """``output`` in ``room`` characters, ending with a line that counts the characters cut when any were."""
    if not cut and len(output) <= room:
        return output
    widest = f"\n... ({cut + len(output)} more characters of output were cut)"
    kept = max(0, min(len(output), room - len(widest)))
    return output[:kept] + f"\n... ({cut + len(output) - kept} more characters of output were cut)"
