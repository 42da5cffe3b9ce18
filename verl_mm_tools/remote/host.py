"""``RemoteHost``: one Ray actor of a pool. It builds the tool once (or one environment per session) and keeps every
session it serves: a tool session's instance and its copy of the trajectory's images, or an environment instance.

Methods are plain (not ``async``): Ray runs them on ``max_concurrency`` threads, so a tool that blocks (a model, a
simulator, ``time.sleep``) holds only its own thread. Each thread runs the tool's coroutines on its own event loop.
A session unknown here (the actor was restarted and lost it) raises ``RemoteError``: its trajectory is masked. No
verl import beyond what the hosted class imports.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import uuid
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from verl_mm_tools.errors import RemoteError
from verl_mm_tools.files import FileRoots
from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

if TYPE_CHECKING:
    from PIL import Image
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse

T = TypeVar("T")

TOOL, ENVIRONMENT = "tool", "environment"


class RemoteHost:
    """Serves ``kind`` sessions of ``target``: a tool class built once with ``init_kwargs``, or an environment class
    built per session with the kwargs its ``reset`` brings."""

    def __init__(self, kind: str, target: type | str, init_kwargs: dict[str, Any]):
        self.kind = kind
        self.target = target = resolve_class(kind, target)
        self.incarnation = uuid.uuid4().hex  # changes when Ray restarts the actor
        self.tool: BaseTool | None = target(**init_kwargs) if kind == TOOL else None
        self.sessions: dict[str, Any] = {}
        self.ended: set[str] = set()  # sessions released before their (timed-out) create finished here
        self.lock = threading.Lock()
        self.local = threading.local()

    # ----- the actor's own state ----------------------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        """Who answers: the incarnation, the process and the GPUs Ray gave this actor."""
        import ray

        return {
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "node_id": str(ray.get_runtime_context().get_node_id()),
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def open_sessions(self) -> int:
        with self.lock:
            return len(self.sessions)

    # ----- tools ----------------------------------------------------------------------------------------------

    def _tool(self) -> BaseTool:
        if self.tool is None:
            raise RemoteError(f"{self.target.__qualname__}: this actor hosts environments, not a tool")
        return self.tool

    def create(self, key: str, kwargs: dict[str, Any]) -> ToolResponse:
        instance_id, response = self._run(self._tool().create(**kwargs))
        instance = ToolSession(instance_id=instance_id, images=[])
        if not self._open(key, instance):
            self._run(self._tool().release(instance.instance_id))
        return response

    def execute(
        self, key: str, parameters: dict[str, Any], keep: int, new_images: list[Image.Image], files: FileRoots
    ) -> tuple[ToolResponse, float, dict]:
        session = self._session(key, "execute")
        del session.images[keep:]
        session.images.extend(new_images)
        agent_data = SimpleNamespace(image_data=session.images)
        attach_tool_context(agent_data, ToolContext(ImageWorkspace(session.images), files))
        return self._run(self._tool().execute(session.instance_id, parameters, agent_data=agent_data))

    def release(self, key: str, kwargs: dict[str, Any]) -> None:
        session = self._close(key)
        if session is not None:
            self._run(self._tool().release(session.instance_id, **kwargs))

    # ----- environments ---------------------------------------------------------------------------------------

    # an environment's sample, observation and step result: envs sits on this layer, which does not know its types
    def reset(self, key: str, env_kwargs: dict[str, Any], sample: object) -> object:
        environment = self.target(**env_kwargs)  # its methods may be plain or async
        if not self._open(key, environment):
            self._run(environment.close())
            return None
        return self._run(environment.reset(sample))

    def step(self, key: str, assistant_text: str) -> object:
        return self._run(self._session(key, "step").step(assistant_text))

    def act(self, key: str, action: object) -> object:
        """A GUI environment's action (``envs.gui.screen``): its ActionResult."""
        return self._run(self._session(key, "act").act(action))

    def screen(self, key: str) -> tuple[str, tuple[int, int]]:
        """A GUI environment's screen token and page size, known once it is reset."""
        environment = self._session(key, "screen")
        return environment.screen_token, tuple(environment.page_size)

    def close(self, key: str) -> None:
        environment = self._close(key)
        if environment is not None:
            self._run(environment.close())

    # ----- sessions -------------------------------------------------------------------------------------------

    def _open(self, key: str, session: object) -> bool:
        """Keep a new session; False when it was already ended (its create or reset timed out on the caller)."""
        with self.lock:
            if key in self.ended:
                self.ended.discard(key)
                return False
            self.sessions[key] = session
            return True

    def _close(self, key: str) -> Any:
        with self.lock:
            session = self.sessions.pop(key, None)
            if session is None:
                self.ended.add(key)
            return session

    def _session(self, key: str, method: str) -> Any:
        with self.lock:
            session = self.sessions.get(key)
        if session is None:
            raise RemoteError(
                f"{self.kind} session {key} is not on this actor (pid {os.getpid()}) for {method}: the actor was "
                "restarted after the session started, so its state is gone; the trajectory is masked"
            )
        return session

    def _run(self, result: object) -> Any:
        """The value of a plain or async method's result, awaited on this thread's own event loop."""
        if not inspect.isawaitable(result):
            return result
        loop = getattr(self.local, "loop", None)
        if loop is None:
            loop = self.local.loop = asyncio.new_event_loop()
        return loop.run_until_complete(awaited(result))


def class_reference(target: type) -> type | str:
    """What crosses to the actor for its class: ``module:qualname`` when the class can be imported by name there (the
    actor then imports it itself and says which node lacks the module), else the class (pickled by value)."""
    module, qualname = target.__module__, target.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return target
    return f"{module}:{qualname}"


def resolve_class(kind: str, target: type | str) -> type:
    """The class a ``class_reference`` names, imported on this actor's node; RemoteError naming the node and the
    module when it cannot be imported here."""
    if not isinstance(target, str):
        return target
    import importlib

    module_name, qualname = target.split(":", 1)
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        from verl_mm_tools.remote.nodes import node_label, this_node_id

        raise RemoteError(
            f"{kind} class {module_name}.{qualname} cannot be imported on Ray {node_label(this_node_id())}, pid "
            f"{os.getpid()} ({type(error).__name__}: {error}). Every node that may host the actor needs the module: "
            "ship it with the job's Ray runtime_env (py_modules or working_dir: verl's "
            "ray_kwargs.ray_init.runtime_env, or ray.init(runtime_env=...)) or install it on every node"
        ) from None
    return found


class ToolSession:
    """A tool instance on this actor and its copy of the trajectory's images (the workspace the tool reads)."""

    __slots__ = ("instance_id", "images")

    def __init__(self, instance_id: str, images: list[Image.Image]):
        self.instance_id, self.images = instance_id, images


async def awaited(awaitable: Awaitable[T]) -> T:
    """A coroutine of any awaitable (a Ray ObjectRef too), for event-loop APIs that take coroutines."""
    return await awaitable
