"""``cpu_object_store``: a verl checkpoint engine that moves weights from the trainer to standalone rollout
replicas through Ray's object store, for machines without GPUs or RDMA (verl's ``separate_async`` trainer refuses
the in-process ``naive`` engine, and nccl/nixl/mooncake/hccl need devices).

One weight sync (``CheckpointEngineManager.update_weights``) goes:

1. ``prepare`` on every actor rank and rollout worker: each says whether it is the master (actor rank 0).
2. ``build_topology`` (in the trainer process): gets or creates the ``WeightMailbox`` Ray actor and gives every
   worker its role for this sync, the mailbox and a fresh sync id.
3. ``send_weights`` on the actor ranks (all iterate the weights: gathering an FSDP shard is collective), while
   ``receive_weights`` runs on the rollout workers. The master ``ray.put``s the weights in buckets of at most
   ``bucket_size`` bytes and posts each bucket's reference to the mailbox; every receiver fetches the buckets in
   order (Ray copies each object to the receiver; the tensors it yields are its own).
4. ``finalize``: the master tells the mailbox to drop the sync's references, which frees the objects.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from typing import Any, cast

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from verl_mm_tools.cpu.platform import CPU_BACKEND
from verl_mm_tools.cpu.weight_mailbox import WeightMailbox
from verl_mm_tools.verl_registry import register_unique

logger = logging.getLogger(__name__)
# Like verl's own modules: Ray workers' root logger stays at WARNING, and one line per sync and worker shows in the
# trainer's log that the rollout got each step's weights.
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

BACKEND_NAME = "cpu_object_store"
MAILBOX_NAME = "verl_mm_tools_cpu_object_store_mailbox"
# How long a receiver waits for the next bucket before giving up (engine_kwargs: {cpu_object_store: {timeout_s: ..}}).
DEFAULT_TIMEOUT_S = 600.0

SENDER, RELAY, RECEIVER = "sender", "relay", "receiver"


# This process's mailbox handle, per Ray job. Ray kills an actor once no handle to it is left; the engines drop theirs
# at finalize, so without this one the mailbox would die after every sync and the next one would start a new
# process (~5 s on a busy CPU).
_mailboxes: dict[str, ray.actor.ActorHandle] = {}


def weight_mailbox() -> ray.actor.ActorHandle:
    """The mailbox actor, created on first use and kept alive by this process (the trainer's, where verl's
    CheckpointEngineManager calls build_topology). num_cpus=0: it only holds references, and the CPU pools already
    hold the logical CPUs."""
    job = ray.get_runtime_context().get_job_id()
    if job not in _mailboxes:
        mailbox = ray.remote(WeightMailbox).options(name=MAILBOX_NAME, get_if_exists=True, num_cpus=0).remote()
        _mailboxes[job] = cast("ray.actor.ActorHandle", mailbox)  # an actor class's remote() is a handle
    return _mailboxes[job]


@CPU_BACKEND.implements
class CPUObjectStoreCheckpointEngine(CheckpointEngine):
    """Trainer -> rollout weights through Ray's object store (see the module docstring for the protocol).

    Args:
        bucket_size: max bytes per object put into the store (verl passes update_weights_bucket_megabytes << 20).
        is_master: True on the actor's rank 0, the only sender; verl passes it on the actor side only.
        timeout_s: how long a receiver waits for a bucket.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if bucket_size <= 0:
            raise ValueError(
                f"cpu_object_store: bucket_size must be positive, got {bucket_size}; set "
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes >= 1"
            )
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.timeout_s = float(timeout_s)
        self.role: str | None = None
        self.mailbox: ray.actor.ActorHandle | None = None
        self.sync_id: str | None = None

    def prepare(self) -> dict[str, bool]:
        return {"is_master": self.is_master}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        actor_meta = metadata[:actor_wg_world_size]
        masters = [rank for rank, meta in enumerate(actor_meta) if meta.get("is_master")]
        if masters != [0]:
            raise ValueError(
                f"cpu_object_store expects exactly the actor's rank 0 to be the master (it sends the weights), got "
                f"masters at actor ranks {masters} of {actor_wg_world_size}; metadata: {actor_meta}"
            )
        if any(meta.get("is_master") for meta in metadata[actor_wg_world_size:]):
            raise ValueError(f"cpu_object_store: a rollout worker claims to be the master; metadata: {metadata}")
        mailbox, sync_id = weight_mailbox(), uuid.uuid4().hex
        actor_kwargs: dict[str, list[Any]] = {
            "role": [SENDER] + [RELAY] * (actor_wg_world_size - 1),
            "mailbox": [mailbox] * actor_wg_world_size,
            "sync_id": [sync_id] * actor_wg_world_size,
        }
        rollout_kwargs: dict[str, list[Any]] = {
            "role": [RECEIVER] * rollout_world_size,
            "mailbox": [mailbox] * rollout_world_size,
            "sync_id": [sync_id] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    # verl's base takes **kwargs: its manager passes build_topology's keys, which are these.
    def init_process_group(self, role: str, mailbox: ray.actor.ActorHandle, sync_id: str) -> None:  # type: ignore[override, unused-ignore]
        self.role, self.mailbox, self.sync_id = role, mailbox, sync_id

    def finalize(self) -> None:
        if self.role == SENDER:
            self._mailbox().drop.remote(self.sync_id)  # fire and forget: the next sync has a new id
        self.role, self.mailbox, self.sync_id = None, None, None

    def _mailbox(self) -> ray.actor.ActorHandle:
        """The mailbox of the sync under way (init_process_group sets it with the role)."""
        if self.mailbox is None:
            raise RuntimeError(
                "cpu_object_store: no sync under way; init_process_group sets the mailbox, finalize drops it"
            )
        return self.mailbox

    def _require(self, *roles: str) -> None:
        if self.role not in roles:
            raise RuntimeError(
                f"cpu_object_store: this worker's role for the sync is {self.role!r}, but the call needs one of "
                f"{roles}. verl's CheckpointEngineManager calls prepare, build_topology and init_process_group first; "
                "was send/receive_weights called outside CheckpointEngineManager.update_weights?"
            )

    async def send_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]],
        global_steps: int | None = None,
    ) -> dict[str, float]:
        self._require(SENDER, RELAY)
        if self.role == RELAY:
            async for _ in ensure_async_iterator(weights):  # gathering each weight is collective over the actor
                pass
            return {}
        started, sent, total, posted = time.perf_counter(), 0, 0, 0
        bucket: list[tuple[str, torch.Tensor]] = []
        bucket_bytes = 0
        async for name, tensor in ensure_async_iterator(weights):
            tensor = tensor.detach().to("cpu")
            if bucket and bucket_bytes + tensor.nbytes > self.bucket_size:
                await self._post(posted, bucket, is_last=False)
                posted, bucket, bucket_bytes = posted + 1, [], 0
            bucket.append((name, tensor))
            bucket_bytes, sent, total = bucket_bytes + tensor.nbytes, sent + 1, total + tensor.nbytes
        await self._post(posted, bucket, is_last=True)  # possibly empty: it tells the receivers the sync is over
        seconds = time.perf_counter() - started
        logger.info(
            "cpu_object_store: sent %d tensors (%.1f MB) in %d bucket(s) for step %s in %.2f s",
            sent,
            total / 2**20,
            posted + 1,
            global_steps,
            seconds,
        )
        metrics = {
            "cpu_object_store/sent_tensors": float(sent),
            "cpu_object_store/sent_mb": total / 2**20,
            "cpu_object_store/send_s": seconds,
        }
        if global_steps is not None:
            metrics["cpu_object_store/weights_version"] = float(global_steps)
        return metrics

    async def _post(self, index: int, bucket: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
        ref = ray.put(bucket)  # serialized into the store: later changes to the trainer's tensors do not reach it
        await self._mailbox().post.remote(self.sync_id, index, [ref], is_last)

    # verl's base annotates a coroutine of a generator; its engines and their callers use an async generator.
    async def receive_weights(  # type: ignore[override, unused-ignore]
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        self._require(RECEIVER)
        started, received, index, is_last = time.perf_counter(), 0, 0, False
        while not is_last:
            refs, is_last = await self._mailbox().take.remote(self.sync_id, index, self.timeout_s)
            for name, tensor in await refs[0]:
                received += 1
                yield name, tensor
            index += 1
        logger.info(
            "cpu_object_store: received %d tensors in %d bucket(s) for step %s in %.2f s",
            received,
            index,
            global_steps,
            time.perf_counter() - started,
        )


# verl's registry takes classes (no lazy loaders): registered once defined (``verl_mm_tools.cpu`` imports this module
# when verl imports its checkpoint engines)
register_unique(CheckpointEngineRegistry._registry, BACKEND_NAME, CPUObjectStoreCheckpointEngine, "checkpoint engine")
