"""verl's two rollout extension points for the ``hf`` backend (``actor_rollout_ref.rollout.name=hf``):

- ``HFReplica`` (``RolloutReplicaRegistry``): launches one ``HFRolloutServer`` Ray actor per replica, on the node of
  the replica's trainer worker, named so the worker side can find it.
- ``HFServerAdapter`` (``_ROLLOUT_REGISTRY``): hands the trainer's weights to that server after each step and answers
  verl's resume/release calls. It lives in the trainer worker when rollout is colocated (verl's ``naive`` checkpoint
  engine), or in the standalone replica's ``CheckpointEngineWorker`` (``separate_async``: the weights arrive through
  ``checkpoint_engine.CPUObjectStoreCheckpointEngine``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, cast

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica
from verl.workers.rollout.utils import ensure_async_iterator

from verl_mm_tools.cpu.names import ROLLOUT_NAME
from verl_mm_tools.cpu.platform import CPU_BACKEND
from verl_mm_tools.cpu.server import HFRolloutServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, Iterable

    from omegaconf import DictConfig
    from torch.distributed.device_mesh import DeviceMesh
    from verl.workers.config import RolloutConfig

logger = logging.getLogger(__name__)

SERVER_NAME_PREFIX = f"{ROLLOUT_NAME}_server_"
# Torch threads of the server process (default 1): generating with a small model is a stream of small matmuls, which
# several OpenMP threads slow down as soon as the cores are busy (see cpu.overrides.THREAD_ENV).
SERVER_THREADS_ENV = "VERL_MM_TOOLS_SERVER_THREADS"


def server_name(replica_rank: int, kind: str = "", suffix: str = "") -> str:
    """The Ray actor name of a replica's server (``kind``: "" for the policy, "reward_" or "teacher_")."""
    return f"{SERVER_NAME_PREFIX}{kind}{replica_rank}_0{suffix}"


@CPU_BACKEND.implements
class HFReplica(RolloutReplica):
    """A rollout replica served by one ``HFRolloutServer`` (tensor/pipeline parallel size 1)."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(
                f"the hf rollout serves a whole model in one process, but rollout tensor_model_parallel_size x "
                f"data_parallel_size x pipeline_model_parallel_size = {self.world_size}; set them to 1"
            )
        node_id = await self._node_id()
        # verl's replica is built with a DictConfig (its attribute is annotated with the dataclass it becomes)
        model_config = cast("DictConfig", self.model_config)
        model_path = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig).local_path
        threads = os.environ.get(SERVER_THREADS_ENV)
        name = server_name(self.replica_rank, self._kind(), self.name_suffix)
        launched = (
            ray.remote(HFRolloutServer)
            .options(
                name=name,
                num_cpus=0,  # the trainer's placement group already holds this machine's CPUs
                max_concurrency=self.max_concurrency,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            )
            .remote(
                model_path,
                response_length=self.config.response_length,
                seed=self.config.seed,
                num_threads=int(threads or 1),
                logprobs_mode=self.config.logprobs_mode,
            )
        )
        server = cast("ray.actor.ActorHandle", launched)  # an actor class's remote() is a handle
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # a Ray actor name: verl only uses it as the router's key
        await server.get_stats.remote()  # fail here, not at the first request, if the model does not load

    def _kind(self) -> str:
        return "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""

    async def _node_id(self) -> str:
        if self.workers:
            return await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        return ray.get_runtime_context().get_node_id()


@CPU_BACKEND.implements
class HFServerAdapter(BaseRollout):
    """Worker-side half of the ``hf`` rollout: forwards the trainer's weights to the replica's server."""

    def __init__(
        self,
        config: RolloutConfig,
        model_config: HFModelConfig,
        device_mesh: DeviceMesh,
        replica_rank: int = -1,
        **kwargs: object,
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.is_leader_rank = rank % rollout_world_size == 0
        self._server: ray.actor.ActorHandle | None = None

    def _server_handle(self) -> ray.actor.ActorHandle:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    # verl's base leaves global_steps to **kwargs; its callers pass everything but the weights as keywords.
    @torch.no_grad()
    async def update_weights(  # type: ignore[override, unused-ignore]
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        **kwargs: object,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"the hf rollout takes full named tensors, got wire_format={wire_format!r}; set "
                "actor_rollout_ref.rollout.checkpoint_engine.backend=naive (trainer and rollout colocated) or "
                "cpu_object_store (separate_async)"
            )
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError(
                "the hf rollout does not take LoRA adapters; set actor_rollout_ref.model.lora.merge=true"
            )
        # Every rank iterates (gathering a sharded tensor is a collective); the leader sends.
        tensors = [(name, tensor.detach().to("cpu").clone()) async for name, tensor in ensure_async_iterator(weights)]
        if self.is_leader_rank:
            loaded = await self._server_handle().update_weights.remote(tensors, global_steps)
            logger.debug("hf rollout: %d tensors loaded at step %s", loaded, global_steps)
