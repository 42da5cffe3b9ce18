"""A CPU platform for verl's ``PlatformRegistry``, selected with ``VERL_PLATFORM=cpu``.

verl asks its platform for a device name, a torch device module, a collective backend and a Ray resource. On CPU:
device ``cpu``, backend ``gloo``, and a device module that forwards to ``torch.cpu`` and makes the CUDA-only memory,
RNG and IPC calls verl makes harmless. The Ray resource stays ``GPU``: verl hard-codes ``use_gpu=True`` resource
pools, so a CPU run starts Ray with ``num_gpus=1`` logical GPU (see ``verl_mm_tools.cpu.overrides``).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase

from verl_mm_tools.adaptations.record import Adaptation, Section
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_ENVIRONMENT

PLATFORM_NAME = "cpu"


def _no_op(*args: object, **kwargs: object) -> None:
    return None


def _zero(*args: object, **kwargs: object) -> int:
    return 0


def _mem_get_info(*args: object, **kwargs: object) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _build_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` functions verl calls through ``get_torch_device()``."""
    module = types.ModuleType("verl_mm_tools.cpu.device")
    for name in ("synchronize", "is_available", "current_stream", "stream", "Stream", "Event", "device_count"):
        setattr(module, name, getattr(torch.cpu, name))
    cuda_only: dict[str, Callable[..., object]] = {
        "current_device": torch.cpu.current_device,  # "cpu", see PlatformCPU.current_device
        "set_device": _no_op,
        "empty_cache": _no_op,
        "ipc_collect": _no_op,
        "set_per_process_memory_fraction": _no_op,
        "reset_peak_memory_stats": _no_op,
        "mem_get_info": _mem_get_info,
        "get_device_name": lambda *args, **kwargs: "cpu",
        "get_rng_state": lambda *args, **kwargs: torch.get_rng_state(),
        "set_rng_state": lambda state, *args, **kwargs: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
    }
    for name, function in cuda_only.items():
        setattr(module, name, function)
    # Device-memory counters have no CPU meaning; verl only logs them.
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, _zero)
    return module


DEVICE_MODULE = _build_device_module()


CPU_BACKEND = Adaptation(
    section=Section.EXTENSIONS,
    what="the CPU backend: a platform (device `cpu`, gloo, a device module with no-op CUDA calls, Ray "
    "resource `GPU`), the `hf` rollout, the `cpu_object_store` checkpoint engine",
    why="verl 0.9.1 has no CPU platform nor a rollout or checkpoint engine that runs without GPUs",
    applies_to="verl 0.9.1",
    proof="none (extensions); tested in `tests/cpu/`",
)  # its classes: here, in replica.py, server.py and checkpoint_engine.py


@CPU_BACKEND.implements
class PlatformCPU(PlatformBase):
    """verl on CPU: torch device ``cpu``, gloo collectives, Ray resource ``GPU`` (one logical GPU per worker)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a CPU run is chosen explicitly with VERL_PLATFORM=cpu.
        return False

    def current_device(self) -> str:  # type: ignore[override, unused-ignore]  # verl's base says int; on CPU that means cuda:<int>
        # verl passes this straight to ``.to(...)`` / ``device=``: an int would mean cuda:<int>.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for its logical GPU; nothing reads it on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        # verl starts its vLLM server actors with these (the hf rollout ignores them)
        return dict(VLLM_CPU_ENVIRONMENT)

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None
