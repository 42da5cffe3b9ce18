"""The verl patches of the CPU backend: their guards, the failure each fixes, and that each changes nothing else."""

from __future__ import annotations

import dataclasses
import inspect
import os
import pickle
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict

from verl_mm_tools.adaptations import guard
from verl_mm_tools.adaptations.cpu import (
    equal_length_position_ids,
    gloo_backend,
    saved_hf_dtype,
    unpinned_offload,
)
from verl_mm_tools.adaptations.record import Target

pytestmark = pytest.mark.integration  # verl's worker and trainer modules, on the tiny model

GLOO_EXPECTED_SOURCE = 'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
PADDING_EXPECTED_SOURCE = "torch.nested.as_nested_tensor(position_ids_list, layout=torch.jagged)"
OFFLOAD_EXPECTED_SOURCE = "offload_policy = CPUOffloadPolicy(pin_memory=True)"
FIX_3D_EXPECTED_SOURCE = 'data["position_ids"]._ragged_idx = 2'
SFT_GLOO_EXPECTED_SOURCE = 'backend = f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
HF_SAVE_EXPECTED_SOURCE = "model_config, torch_dtype=torch.bfloat16, trust_remote_code=self.trust_remote_code"


def test_verl_still_builds_the_duplicate_gloo_backend_string_the_patch_replaces():
    """Fails, naming the function, when verl changes ``initialize_global_process_group_ray``: re-check the patch."""
    from verl.utils import distributed

    function = distributed.initialize_global_process_group_ray
    function = getattr(function, "__wrapped__", function)
    source = inspect.getsource(function)
    assert GLOO_EXPECTED_SOURCE in source, (
        "verl.utils.distributed.initialize_global_process_group_ray changed: "
        "verl_mm_tools/adaptations/cpu/gloo_backend.py assumes it builds the backend string " + GLOO_EXPECTED_SOURCE
    )
    assert tuple(inspect.signature(function).parameters) == ("timeout_second", "backend")


def test_verl_still_packs_position_ids_the_way_the_equal_length_fix_assumes():
    from verl.workers.utils import padding

    function = getattr(padding.left_right_2_no_padding, "__wrapped__", padding.left_right_2_no_padding)
    assert PADDING_EXPECTED_SOURCE in inspect.getsource(function), (
        "verl.workers.utils.padding.left_right_2_no_padding changed: re-check "
        "verl_mm_tools/adaptations/cpu/equal_length_position_ids.py"
    )


def test_a_changed_verl_function_is_refused_with_its_name(monkeypatch):
    from verl.utils import distributed

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return backend

    monkeypatch.setattr(distributed, "initialize_global_process_group_ray", initialize_global_process_group_ray)
    with pytest.raises(guard.VerlChangedError, match=r"verl\.utils\.distributed\.initialize_global_process_group_ray"):
        guard.apply(gloo_backend.ADAPTATION)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


INIT_PROCESS_GROUP = """
    import json, torch, torch.distributed as dist
    import verl
    from verl.workers import engine_workers
    try:
        engine_workers.initialize_global_process_group_ray(timeout_second=60)
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
    else:
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        print(json.dumps({"backend": dist.get_backend(), "sum": tensor.tolist()}))
"""


def _init_process_group(platform: str, apply_patch: bool, tries: int = 3) -> str:
    """The child's one-line outcome. A free port can be taken by another process before the child binds it (seen
    in a fast-lane run beside Ray tests): then the child runs again on a new port."""
    for _ in range(tries):
        outcome = _init_process_group_once(platform, apply_patch)
        if "EADDRINUSE" not in outcome:
            return outcome
    return outcome


def _init_process_group_once(platform: str, apply_patch: bool) -> str:
    env = dict(
        os.environ,
        VERL_PLATFORM=platform,
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    code = textwrap.dedent(INIT_PROCESS_GROUP)
    if not apply_patch:  # what verl does on CPU without us: the plugin loads, then we undo the patch
        code = code.replace(
            "from verl.workers import engine_workers",
            textwrap.dedent("""
            from verl.utils import distributed
            from verl.workers import engine_workers
            original = distributed.initialize_global_process_group_ray.__wrapped__
            engine_workers.initialize_global_process_group_ray = original
        """),
        )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_gloo_patch_lets_verls_worker_initialize_its_process_group_on_cpu():
    assert _init_process_group("cpu", apply_patch=True) == '{"backend": "cpu:gloo", "sum": [1.0, 1.0]}'


def test_without_the_gloo_patch_torch_rejects_verls_backend_string_on_cpu():
    """Why the patch exists. If this starts passing, verl fixed it upstream and the patch can go."""
    outcome = _init_process_group("cpu", apply_patch=False)
    assert '"error"' in outcome and "cpu:gloo,cpu:gloo" in outcome.replace(" ", ""), outcome


# ----- equal-length position ids -------------------------------------------------------------------------------


def left_right_batch(lengths: list[int], width: int = 8, response_width: int = 3) -> TensorDict:
    """A left-right padded batch as verl's trainer holds it: Qwen-VL (4, L) position ids, distinct per sample."""
    batch_size = len(lengths)
    attention = torch.zeros(batch_size, width, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention[row, width - length :] = 1
    positions = torch.arange(width).expand(batch_size, 4, width) + 100 * torch.arange(batch_size).view(-1, 1, 1)
    return TensorDict(
        {
            "input_ids": torch.arange(batch_size * width).reshape(batch_size, width),
            "attention_mask": attention,
            "response_mask": attention[:, -response_width:].clone(),
            "position_ids": positions.clone(),
        },
        batch_size=[batch_size],
    )


def expected_positions(batch: TensorDict) -> list[torch.Tensor]:
    mask = batch["attention_mask"].bool()
    return [batch["position_ids"][row][:, mask[row]] for row in range(len(batch))]


def as_a_worker_receives_it(position_ids: torch.Tensor) -> TensorDict:
    """Pickled to the worker, then verl's own repair of the ragged dimension (engine_workers.update_actor)."""
    from verl.utils.tensordict_utils import maybe_fix_3d_position_ids

    received = pickle.loads(pickle.dumps(TensorDict({"position_ids": position_ids}, batch_size=[position_ids.size(0)])))
    maybe_fix_3d_position_ids(received)
    return received


def test_equal_lengths_break_verls_packing_and_the_fix_repairs_it():
    from verl.utils.tensordict_utils import chunk_tensordict
    from verl.workers.utils.padding import left_right_2_no_padding

    original = getattr(left_right_2_no_padding, "__wrapped__", left_right_2_no_padding)
    batch = left_right_batch([6, 6, 6, 6])
    packed = original(batch.clone())["position_ids"]
    # The bug (if this fails, torch/verl fixed it and the patch can go): the constant 4 became the ragged dimension.
    assert packed._ragged_idx == 1 and packed.offsets().tolist() == [0, 4, 8, 12, 16]
    with pytest.raises(RuntimeError):
        chunk_tensordict(as_a_worker_receives_it(packed), 2)  # what update_actor does per mini-batch

    fixed = equal_length_position_ids.fix_ragged_position_ids(packed)
    assert fixed._ragged_idx == 2 and fixed.offsets().tolist() == [0, 6, 12, 18, 24]
    chunks = chunk_tensordict(as_a_worker_receives_it(fixed), 2)
    received = [tensor for chunk in chunks for tensor in chunk["position_ids"].unbind()]
    assert all(torch.equal(got, want) for got, want in zip(received, expected_positions(batch), strict=True))
    padded = torch.nested.to_padded_tensor(
        as_a_worker_receives_it(fixed)["position_ids"], padding=0, output_size=(4, 4, 8)
    )  # what the FSDP engine does per micro-batch
    assert torch.equal(padded[:, :, :6], torch.stack(expected_positions(batch)))


def transfer_queue_batch(lengths: list[int]) -> TensorDict:
    """Position ids of a v1 batch as TransferQueue hands it to a worker: per-sample (4, L) tensors packed with
    ``as_nested_tensor``, then consolidated and pickled."""
    components = [torch.arange(length).expand(4, length) + 100 * row for row, length in enumerate(lengths)]
    packed = torch.nested.as_nested_tensor(components, layout=torch.jagged)
    return pickle.loads(pickle.dumps(TensorDict({"position_ids": packed}, batch_size=[len(lengths)]).consolidate()))


@pytest.mark.parametrize("lengths", [[6, 6, 6, 6], [6, 5, 7, 6]])
def test_v1_batches_are_repaired_where_verl_only_resets_the_ragged_index(lengths):
    """Equal lengths: verl's maybe_fix_3d_position_ids sets index 2 over offsets that run along the 4, and selecting
    a mini-batch dies (the learning task's crash on the v1 trainer). Unequal lengths: only the index was lost."""
    from verl.utils.tensordict_utils import index_select_tensor_dict, maybe_fix_3d_position_ids

    original = getattr(maybe_fix_3d_position_ids, "__wrapped__", maybe_fix_3d_position_ids)
    assert FIX_3D_EXPECTED_SOURCE in inspect.getsource(original)
    broken = transfer_queue_batch(lengths)
    original(broken)
    if len(set(lengths)) == 1:
        with pytest.raises(RuntimeError):  # torch words it differently by path: split_with_sizes, cond
            index_select_tensor_dict(broken, torch.tensor([0, 2]))
    fixed = transfer_queue_batch(lengths)
    fixed["position_ids"] = equal_length_position_ids.fix_ragged_position_ids(fixed["position_ids"])
    selected = index_select_tensor_dict(fixed, torch.tensor([0, 2]))["position_ids"].unbind()
    assert [tensor.tolist() for tensor in selected] == [
        (torch.arange(lengths[row]).expand(4, lengths[row]) + 100 * row).tolist() for row in (0, 2)
    ]


def test_unequal_lengths_are_left_exactly_as_verl_packs_them():
    from verl.workers.utils.padding import left_right_2_no_padding

    original = getattr(left_right_2_no_padding, "__wrapped__", left_right_2_no_padding)
    packed = original(left_right_batch([6, 5, 7]))["position_ids"]
    assert equal_length_position_ids.fix_ragged_position_ids(packed) is packed


def test_two_dimensional_position_ids_are_left_alone():
    nested = torch.nested.as_nested_tensor([torch.arange(3), torch.arange(3)], layout=torch.jagged)
    assert equal_length_position_ids.fix_ragged_position_ids(nested) is nested


def test_verl_still_builds_forward_only_models_with_pinned_offload():
    """Fails, naming the module, when verl changes how it offloads the reference model: re-check the patch."""
    from verl.workers.engine.fsdp import transformer_impl

    assert OFFLOAD_EXPECTED_SOURCE in inspect.getsource(transformer_impl), (
        "verl.workers.engine.fsdp.transformer_impl changed: re-check verl_mm_tools/adaptations/cpu/unpinned_offload.py"
    )


def test_pinned_offload_fails_without_an_accelerator_and_the_patched_policy_never_pins():
    """What verl's reference model would do on CPU, and what it does with the patch (run in a fresh interpreter:
    the patch replaces a module attribute for the whole process)."""
    script = textwrap.dedent("""
        import torch
        try:
            torch.zeros(4).pin_memory()
            print("pinned")
        except RuntimeError:
            print("pinning needs an accelerator")
        from verl_mm_tools.adaptations import guard
        from verl_mm_tools.adaptations.cpu import unpinned_offload
        from torch.distributed.fsdp import CPUOffloadPolicy
        from verl.workers.engine.fsdp import transformer_impl
        guard.apply(unpinned_offload.ADAPTATION)
        guard.apply(unpinned_offload.ADAPTATION)  # idempotent
        policy = transformer_impl.CPUOffloadPolicy(pin_memory=True)
        print(isinstance(policy, CPUOffloadPolicy), policy.pin_memory)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:2] == ["pinning needs an accelerator", "True False"], result.stderr[-2000:]


def test_a_changed_offload_module_is_refused_with_its_name(monkeypatch):
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    changed = Target(unpinned_offload.OFFLOAD_MODULE, "FSDPEngine._build_fsdp_module", "0" * 64)
    monkeypatch.setattr(
        unpinned_offload, "ADAPTATION", dataclasses.replace(unpinned_offload.ADAPTATION, targets=(changed,))
    )
    monkeypatch.setattr(transformer_impl, "CPUOffloadPolicy", CPUOffloadPolicy)  # unpatched
    with pytest.raises(guard.VerlChangedError, match=r"verl\.workers\.engine\.fsdp\.transformer_impl"):
        guard.apply(unpinned_offload.ADAPTATION)  # the changed record (its installer is the same): refused first


# ----- the torchrun process group (verl.trainer.sft_trainer) ---------------------------------------------------------


def test_verl_still_builds_the_duplicate_gloo_backend_string_on_the_torchrun_path():
    from verl.utils import distributed

    function = distributed.initialize_global_process_group
    function = getattr(function, "__wrapped__", function)
    assert SFT_GLOO_EXPECTED_SOURCE in inspect.getsource(function), (
        "verl.utils.distributed.initialize_global_process_group changed: re-check "
        "verl_mm_tools/adaptations/cpu/torchrun_gloo_backend.py"
    )
    assert tuple(inspect.signature(function).parameters) == ("timeout_second",)


TORCHRUN_INIT = """
    import json, torch, torch.distributed as dist
    import verl
    from verl.utils import distributed
    try:
        ranks = distributed.initialize_global_process_group(timeout_second=60)
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
    else:
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        print(json.dumps({"ranks": list(ranks), "backend": dist.get_backend(), "sum": tensor.tolist()}))
"""


def _torchrun_init(apply_patch: bool) -> str:
    """verl's SFT trainer's process-group start, in a fresh interpreter with torchrun's environment."""
    code = textwrap.dedent(TORCHRUN_INIT)
    if not apply_patch:  # the plugin patched it (VERL_PLATFORM=cpu): call verl's own
        code = code.replace("initialize_global_process_group(", "initialize_global_process_group.__wrapped__(")
    env = dict(
        os.environ,
        VERL_PLATFORM="cpu",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_torchrun_gloo_patch_lets_verls_sft_trainer_start_its_process_group_on_cpu():
    assert _torchrun_init(apply_patch=True) == '{"ranks": [0, 0, 1], "backend": "cpu:gloo", "sum": [1.0, 1.0]}'


def test_without_the_torchrun_gloo_patch_torch_rejects_verls_backend_string_on_cpu():
    """Why the patch exists ("ValueError: Duplicate device type cpu in backend string"). If this starts passing,
    verl fixed it upstream and the patch can go."""
    outcome = _torchrun_init(apply_patch=False)
    assert '"error"' in outcome and "cpu:gloo,cpu:gloo" in outcome.replace(" ", ""), outcome


# ----- the dtype of the saved Hugging Face model ---------------------------------------------------------------------


def test_verl_still_saves_the_hf_model_through_a_bfloat16_model():
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    method = FSDPCheckpointManager.save_checkpoint
    method = getattr(method, "__wrapped__", method)
    assert HF_SAVE_EXPECTED_SOURCE in inspect.getsource(method), (
        "verl's FSDPCheckpointManager.save_checkpoint changed: re-check verl_mm_tools/adaptations/cpu/saved_hf_dtype.py"
    )


def save_hf_model_as_verl_does(out, rendezvous) -> tuple[list[str], set]:
    """The tiny Qwen2.5-VL (float32) under FSDP2 on one gloo rank, saved by verl's checkpoint manager with
    ``save_contents: [hf_model]`` as the SFT trainer saves it; returns the saved config's dtypes and the dtypes a
    plain ``from_pretrained`` of the folder loads."""
    import json

    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from verl_mm_tools.tiny import tiny_model_path

    path = tiny_model_path()
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    try:
        fully_shard(model)
        contents = OmegaConf.create({"save_contents": ["hf_model"], "load_contents": ["hf_model"]})
        manager = FSDPCheckpointManager(
            model, processing_class=AutoProcessor.from_pretrained(path), checkpoint_config=contents
        )
        manager.save_checkpoint(str(out))
    finally:
        dist.destroy_process_group()
    config = json.loads((out / "huggingface" / "config.json").read_text())
    dtypes = [config["dtype"], config["text_config"]["dtype"], config["vision_config"]["dtype"]]
    loaded = AutoModelForImageTextToText.from_pretrained(out / "huggingface")
    return dtypes, {parameter.dtype for parameter in loaded.parameters()}


def test_verl_saves_float32_weights_under_a_bfloat16_config(tmp_path, monkeypatch):
    """Why saved_hf_dtype exists: the folder loads as bfloat16 although the weights are float32. If this fails, verl
    writes the weights' dtype itself and the patch can go."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    verls = FSDPCheckpointManager.save_checkpoint
    monkeypatch.setattr(FSDPCheckpointManager, "save_checkpoint", getattr(verls, "__wrapped__", verls))
    dtypes, loaded = save_hf_model_as_verl_does(tmp_path / "step", tmp_path / "rendezvous")
    assert dtypes == ["bfloat16", "bfloat16", "bfloat16"]
    assert loaded == {torch.bfloat16}


def test_the_patched_save_records_the_weights_dtype(tmp_path, monkeypatch):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    verls = FSDPCheckpointManager.save_checkpoint
    monkeypatch.setattr(FSDPCheckpointManager, "save_checkpoint", getattr(verls, "__wrapped__", verls))  # restored
    guard.apply(saved_hf_dtype.ADAPTATION)
    guard.apply(saved_hf_dtype.ADAPTATION)  # idempotent
    dtypes, loaded = save_hf_model_as_verl_does(tmp_path / "step", tmp_path / "rendezvous")
    assert dtypes == ["float32", "float32", "float32"]
    assert loaded == {torch.float32}


def test_weights_of_several_dtypes_leave_the_config_alone(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text('{"dtype": "bfloat16"}')
    saved_hf_dtype.record_weights_dtype(tmp_path)
    assert (tmp_path / "config.json").read_text() == '{"dtype": "bfloat16"}'
