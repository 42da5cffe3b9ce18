"""vLLM's CPU sampler runs without torch.compile (``adaptations/vllm_plugin/eager_sampler.py``): vLLM's own draw and
rank are ``torch.compile`` functions; the replacements give the same ranks and draw from the same distribution."""

from __future__ import annotations

import pytest
import torch

from verl_mm_tools.adaptations.guard import PATCHED_MARK, source_sha256
from verl_mm_tools.adaptations.vllm_plugin import adapt_vllm, eager_sampler

DRAWS = 200_000
VOCABULARY = 151_936  # Qwen's


@pytest.fixture(scope="module")
def vllm_modules():
    """vLLM's originals, read before the plugin replaces them (or, when another test of this process loaded the
    plugin first, through ``__wrapped__``), then the sampler modules with the plugin applied."""
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs, topk_topp_sampler

    originals = [topk_topp_sampler.compiled_random_sample, logprobs.batched_count_greater_than]
    originals = [code.__wrapped__ if getattr(code, PATCHED_MARK, False) else code for code in originals]
    adapt_vllm()
    return originals, topk_topp_sampler, logprobs, sampler


def test_vllms_own_functions_are_torch_compile_functions(vllm_modules):
    originals, *_ = vllm_modules
    for original, target in zip(originals, eager_sampler.ADAPTATION.targets, strict=True):
        # what costs a compile in every engine process: inductor's wrapper, not the function inside it
        assert original._torchdynamo_orig_callable.__name__ == target.name
        assert source_sha256(original) == target.sha256


def test_the_plugin_puts_both_where_vllms_sampler_calls_them(vllm_modules):
    _, draw_module, rank_module, sampler = vllm_modules
    draw, rank = draw_module.compiled_random_sample, rank_module.batched_count_greater_than
    assert sampler.batched_count_greater_than is rank  # bound by name at the sampler's import
    for installed, target in zip((draw, rank), eager_sampler.ADAPTATION.targets, strict=True):
        assert getattr(installed, PATCHED_MARK) is True
        assert not hasattr(installed, "_torchdynamo_orig_callable")
        assert source_sha256(installed) == target.sha256  # the guard still reads vLLM's original
    adapt_vllm()  # a second load of the plugin changes nothing
    assert (draw_module.compiled_random_sample, rank_module.batched_count_greater_than) == (draw, rank)


def test_the_rank_is_vllms_function_body_exactly(vllm_modules):
    originals, _, rank_module, _ = vllm_modules
    generator = torch.Generator().manual_seed(3)
    logprobs = torch.randn(16, VOCABULARY, generator=generator).log_softmax(-1)
    chosen = logprobs.gather(-1, torch.randint(VOCABULARY, (16, 1), generator=generator))
    ranks = rank_module.batched_count_greater_than(logprobs, chosen)
    assert torch.equal(ranks, originals[1]._torchdynamo_orig_callable(logprobs, chosen))
    assert ranks.tolist() == [int((row >= value).sum()) for row, value in zip(logprobs, chosen, strict=True)]
    assert rank_module.batched_count_greater_than(logprobs, logprobs.max(-1, keepdim=True).values).tolist() == [1] * 16


def test_the_draw_follows_the_softmax_and_never_draws_a_masked_token(vllm_modules):
    _, draw_module, _, _ = vllm_modules
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, float("-inf"), 0.5]]).repeat(DRAWS, 1)
    torch.manual_seed(0)
    drawn = draw_module.compiled_random_sample(logits)
    assert drawn.shape == (DRAWS,) and drawn.dtype == torch.int64
    frequencies = torch.bincount(drawn, minlength=6).double() / DRAWS
    expected = logits[0].double().softmax(-1)
    assert frequencies[4] == 0  # masked by top-k / top-p with -inf
    # a binomial standard deviation at 200,000 draws is at most 0.0011: five of them
    assert torch.allclose(frequencies, expected, atol=0.0056), (frequencies, expected)


def test_a_zero_uniform_draw_excludes_its_token_instead_of_choosing_it(monkeypatch):
    """``u`` = 0 makes ``q`` infinite, so that token's ratio is 0; a ``q`` of 0 (``-log(1 - u)``) would have divided
    by zero and chosen it whatever its probability."""
    logits = torch.tensor([[5.0, -5.0, 0.0]])
    monkeypatch.setattr(torch, "rand_like", lambda probs: torch.tensor([[0.0, 0.5, 0.5]]))
    vllms_draw = None  # passed first, never called
    assert eager_sampler.random_sample(vllms_draw, logits).tolist() == [2]
