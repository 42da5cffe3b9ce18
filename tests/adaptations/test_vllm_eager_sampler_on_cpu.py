"""vLLM's CPU sampler draws its random tokens eagerly (``adaptations/vllm_plugin/eager_sampler.py``): vLLM's own draw is
a ``torch.compile`` function, and the replacement draws from the same distribution."""

from __future__ import annotations

import pytest
import torch

from verl_mm_tools.adaptations.guard import PATCHED_MARK, source_sha256
from verl_mm_tools.adaptations.vllm_plugin import adapt_vllm_cpu, eager_sampler

DRAWS = 200_000


@pytest.fixture(scope="module")
def sampler():
    from vllm.v1.sample.ops import topk_topp_sampler

    original = topk_topp_sampler.compiled_random_sample
    adapt_vllm_cpu()
    return original, topk_topp_sampler


def test_vllms_own_draw_is_a_torch_compile_function(sampler):
    original, _ = sampler
    if getattr(original, PATCHED_MARK, False):  # another test of this process loaded the plugin first
        original = original.__wrapped__
    # what costs every engine start its compile: inductor's wrapper, not the eager function inside it
    assert original._torchdynamo_orig_callable.__name__ == "compiled_random_sample"
    assert source_sha256(original) == eager_sampler.TARGET.sha256


def test_the_plugin_puts_the_eager_draw_where_forward_cpu_looks_it_up(sampler):
    _, module = sampler
    installed = module.compiled_random_sample
    assert getattr(installed, PATCHED_MARK) is True
    assert not hasattr(installed, "_torchdynamo_orig_callable")
    assert source_sha256(installed) == eager_sampler.TARGET.sha256  # the guard still reads vLLM's original
    adapt_vllm_cpu()  # a second load of the plugin changes nothing
    assert module.compiled_random_sample is installed
    torch.manual_seed(7)
    logits = torch.randn(16, 151_936)
    torch.manual_seed(11)
    drawn = installed(logits.clone())
    torch.manual_seed(11)
    assert torch.equal(drawn, eager_sampler.random_sample(logits.clone()))
    assert drawn.shape == (16,) and drawn.dtype == torch.int64


def test_the_eager_draw_follows_the_softmax_and_never_draws_a_masked_token():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, float("-inf"), 0.5]]).repeat(DRAWS, 1)
    torch.manual_seed(0)
    drawn = eager_sampler.random_sample(logits)
    frequencies = torch.bincount(drawn, minlength=6).double() / DRAWS
    expected = logits[0].double().softmax(-1)
    assert frequencies[4] == 0  # top-k / top-p mask with -inf
    # binomial standard deviation at 200,000 draws is at most 0.0011: five of them
    assert torch.allclose(frequencies, expected, atol=0.0056), (frequencies, expected)


def test_a_zero_uniform_draw_excludes_its_token_instead_of_choosing_it(monkeypatch):
    """``u`` = 0 makes ``q`` infinite, so that token's ratio is 0; a ``q`` of 0 (``-log(1 - u)``) would have divided
    by zero and chosen it whatever its probability."""
    logits = torch.tensor([[5.0, -5.0, 0.0]])
    monkeypatch.setattr(torch, "rand_like", lambda probs: torch.tensor([[0.0, 0.5, 0.5]]))
    assert eager_sampler.random_sample(logits).tolist() == [2]
