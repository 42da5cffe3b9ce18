"""The changes to verl a CPU run needs. Applied only when the CPU platform is selected
(``VERL_PLATFORM=cpu``); each checks that verl still looks the way the change assumes and fails loudly otherwise.

1. ``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
   ``f"cpu:gloo,{device}:{backend}"``, which on CPU is ``"cpu:gloo,cpu:gloo"``: torch rejects the duplicate device.
   The patched function passes ``backend="cpu:gloo"`` unless the caller chose one.
2. ``verl.workers.utils.padding.left_right_2_no_padding`` packs Qwen-VL's (4, L) position ids with
   ``torch.nested.as_nested_tensor``. When every sequence of the batch has the same length L, torch makes the
   constant dimension (4) the ragged one, and ``update_actor`` later dies in ``split_with_sizes ... sum exactly to``.
   The patched function rebuilds that nested tensor with the sequence dimension ragged. It changes nothing when
   the lengths differ (torch then picks the right dimension).
   On the v1 trainer the batch comes packed the same way from TransferQueue, and
   ``verl.utils.tensordict_utils.maybe_fix_3d_position_ids`` (which only resets the ragged index, for tensors that
   lost it in a pickle) turns it into the same crash: the patched function repairs either case. (A verl bug, not a
   CPU one: a GPU batch of equal lengths hits it too; verl-mm-tools patches only its CPU runs.)
3. ``verl.workers.engine.fsdp.transformer_impl`` builds forward-only models (the reference policy of a KL loss)
   with ``CPUOffloadPolicy(pin_memory=True)``; pinning host memory needs an accelerator. The module's
   ``CPUOffloadPolicy`` becomes a subclass that never pins (the parameters already live in host memory).
4. ``verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu`` (the ``separate_async`` trainer's ``DetachActorWorker``
   keeps pi_old with it) copies each shard with ``.cpu()``, which on CPU returns the live parameter itself: the
   "saved" model would follow every update, and ``restore_model_from_cpu`` (parameter_sync_step > 1) would restore
   the current weights instead of pi_old, silently. The patched function clones the shards that alias a parameter.
5. ``verl.utils.distributed.initialize_global_process_group`` (the torchrun path: ``verl.trainer.sft_trainer``)
   builds the same ``"cpu:gloo,cpu:gloo"`` as 1, and takes no backend to pass on: the patched function is verl's
   with ``"cpu:gloo"`` (and without ``set_device``, a no-op on CPU).
6. ``verl.utils.checkpoint.fsdp_checkpoint_manager.FSDPCheckpointManager.save_checkpoint`` saves the Hugging Face
   model (``checkpoint.save_contents`` with ``hf_model``) through a model built with ``torch_dtype=torch.bfloat16``,
   whatever the weights: the float32 weights a CPU run trains are written as they are, under a ``config.json`` that
   says ``"dtype": "bfloat16"``, and ``from_pretrained`` without a dtype loads them as bfloat16. After verl's save,
   the patched method records in the config (root and sub-configs) the dtype the saved weights have.

verl's modules bind these functions by name at import (``from verl.utils.distributed import ...``), so the patch
replaces the function in its home module and in every already-imported verl module that bound it. Plugins load
inside ``import verl``, before the trainer and worker modules are imported.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch

from verl_mm_tools.adaptations.verl_patch import (
    PATCHED_MARK,
    VerlChangedError,
    checked_method,
    checked_original,
    install,
    install_method,
)

logger = logging.getLogger(__name__)

GLOO_TARGET = ("verl.utils.distributed", "initialize_global_process_group_ray")
GLOO_EXPECTED_SOURCE = 'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
PADDING_TARGET = ("verl.workers.utils.padding", "left_right_2_no_padding")
PADDING_EXPECTED_SOURCE = "torch.nested.as_nested_tensor(position_ids_list, layout=torch.jagged)"
OFFLOAD_MODULE = "verl.workers.engine.fsdp.transformer_impl"
OFFLOAD_EXPECTED_SOURCE = "offload_policy = CPUOffloadPolicy(pin_memory=True)"
FIX_3D_TARGET = ("verl.utils.tensordict_utils", "maybe_fix_3d_position_ids")
FIX_3D_EXPECTED_SOURCE = 'data["position_ids"]._ragged_idx = 2'
SAVE_TO_CPU_TARGET = ("verl.utils.fsdp_utils", "fsdp2_sharded_save_to_cpu")
SAVE_TO_CPU_EXPECTED_SOURCE = "local_cpu_tensor = local_gpu_tensor.detach().cpu()"
SFT_GLOO_TARGET = ("verl.utils.distributed", "initialize_global_process_group")
SFT_GLOO_EXPECTED_SOURCE = 'backend = f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
HF_SAVE_TARGET = ("verl.utils.checkpoint.fsdp_checkpoint_manager", "FSDPCheckpointManager", "save_checkpoint")
HF_SAVE_EXPECTED_SOURCE = "model_config, torch_dtype=torch.bfloat16, trust_remote_code=self.trust_remote_code"
HF_SAVE_PARAMETERS = ("self", "local_path", "hdfs_path", "global_step", "max_ckpt_to_keep")
HF_MODEL_DIR = "huggingface"  # verl's folder for the Hugging Face model, under the step's checkpoint
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
CPU_BACKEND = "cpu:gloo"
OWNER = "verl_mm_tools/adaptations/cpu_patches.py"


def _original(
    module_name: str, function_name: str, expected_source: str, parameters: tuple[str, ...]
) -> Callable | None:
    return checked_original(module_name, function_name, expected_source, parameters, OWNER)


def patch_gloo_backend() -> None:
    original = _original(*GLOO_TARGET, GLOO_EXPECTED_SOURCE, ("timeout_second", "backend"))
    if original is None:
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

    install(*GLOO_TARGET, original, initialize_global_process_group_ray)


def patch_equal_length_position_ids() -> None:
    original = _original(*PADDING_TARGET, PADDING_EXPECTED_SOURCE, ("data",))
    if original is None:
        return

    @functools.wraps(original)
    def left_right_2_no_padding(data):
        data = original(data)
        data["position_ids"] = fix_ragged_position_ids(data["position_ids"])
        return data

    install(*PADDING_TARGET, original, left_right_2_no_padding)


def fix_ragged_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Nested (batch, 4, L_i) position ids with the sequence dimension ragged, whatever torch chose.

    Two ways it goes wrong: ``as_nested_tensor`` of equal-shape (4, L) components makes dimension 1 (the 4) ragged
    (values (4 * batch, L), offsets over dimension 1): the components are rebuilt along L. And a nested tensor that
    went through tensordict's consolidate and pickle comes back with ``_ragged_idx`` 1 although its values and
    offsets run along L (values (4, sum L)): verl's ``maybe_fix_3d_position_ids`` repairs that by setting the index,
    which on the first case produced ``split_with_sizes expects split_sizes to sum exactly to ...``.
    """
    if not position_ids.is_nested or position_ids.dim() != 3 or position_ids._ragged_idx == 2:
        return position_ids
    values, offsets = position_ids.values(), position_ids.offsets()
    if int(offsets[-1]) != values.shape[0]:  # offsets run along L: only the index was lost
        position_ids._ragged_idx = 2
        return position_ids
    components = values.split(offsets.diff().tolist(), dim=0)
    lengths = torch.tensor([0] + [component.shape[-1] for component in components])
    return torch.nested.nested_tensor_from_jagged(
        torch.cat(components, dim=-1), offsets=lengths.cumsum(0), jagged_dim=2
    )


def patch_3d_position_ids_fix() -> None:
    original = _original(*FIX_3D_TARGET, FIX_3D_EXPECTED_SOURCE, ("data",))
    if original is None:
        return

    @functools.wraps(original)
    def maybe_fix_3d_position_ids(data):
        if "position_ids" in data.keys():
            data["position_ids"] = fix_ragged_position_ids(data["position_ids"])

    install(*FIX_3D_TARGET, original, maybe_fix_3d_position_ids)


def patch_unpinned_offload() -> None:
    module = importlib.import_module(OFFLOAD_MODULE)
    original = module.CPUOffloadPolicy
    if getattr(original, PATCHED_MARK, False):
        return
    if OFFLOAD_EXPECTED_SOURCE not in inspect.getsource(module):
        raise VerlChangedError(
            f"verl-mm-tools' CPU backend replaces {OFFLOAD_MODULE}.CPUOffloadPolicy, expecting the line "
            f"{OFFLOAD_EXPECTED_SOURCE!r}, which this verl version no longer has. The CPU backend supports verl 0.9.1; "
            "install verl==0.9.1 or update verl_mm_tools/adaptations/cpu_patches.py."
        )

    class UnpinnedCPUOffloadPolicy(original):
        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    setattr(UnpinnedCPUOffloadPolicy, PATCHED_MARK, True)
    module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def patch_sharded_save_to_cpu() -> None:
    original = _original(*SAVE_TO_CPU_TARGET, SAVE_TO_CPU_EXPECTED_SOURCE, ("model",))
    if original is None:
        return

    @functools.wraps(original)
    def fsdp2_sharded_save_to_cpu(model):
        cpu_sharded_state, global_spec = original(model)
        return detach_from_parameters(cpu_sharded_state, model), global_spec

    install(*SAVE_TO_CPU_TARGET, original, fsdp2_sharded_save_to_cpu)


def detach_from_parameters(cpu_sharded_state: dict, model: torch.nn.Module) -> dict:
    """``cpu_sharded_state`` ({name: (tensor, spec)}) with every tensor that shares memory with one of ``model``'s
    parameters (an FSDP2 parameter's local shard) replaced by a copy."""
    # A DTensor has no storage of its own (asking raises); its shard, the one verl's save reads, has.
    live = {getattr(param, "_local_tensor", param).untyped_storage().data_ptr() for param in model.parameters()}
    return {
        name: (tensor.clone() if tensor.untyped_storage().data_ptr() in live else tensor, spec)
        for name, (tensor, spec) in cpu_sharded_state.items()
    }


def patch_torchrun_gloo_backend() -> None:
    original = _original(*SFT_GLOO_TARGET, SFT_GLOO_EXPECTED_SOURCE, ("timeout_second",))
    if original is None:
        return

    # verl's function takes no backend to pass on, so this is verl's, with "cpu:gloo" (set_device is a no-op here)
    @functools.wraps(original)
    def initialize_global_process_group(timeout_second=36000):
        torch.distributed.init_process_group(
            backend=CPU_BACKEND,
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    install(*SFT_GLOO_TARGET, original, initialize_global_process_group)


def patch_saved_hf_dtype() -> None:
    original = checked_method(*HF_SAVE_TARGET, HF_SAVE_EXPECTED_SOURCE, HF_SAVE_PARAMETERS, OWNER)
    if original is None:
        return

    @functools.wraps(original)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        original(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
        if local_path is not None and self.should_save_hf_model and self.rank == 0:
            record_weights_dtype(Path(local_path) / HF_MODEL_DIR)

    install_method(*HF_SAVE_TARGET[:2], HF_SAVE_TARGET[2], save_checkpoint)


def record_weights_dtype(model_dir: Path) -> None:
    """Set every ``dtype`` of ``model_dir/config.json`` to the one dtype its safetensors hold (left alone when they
    hold several)."""
    found = saved_weight_dtypes(model_dir)
    if len(found) != 1:
        logger.warning("%s holds weights of dtypes %s; its config's dtype is left as verl wrote it", model_dir, found)
        return
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    # transformers writes its configs so (PretrainedConfig.to_json_string)
    config_path.write_text(json.dumps(with_dtype(config, found.pop()), indent=2, sort_keys=True) + "\n")


def saved_weight_dtypes(model_dir: Path) -> set[str]:
    from safetensors import safe_open

    found = set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            found |= {weights.get_slice(name).get_dtype() for name in weights.keys()}
    return {SAFETENSORS_DTYPES.get(dtype, dtype) for dtype in found}


def with_dtype(config, dtype: str):
    """``config`` with each ``dtype`` / ``torch_dtype`` entry, at any depth (``text_config``, ...), set to ``dtype``."""
    if isinstance(config, dict):
        return {
            key: dtype if key in ("dtype", "torch_dtype") and isinstance(value, str) else with_dtype(value, dtype)
            for key, value in config.items()
        }
    return config


def apply_cpu_patches() -> None:
    patch_gloo_backend()
    patch_torchrun_gloo_backend()
    patch_equal_length_position_ids()
    patch_3d_position_ids_fix()
    patch_unpinned_offload()
    patch_sharded_save_to_cpu()
    patch_saved_hf_dtype()
