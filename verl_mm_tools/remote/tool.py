"""``RemoteTool``: a verl ``BaseTool`` whose instances live in a Ray actor pool, and the tool-YAML key that makes one.

In verl's tool YAML, any entry (ours, yours, a plain verl ``BaseTool``) runs remotely when it has a ``remote:`` block
beside ``class_name``::

    tools:
      - class_name: my_pkg.detector.DetectTool
        config: {type: native, weights: /models/det.pt}
        remote: {actors: 2, num_gpus: 0.25, max_concurrency: 4, timeout_s: 30}
        tool_schema: {...}

The class is imported here but never built here: the schema comes from ``tool_schema`` (or, for a class with a
``schema_fn`` such as our image tools, from that function). ``create`` opens a session on one actor, ``execute``
and ``release`` go to the same actor. What crosses with a call: the arguments, the trajectory's images the actor
does not hold yet (each image once per session, unless a dropped turn rolled the workspace back), and the file roots;
the tool reads them through ``workspace_of`` / ``files_of`` as it would locally. The conversation's messages do not
cross.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_mm_tools.errors import ConfigError, RemoteTimeoutError
from verl_mm_tools.files import files_of
from verl_mm_tools.remote.host import TOOL
from verl_mm_tools.remote.pool import ActorPool, pool_for
from verl_mm_tools.remote.spec import REMOTE_ACTOR_METRIC, RemoteSpec
from verl_mm_tools.workspace import workspace_of

if TYPE_CHECKING:
    from omegaconf import DictConfig

logger = logging.getLogger(__name__)

REMOTE_KEY = "remote"

# verl's initialize_tools_from_config: the tool YAML (its path or a stream of its text) to its tools
ToolsLoader = Callable[[str | Path | IO[str]], list[BaseTool]]


class RemoteTool(BaseTool):
    """Forwards create / execute / release of ``tool_class`` to a session on one actor of its pool."""

    def __init__(
        self, tool_class: type, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema, spec: RemoteSpec
    ):
        # BaseTool.__init__ is not called on purpose: it print()s the schema.
        self.config, self.tool_schema, self.spec = config, tool_schema, spec
        self.name = tool_schema.function.name
        self.tool_class = tool_class
        self._pool: ActorPool | None = None  # built on first use: the dataset reads schemas without starting actors
        self.sent_images: dict[str, list] = {}  # per session: the images its actor holds, by identity

    @property
    def pool(self) -> ActorPool:
        if self._pool is None:
            self._pool = pool_for(
                TOOL, self.name, self.tool_class, {"config": self.config, "tool_schema": self.tool_schema}, self.spec
            )
        return self._pool

    async def start(self) -> None:
        """Start the pool's actors; the mm_tool loop awaits this before a trajectory's first turn, so an actor's
        start (imports, loading a model) never counts against a call's timeout."""
        await self.pool.start()

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        key = instance_id or uuid.uuid4().hex
        slot = self.pool.open(key)
        try:
            response = await self.pool.call(slot, "create", key, kwargs, timeout_s=self.spec.timeout_s)
        except BaseException:
            await self._end(key, {})
            raise
        self.sent_images[key] = []
        return key, response

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs.get("agent_data")
        slot = self.pool.slot_of(instance_id)
        images = workspace_of(agent_data).images
        sent = self.sent_images.setdefault(instance_id, [])
        keep = _common_prefix(sent, images)
        new_images = images[keep:]
        try:
            result = await self.pool.call(
                slot,
                "execute",
                instance_id,
                parameters,
                keep,
                new_images,
                files_of(agent_data),
                timeout_s=self.spec.timeout_s,
            )
        except RemoteTimeoutError as error:
            sent[:] = []  # the actor may or may not have taken the new images: send them all next time
            return ToolResponse(text=f"Error: {error}"), 0.0, {"error": str(error), REMOTE_ACTOR_METRIC: slot.name}
        sent[:] = images
        response, reward, metrics = result
        return response, reward, {**(metrics if isinstance(metrics, dict) else {}), REMOTE_ACTOR_METRIC: slot.name}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        await self._end(instance_id, kwargs)

    async def _end(self, key: str, kwargs: dict[str, Any]) -> None:
        """Release the session on its actor; the bookkeeping here goes whatever the actor answers (a lost actor
        took the session with it)."""
        self.sent_images.pop(key, None)
        try:
            await self.pool.call(
                self.pool.slot_of(key), "release", key, kwargs, timeout_s=self.spec.timeout_s, cancel_on_timeout=False
            )
        except Exception:
            logger.warning("%s: releasing session %s failed", self.pool.label, key, exc_info=True)
        finally:
            self.pool.close(key)


def _common_prefix(sent: list, images: list) -> int:
    """How many leading images the actor holds already (the same objects: a rolled-back turn is sent again)."""
    count = 0
    for held, current in zip(sent, images):
        if held is not current:
            break
        count += 1
    return count


# ----- the tool YAML --------------------------------------------------------------------------------------------


def remote_tool(entry: DictConfig) -> RemoteTool:
    """The ``RemoteTool`` of one tool-YAML entry with a ``remote:`` block (an OmegaConf node)."""
    from omegaconf import OmegaConf
    from verl.tools.tool_registry import get_tool_class

    class_name = entry.class_name
    owner = f"tool {class_name}"
    spec = RemoteSpec.from_config(
        OmegaConf.to_container(entry[REMOTE_KEY], resolve=True)
        if OmegaConf.is_config(entry[REMOTE_KEY])
        else entry[REMOTE_KEY],
        owner,
    )
    try:
        tool_class = get_tool_class(class_name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(
            f"{owner}: cannot import the class ({type(error).__name__}: {error}); check class_name and "
            "that its module is importable where verl's workers run"
        ) from error
    config = (
        cast("dict[str, Any]", OmegaConf.to_container(entry.config, resolve=True))  # a tool's config is a mapping
        if entry.get("config") is not None
        else {}
    )
    return RemoteTool(tool_class, config, _schema(entry, tool_class, owner), spec)


def _schema(entry: DictConfig, tool_class: type, owner: str) -> OpenAIFunctionToolSchema:
    from omegaconf import OmegaConf

    if entry.get("tool_schema") is not None:
        return OpenAIFunctionToolSchema.model_validate(OmegaConf.to_container(entry.tool_schema, resolve=True))
    schema_fn = getattr(tool_class, "schema_fn", None)
    if callable(schema_fn):
        from verl_mm_tools.tools.base import build_schema

        return build_schema(schema_fn)
    raise ConfigError(
        f"{owner} runs remotely, so it is not built here to ask for its schema: give its tool_schema in the YAML entry"
    )


def without_remote(yaml_text: str) -> str:
    """The tool YAML with every ``remote:`` block removed (the same tools, built in this process); the text itself
    when it has none."""
    from omegaconf import OmegaConf

    config = cast("DictConfig", OmegaConf.create(yaml_text))  # the tool YAML is a mapping with ``tools:``
    if not any(REMOTE_KEY in entry for entry in config.get("tools") or []):
        return yaml_text
    for entry in config.tools:
        entry.pop(REMOTE_KEY, None)
    return OmegaConf.to_yaml(config)


def with_remote_tools(original: ToolsLoader) -> ToolsLoader:
    """verl's ``initialize_tools_from_config``, building a ``RemoteTool`` for each entry with ``remote:`` and
    leaving every other entry to verl, in the YAML's order."""

    def initialize_tools_from_config(tools_config_file: str | Path | IO[str]) -> list[BaseTool]:
        from omegaconf import OmegaConf

        entries = list(OmegaConf.load(tools_config_file).tools)
        if not any(REMOTE_KEY in entry for entry in entries):
            return original(tools_config_file)
        tools: list[BaseTool] = []
        for entry in entries:
            if REMOTE_KEY in entry:
                tools.append(remote_tool(entry))
            else:
                tools.extend(original(io.StringIO(OmegaConf.to_yaml({"tools": [entry]}))))
        return tools

    return initialize_tools_from_config
