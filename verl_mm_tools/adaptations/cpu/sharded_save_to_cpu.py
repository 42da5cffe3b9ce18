"""``fsdp2_sharded_save_to_cpu`` (the ``separate_async`` trainer's ``DetachActorWorker`` keeps pi_old with it) copies
each shard with ``.cpu()``, which on CPU returns the live parameter itself: the "saved" model would follow every
update, and ``restore_model_from_cpu`` would restore the current weights instead of pi_old, silently."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    # verl's: each name's local shard and its spec
    ShardedState = dict[str, tuple[torch.Tensor, DTensorSpec]]

TARGET = Target(
    "verl.utils.fsdp_utils",
    "fsdp2_sharded_save_to_cpu",
    "ecdb335bb1d3948f27c96dc6be0edc2c93bcc94d7c19c2f52fbfca489edaab7e",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="clones the saved shards that alias a live parameter",
    why="on CPU `.cpu()` returns the parameter itself: `separate_async`'s saved pi_old would follow every update and "
    'be "restored" silently wrong',
    applies_to=VERL,
    proof="`tests/cpu/test_checkpoint_engine_on_cpu.py::test_separate_async_keeps_a_real_copy_of_pi_old_on_cpu` "
    '("verl\'s save follows the update")',
)


@ADAPTATION.replaces(TARGET)
def fsdp2_sharded_save_to_cpu(
    original: Callable[[torch.nn.Module], tuple[ShardedState, DTensorSpec]], model: torch.nn.Module
) -> tuple[ShardedState, DTensorSpec]:
    cpu_sharded_state, global_spec = original(model)
    return detach_from_parameters(cpu_sharded_state, model), global_spec


def detach_from_parameters(cpu_sharded_state: ShardedState, model: torch.nn.Module) -> ShardedState:
    """``cpu_sharded_state`` ({name: (tensor, spec)}) with every tensor that shares memory with one of ``model``'s
    parameters (an FSDP2 parameter's local shard) replaced by a copy."""
    # A DTensor has no storage of its own (asking raises); its shard, the one verl's save reads, has.
    live = {getattr(param, "_local_tensor", param).untyped_storage().data_ptr() for param in model.parameters()}
    return {
        name: (tensor.clone() if tensor.untyped_storage().data_ptr() in live else tensor, spec)
        for name, (tensor, spec) in cpu_sharded_state.items()
    }
