"""The hydra overrides that make ``python -m verl.trainer.main_ppo`` run on CPU with the ``hf`` rollout, on verl's
v1 trainer (its default) or the classic one.

Each entry says why it is needed; the environment ``cpu_environment()`` adds selects the platform.
"""

from __future__ import annotations

import os

from verl_mm_tools.adaptations.record import Adaptation, Section
from verl_mm_tools.cpu.checkpoint_engine import BACKEND_NAME as CHECKPOINT_BACKEND
from verl_mm_tools.cpu.names import ROLLOUT_NAME
from verl_mm_tools.cpu.platform import PLATFORM_NAME
from verl_mm_tools.cpu.vllm_cpu import vllm_rollout_overrides

CPU_OVERRIDES = Adaptation(
    section=Section.CONFIGURATION,
    what="the hydra overrides a CPU run needs, each with its reason in the code (e.g. "
    "`ray_init.num_gpus=1`: verl's resource pools are hard-coded `use_gpu=True`; "
    "`SimpleStorage.num_data_storage_units=1`: TransferQueue's 8 default storage actors are never "
    "placed)",
    why="verl's defaults assume GPUs and several nodes",
    applies_to="verl 0.9.1",
    proof="none; the overrides compose with verl's own config: `tests/demo/test_demo_on_cpu.py`",
)
CPU_OVERRIDES.implements(vllm_rollout_overrides)  # the vLLM rollout's, in the layer below

# (override, why)
CPU_TRAINER_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("trainer.device=cpu", "worker groups place tensors on this device"),
    ("trainer.nnodes=1", "one machine"),
    ("trainer.n_gpus_per_node=1", "one trainer process (one logical Ray GPU)"),
    ("+ray_kwargs.ray_init.num_gpus=1", "verl's resource pools are hard-coded use_gpu=True: one logical GPU"),
    (
        "ray_kwargs.ray_init.num_cpus=16",
        "logical CPUs (scheduling tokens, not cores): a pool bundle takes 3, plus "
        "the task runner, agent-loop and reward workers and TransferQueue's actors; "
        "too few and an actor waits forever to be placed",
    ),
    (f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}", "the transformers rollout server"),
    ("actor_rollout_ref.rollout.mode=async", "verl's server mode, the only one left"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=1", "one server process per replica"),
    ("actor_rollout_ref.rollout.data_parallel_size=1", "one server process per replica"),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size=1", "one server process per replica"),
    ("actor_rollout_ref.rollout.checkpoint_engine.backend=naive", "weights go trainer -> adapter -> server in-process"),
    ("actor_rollout_ref.rollout.free_cache_engine=false", "no KV cache to free between steps"),
    (
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "the server returns log-probs: verl compares them to the actor's (training/rollout_probs_diff_*)",
    ),
    ("actor_rollout_ref.rollout.agent.num_workers=1", "each agent-loop worker is a 300-500 MB process (default 8)"),
    ("reward.num_workers=1", "each reward worker is a 300-500 MB process (default 8)"),
    ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "no flash-attention on CPU"),
    ("actor_rollout_ref.model.use_remove_padding=false", "verl's packed-sequence attention needs flash-attention"),
    ("actor_rollout_ref.actor.strategy=fsdp2", "FSDP2 runs on gloo"),
    (
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "bf16 on CPU is slow and makes actor log-probs differ from the fp32 rollout",
    ),
    ("actor_rollout_ref.actor.fsdp_config.use_torch_compile=false", "compiling costs more than it saves on CPU"),
    ("data.dataloader_num_workers=0", "each dataloader worker is another process (default 8)"),
    (
        "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "the reference policy of a KL loss (when enabled) computes in fp32 like the actor",
    ),
    ("actor_rollout_ref.ref.fsdp_config.use_torch_compile=false", "compiling costs more than it saves on CPU"),
)


# Only on the v1 trainer (trainer.use_v1=true, verl's default).
V1_OVERRIDES: tuple[tuple[str, str], ...] = (
    (
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "TransferQueue starts one actor per storage unit (default 8, for several nodes); one machine needs one",
    ),
)
# Only on the v1 trainer's separate_async mode (trainer.v1.trainer_mode=separate_async): rollout on its own resource
# pool, fed new weights through a checkpoint engine after every step. Later values of a key win in hydra, so these
# come after CPU_TRAINER_OVERRIDES.
SEPARATE_ASYNC_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.rollout.nnodes=1", "the standalone rollout's resource pool: one node ..."),
    ("actor_rollout_ref.rollout.n_gpus_per_node=1", "... with one logical GPU: one hf server replica"),
    (
        "actor_rollout_ref.hybrid_engine=false",
        "no rollout replica beside the trainer: on CPU it shares the cores the trainer computes on, so it has no idle "
        "hardware to lend, and verl only switches to it for validation (hybrid_rollout.enable_switch is off); it "
        "would be a second engine to start and to sync weights to. Validation runs on the standalone rollout",
    ),
    (
        "++ray_kwargs.ray_init.num_gpus=2",
        "one logical Ray GPU for the trainer's pool, one for the rollout's (verl's "
        "pools ask for GPUs; the CPU platform's Ray resource is GPU); ++ replaces "
        "the 1 of CPU_TRAINER_OVERRIDES, where + would fail on a duplicate key",
    ),
    (
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={CHECKPOINT_BACKEND}",
        "separate_async refuses the in-process naive engine (trainer and rollout live in different processes) and "
        "nccl/nixl/mooncake/hccl need GPUs or RDMA: weights go through Ray's object store",
    ),
    (
        "trainer.v1.separate_async.parameter_sync_step=1",
        "the trainer asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size, and the demo trains on the "
        "whole batch as one mini-batch; 1 also syncs weights to the rollout after every step",
    ),
)
# Only on verl's fully async trainer (``verl.experimental.fully_async_policy``, config fully_async_ppo_trainer): a
# rollouter and a trainer on separate resource pools, weights through a checkpoint engine. After CPU_TRAINER_OVERRIDES.
FULLY_ASYNC_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.hybrid_engine=false", "the rollouter's servers are standalone (it asserts no hybrid engine)"),
    ("rollout.nnodes=1", "the rollouter's resource pool: one node ..."),
    ("rollout.n_gpus_per_node=1", "... with one logical GPU: one vLLM server replica (verl's default is 8)"),
    ("++ray_kwargs.ray_init.num_gpus=2", "one logical Ray GPU for the trainer's pool, one for the rollouter's"),
    (
        "ray_kwargs.ray_init.num_cpus=48",
        "logical CPUs (scheduling tokens): verl's FullyAsyncTrainer and FullyAsyncRollouter actors ask 10 each, its "
        "message queue 2, each pool bundle 3, plus the task runner and the agent-loop and reward workers",
    ),
    (
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={CHECKPOINT_BACKEND}",
        "verl's fully async config defaults to nccl (GPUs); weights go through Ray's object store",
    ),
    ("data.train_batch_size=0", "the rollouter asserts it: it feeds prompts one at a time ..."),
    ("data.gen_batch_size=1", "... one prompt (with its n rollouts) per generation"),
    ("async_training.require_batches=1", "the trainer takes one mini-batch of prompts per step"),
)
CLASSIC_OVERRIDES: tuple[tuple[str, str], ...] = (("trainer.use_v1=false", "verl's classic (deprecated) trainer"),)


@CPU_OVERRIDES.implements
def cpu_trainer_overrides(classic: bool = False) -> list[str]:
    extra = CLASSIC_OVERRIDES if classic else V1_OVERRIDES
    return [override for override, _ in (*CPU_TRAINER_OVERRIDES, *extra)]


@CPU_OVERRIDES.implements
def separate_async_overrides() -> list[str]:
    """Add to ``cpu_trainer_overrides()`` (after it) for ``trainer.v1.trainer_mode=separate_async``."""
    return [override for override, _ in SEPARATE_ASYNC_OVERRIDES]


@CPU_OVERRIDES.implements
def fully_async_overrides() -> list[str]:
    """Add to ``cpu_trainer_overrides()`` (after it) for verl's fully async trainer."""
    return [override for override, _ in FULLY_ASYNC_OVERRIDES]


# One torch/OpenMP thread per process unless the user says otherwise. A CPU run is five busy processes (driver,
# trainer worker, rollout server, agent-loop and reward workers); with several threads each, OpenMP threads spin
# against each other and small matmuls got up to 250x slower (measured: 100 decode-sized matmuls 1.6 s with 2
# threads on 2 busy cores, 0.007 s with 1; a warm-start step 0.03 s vs 0.4-1.1 s).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a CPU trainer run: the CPU platform, verl's FSDP engine (registered for ``cuda``), one
    thread per process (see ``THREAD_ENV``)."""
    env = dict(os.environ if base is None else base)
    env["VERL_PLATFORM"] = PLATFORM_NAME
    env["VERL_ENGINE_DEVICE"] = "cuda"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in THREAD_ENV:
        env.setdefault(name, "1")
    return env
