"""The CPU platform and the hf rollout registrations: present after ``import verl``, inert unless selected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from verl_mm_tools.cpu.platform import DEVICE_MODULE, PlatformCPU

pytestmark = pytest.mark.integration  # fresh interpreters importing verl


def run_python(code: str, platform: str | None) -> dict:
    """Run ``code`` in a fresh interpreter (the platform and patches are process-wide); it prints one JSON line."""
    env = {key: value for key, value in os.environ.items() if key != "VERL_PLATFORM"}
    if platform is not None:
        env["VERL_PLATFORM"] = platform
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


REGISTRATIONS = """
    import json
    import verl
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class
    print(json.dumps({
        "platform": PlatformRegistry.get("cpu").__name__,
        "replica": get_rollout_replica_class("hf").__name__,
        "adapter": get_rollout_class("hf", "async").__name__,
        "vllm_adapter": _ROLLOUT_REGISTRY[("vllm", "async")],
    }))
"""


def test_import_verl_registers_the_cpu_platform_and_the_hf_rollout():
    assert run_python(REGISTRATIONS, platform=None) == {
        "platform": "PlatformCPU",
        "replica": "HFReplica",
        "adapter": "HFServerAdapter",
        "vllm_adapter": "verl.workers.rollout.vllm_rollout.ServerAdapter",
    }


PATCH_STATE = """
    import json
    import verl
    import verl.checkpoint_engine.base as checkpoint_base
    import verl.trainer.ppo.ray_trainer as ray_trainer
    import verl.utils.distributed as distributed
    import verl.workers.engine_workers as engine_workers
    import verl.workers.utils.padding as padding
    from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device

    def patched(function):
        return bool(getattr(function, "__verl_mm_tools_patched__", False))

    print(json.dumps({
        "device": get_device_name(),
        "backend": get_nccl_backend(),
        "device_module": get_torch_device().__name__,
        "gloo": [
            patched(m.initialize_global_process_group_ray) for m in (distributed, engine_workers, checkpoint_base)
        ],
        "padding": [patched(m.left_right_2_no_padding) for m in (padding, ray_trainer)],
    }))
"""


def test_selecting_the_cpu_platform_patches_every_verl_module_that_binds_the_functions():
    assert run_python(PATCH_STATE, platform="cpu") == {
        "device": "cpu",
        "backend": "gloo",
        "device_module": "verl_mm_tools.cpu.device",
        "gloo": [True, True, True],
        "padding": [True, True],
    }


def test_without_the_cpu_platform_verl_is_untouched():
    state = run_python(PATCH_STATE, platform="nvidia")
    assert state["gloo"] == [False, False, False]
    assert state["padding"] == [False, False]
    assert state["device"] == "cuda"


def test_the_cpu_platform_is_never_auto_detected():
    assert PlatformCPU().is_platform_available(use_smi_check=True) is False


def test_platform_answers_what_verl_asks():
    platform = PlatformCPU()
    assert (platform.device_name, platform.communication_backend_name(), platform.ray_resource_name()) == (
        "cpu",
        "gloo",
        "GPU",
    )
    # verl passes current_device() straight to .to(): it must name the CPU, not a CUDA index.
    assert torch.zeros(1).to(platform.current_device()).device.type == "cpu"
    assert platform.ray_resource_options(1) == {"num_gpus": 1}
    assert platform.is_ipc_supported() is False
    with platform.nvtx_range("no-op"):
        pass


def test_device_module_memory_and_rng_calls():
    available, total = DEVICE_MODULE.mem_get_info()
    assert 0 < available <= total
    assert DEVICE_MODULE.max_memory_allocated() == 0
    assert DEVICE_MODULE.empty_cache() is None
    state = DEVICE_MODULE.get_rng_state()
    first = torch.rand(3)
    DEVICE_MODULE.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    assert DEVICE_MODULE.current_device() == "cpu"
    assert DEVICE_MODULE.is_available() is True


@pytest.mark.parametrize(
    "name",
    [
        "synchronize",
        "current_stream",
        "Stream",
        "device_count",
        "set_device",
        "ipc_collect",
        "memory_reserved",
        "max_memory_reserved",
        "memory_allocated",
        "set_per_process_memory_fraction",
        "get_device_name",
        "Event",
        "stream",
    ],
)
def test_device_module_has_every_function_verl_calls(name):
    assert callable(getattr(DEVICE_MODULE, name))
