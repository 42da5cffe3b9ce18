"""A vLLM plugin that keeps verl's weight sync into vllm-cpu working: ``keep_linear_weights_loadable``, loaded by
vLLM in each of its own processes through the entry point ``vllm.general_plugins`` (setup.py).

On CPU, vLLM's ``UnquantizedLinearMethod.process_weights_after_loading`` pre-packs each linear weight for oneDNN and
replaces the parameter with an empty one: verl's weight sync (``vLLMColocateWorkerExtension._update_weights`` ->
``model.load_weights``) then has nothing to load into ("Attempted to load weight (torch.Size([96, 32])) into parameter
(torch.Size([0]))"). The patched method keeps the parameter; verl calls ``process_weights_after_loading`` again after
every sync, which packs the new weights. Inert unless vLLM runs on its CPU platform; it checks vLLM still looks the
way it assumes and fails loudly otherwise.

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
OWNER = "verl_mm_tools/adaptations/vllm_cpu_weights.py"


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
        f"vllm-cpu=={VLLM_CPU_VERSION} (scripts/install_cpu.sh)",
    )
    if original is None:
        return

    @functools.wraps(original)
    def process_weights_after_loading(self, layer) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    install_method(*LINEAR_METHOD, "process_weights_after_loading", process_weights_after_loading)
    logger.debug("vLLM CPU linear layers keep their weights loadable")
