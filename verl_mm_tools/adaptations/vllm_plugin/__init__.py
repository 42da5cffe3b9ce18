"""A vLLM plugin: ``adapt_vllm``, loaded by vLLM in each of its own processes through the entry point
``vllm.general_plugins`` (setup.py). It changes vLLM's code where verl's rollout needs it, one module per change, each
declaring its ``ADAPTATION`` record, installed by ``guard.apply`` (which checks its target's source hash first).

On every platform:

- ``video_metadata``: Qwen2.5-VL's prompt videos keep their metadata, so vLLM's video positions are the trainer's
  (applied when vLLM imports the model's module).

On vLLM's CPU platform only:

- ``linear_weights``: linear layers keep a loadable weight parameter after vLLM packs it (verl's weight sync).
- ``moe_weights``: expert layers keep loadable weights after vLLM packs them.
- ``moe_silu``: the torch path of vLLM's CPU fused MoE (CPUs without AVX-512) computes SiLU-and-mul without building
  a ``CustomOp`` outside vLLM's config context.
- ``eager_sampler``: the CPU sampler runs without ``torch.compile`` (20-35 s of every engine start).

These modules must import without verl and torch (vLLM imports them in every engine process, ``vllm serve`` too).
"""

from __future__ import annotations

import functools

from verl_mm_tools.adaptations.guard import apply_declared
from verl_mm_tools.adaptations.import_order import call_after_import
from verl_mm_tools.adaptations.vllm_plugin import eager_sampler, linear_weights, moe_silu, moe_weights, video_metadata

VLLM_CPU_ADAPTATIONS = (linear_weights, moe_weights, moe_silu, eager_sampler)
VLLM_ADAPTATIONS = (video_metadata,)  # each applied when vLLM imports the module of its last target


def adapt_vllm() -> None:
    """vLLM plugin: apply every adaptation of vLLM's code (each one once), the CPU ones on vLLM's CPU platform."""
    from vllm.platforms import current_platform

    for adaptation in VLLM_ADAPTATIONS:
        module = adaptation.ADAPTATION.targets[-1].module
        call_after_import(module, functools.partial(apply_declared, adaptation))
    if not current_platform.is_cpu():
        return
    for adaptation in VLLM_CPU_ADAPTATIONS:
        apply_declared(adaptation)
