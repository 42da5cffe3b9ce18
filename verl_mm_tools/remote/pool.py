"""``ActorPool``: the Ray actors serving one remote tool or environment class, shared by every agent-loop worker.

The actors are named (``verl_mm_tools/<kind>/<name>/<digest>/<index>``) and created with ``get_if_exists``: verl's
agent-loop workers, each its own process, reach the same ``actors`` actors instead of starting a pool each, and
whichever worker comes first starts them. A session (one trajectory's tool instance or environment) is opened on the
least busy actor this process knows of and stays there (affinity). A call that outlives ``timeout_s`` is cancelled;
an actor that dies fails only the calls and sessions it held: the next session that needs the slot gets the actor
Ray restarted (``max_restarts``) or, when Ray gave up on it, a new one under the same name.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import hashlib
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

from verl_mm_tools.errors import RemoteError, RemoteTimeoutError
from verl_mm_tools.remote.host import RemoteHost, awaited, class_reference
from verl_mm_tools.remote.nodes import live_nodes_offering, node_info, node_label
from verl_mm_tools.remote.spec import RemoteSpec

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorClass

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Slot:
    """One actor of the pool, as this process sees it."""

    index: int
    name: str
    handle: Any = None  # None: look the named actor up (or start it) before the next call
    started: bool = False
    incarnation: str | None = None
    open_sessions: int = 0
    assigned: int = 0
    job: str | None = None  # the Ray job the handle belongs to
    node_id: str | None = None  # the Ray node the actor answered from last ...
    node: str = "an unknown node"  # ... as named then (a lost node's record no longer lists its resources)
    # every handle this process got for the slot's actor in this job: Ray ends a named, non-detached actor once its
    # owner's handles are all gone, so dropping the handle after a loss could end the actor Ray is restarting
    held: list = dataclasses.field(default_factory=list)


class ActorPool:
    """The actors of one remote class; sessions are keyed by the caller's session key."""

    def __init__(self, kind: str, name: str, target: type, init_kwargs: dict[str, Any], spec: RemoteSpec):
        self.kind, self.target, self.init_kwargs, self.spec = kind, target, init_kwargs, spec
        self.label = f"{kind} {name!r}"
        digest = hashlib.sha1(repr(pool_key(kind, target, init_kwargs, spec)).encode()).hexdigest()[:10]
        prefix = f"verl_mm_tools/{kind}/{name}/{digest}"
        self.slots = [Slot(index, f"{prefix}/{index}") for index in range(spec.actors)]
        self.sessions: dict[str, Slot] = {}
        self.counts: collections.Counter[str] = collections.Counter()  # calls, timeouts, lost, restarted

    # ----- sessions -------------------------------------------------------------------------------------------

    def open(self, key: str) -> Slot:
        """Place a new session on the least busy actor (ties: the one given the fewest sessions so far)."""
        slot = min(self.slots, key=lambda candidate: (candidate.open_sessions, candidate.assigned))
        slot.open_sessions += 1
        slot.assigned += 1
        self.sessions[key] = slot
        return slot

    def close(self, key: str) -> None:
        slot = self.sessions.pop(key, None)
        if slot is not None:
            slot.open_sessions -= 1

    def slot_of(self, key: str) -> Slot:
        slot = self.sessions.get(key)
        if slot is None:
            raise RemoteError(
                f"{self.label}: no open session {key!r} in this process (it was released, or never "
                "created: call create / reset first)"
            )
        return slot

    # ----- calls ----------------------------------------------------------------------------------------------

    async def call(
        self, slot: Slot, method: str, *args: object, timeout_s: float | None = None, cancel_on_timeout: bool = True
    ) -> Any:
        """``method(*args)`` on the slot's actor. Raises RemoteTimeoutError past ``timeout_s``, RemoteError when the
        actor or the session is lost, and the hosted class's own exception when it raised. A release or close is
        not cancelled past its timeout (``cancel_on_timeout=False``): it still runs once the actor gets to it."""
        import ray

        handle = await self._started_handle(slot)
        self.counts["calls"] += 1
        ref = getattr(handle, method).remote(*args)
        try:
            return await asyncio.wait_for(
                awaited(ref) if cancel_on_timeout else asyncio.shield(awaited(ref)), timeout_s
            )
        except asyncio.TimeoutError:
            if cancel_on_timeout:
                _cancel(ref)
            self.counts["timeouts"] += 1
            outcome = "was cancelled" if cancel_on_timeout else "still runs there"
            raise RemoteTimeoutError(
                f"{self.label}: {method} on actor {slot.name} took longer than {timeout_s:g} s and {outcome}"
            ) from None
        except asyncio.CancelledError:  # the caller gave up (the loop's tool_timeout_s, a cancelled trajectory)
            if cancel_on_timeout:
                _cancel(ref)
            raise
        except ray.exceptions.RayActorError as error:
            slot.handle, slot.started = None, False
            self.counts["lost"] += 1
            raise RemoteError(
                f"{self.label}: actor {slot.name} was lost during {method} on {slot.node}{_dead_note(slot.node_id)} "
                f"({type(error).__name__}: {_first_line(error)}); its sessions are gone"
            ) from error
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, RemoteError):
                raise RemoteError(f"{self.label}, actor {slot.name}: {cause}") from None
            raise (cause if isinstance(cause, BaseException) else error) from None

    async def _started_handle(self, slot: Slot) -> Any:
        import ray

        if not ray.is_initialized():
            raise RemoteError(
                f"{self.label} runs in Ray actors (remote:), but Ray is not initialized in this "
                "process: verl's workers always are; elsewhere call ray.init() first"
            )
        job = ray.get_runtime_context().get_job_id()
        if slot.job != job:  # a new Ray session (ray.init again in this process): its actors are not ours
            slot.handle, slot.started, slot.incarnation, slot.job = None, False, None, job
            slot.held.clear()
        if slot.handle is None:
            slot.handle = (
                _actor_class()
                .options(name=slot.name, get_if_exists=True, **self.spec.actor_options())
                .remote(self.kind, class_reference(self.target), self.init_kwargs)
            )
            slot.held.append(slot.handle)
        if not slot.started:
            await self._wait_started(slot, ray)
        return slot.handle

    async def _wait_started(self, slot: Slot, ray: ModuleType) -> None:
        try:
            info = await asyncio.wait_for(_first_answer(slot.handle, ray), self.spec.startup_timeout_s)
        except asyncio.TimeoutError:
            ray.kill(slot.handle)  # not left pending: it would take the resources once they free up
            slot.handle = None
            raise RemoteError(
                f"{self.label}: actor {slot.name} did not start within {self.spec.startup_timeout_s:g} s; it asks Ray "
                f"for {self.spec.actor_options()} and Ray has {ray.available_resources()} free."
                f"{_no_node_offers(self.spec)} Lower num_cpus / num_gpus, give Ray more resources, or raise "
                "startup_timeout_s (a slow constructor)"
            ) from None
        except ray.exceptions.RayActorError as error:
            slot.handle = None
            raise RemoteError(f"{self.label}: actor {slot.name} failed to start ({_start_failure(error)})") from error
        if slot.incarnation is not None and info["incarnation"] != slot.incarnation:
            self.counts["restarted"] += 1
            logger.warning(
                "%s: actor %s was restarted (pid %s now); sessions it held were masked",
                self.label,
                slot.name,
                info["pid"],
            )
        slot.incarnation, slot.started = info["incarnation"], True
        if info.get("node_id") != slot.node_id:
            slot.node_id, slot.node = info.get("node_id"), node_label(info.get("node_id"))

    async def start(self) -> None:
        """Start every actor (at once), or raise RemoteError saying why one did not start."""
        if not all(slot.started for slot in self.slots):
            await asyncio.gather(*(self._started_handle(slot) for slot in self.slots))

    async def ping_all(self) -> list[dict[str, Any]]:
        """Start every actor and say who answers (incarnation, pid, GPUs)."""
        await self.start()
        return [await self.call(slot, "ping") for slot in self.slots]


async def _first_answer(handle: Any, ray: ModuleType) -> dict[str, Any]:
    """The actor's ping, asked again while Ray says the actor is restarting (ActorUnavailableError: a call sent
    while Ray restarts a killed actor, or while its node reconnects, fails at once instead of waiting)."""
    while True:
        try:
            return await awaited(handle.ping.remote())
        except ray.exceptions.ActorUnavailableError:
            await asyncio.sleep(0.2)


_POOLS: dict[tuple, ActorPool] = {}


def pool_key(kind: str, target: type, init_kwargs: dict[str, Any], spec: RemoteSpec) -> tuple:
    return kind, target.__module__, target.__qualname__, repr(sorted(init_kwargs.items())), spec


def pool_for(kind: str, name: str, target: type, init_kwargs: dict[str, Any], spec: RemoteSpec) -> ActorPool:
    """This process's pool for the class: one per (kind, class, constructor arguments, spec); the actors' names
    derive from the same, so every process reaches the same actors."""
    key = pool_key(kind, target, init_kwargs, spec)
    if key not in _POOLS:
        _POOLS[key] = ActorPool(kind, name, target, init_kwargs, spec)
    return _POOLS[key]


@functools.cache
def _actor_class() -> ActorClass[RemoteHost]:
    import ray

    return ray.remote(RemoteHost)


def _cancel(ref: ObjectRef[object]) -> None:
    import ray

    try:
        ray.cancel(ref)
    except Exception:
        logger.debug("cancelling a remote call failed", exc_info=True)


def _start_failure(error: BaseException) -> str:
    """Why an actor did not start: the constructor's own RemoteError (a class its node cannot import) when that
    is the cause, else the first line of Ray's error."""
    text = str(error)
    for line in text.splitlines():
        index = line.find("RemoteError: ")
        if index >= 0:
            return line[index + len("RemoteError: ") :].strip()[:1000]
    return _first_line(error)


def _dead_note(node_id: str | None) -> str:
    info = node_info(node_id)
    return ", a node Ray reports dead" if info is not None and info.get("Alive") is False else ""


def _no_node_offers(spec: RemoteSpec) -> str:
    """A note naming each custom resource the actor asks for that no live node offers (its node was lost)."""
    missing = [name for name in spec.resources if not live_nodes_offering(name)]
    if not missing:
        return ""
    return f" No live Ray node offers {', '.join(repr(name) for name in missing)} (was its node lost?)."


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]
