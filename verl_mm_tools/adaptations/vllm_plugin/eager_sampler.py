"""vLLM's CPU sampler compiles a four-line function with torch inductor in every engine process. ``TopKTopPSampler.
forward_cpu`` draws a random token through ``compiled_random_sample``, a ``torch.compile`` function (vLLM's workaround
for ``exponential_``, slow on x86 CPUs since torch 2.7). Its first call, during the engine's warm-up, starts
inductor's compile workers and a C++ build: 15-35 s of every vLLM engine start on this 2-core machine, with
``enforce_eager`` on and nothing else compiled. The replacement computes the same draw eagerly: the argmax of
``probs / q`` with ``q ~ Exp(1)``, ``q = -log(u)`` for ``u`` uniform on [0, 1), which is as fast as the compiled
function (12 against 20 ms for 16 rows of a 151,936-token vocabulary, 128 against 107 ms for 64 rows) and needs no
``exponential_``."""

from __future__ import annotations

import functools
import importlib
import logging

from verl_mm_tools.adaptations.guard import checked, mark
from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

logger = logging.getLogger(__name__)

SAMPLER_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"
TARGET = Target(
    SAMPLER_MODULE,
    "compiled_random_sample",
    "f55691fb743028e9bee95a02865c57f38885f33a5497f83c6b6261d04ce16c03",
)
ADAPTATION = Adaptation(
    row=39,
    section=Section.REPLACEMENTS,
    where="`adaptations/vllm_plugin/eager_sampler.py` (the same vLLM plugin as row 10)",
    targets=(TARGET,),
    what="the CPU sampler's random draw runs eagerly: `argmax(probs / q)` with `q = -log(u)`, `u` uniform on [0, 1) "
    "(an Exp(1) draw, as `exponential_` gives), without `torch.compile`",
    why="vLLM wraps the draw in `torch.compile`; its first call, in the engine's warm-up, starts inductor's compile "
    "workers and a C++ build: 15-35 s of every vLLM engine start on a 2-core CPU machine, though `enforce_eager` "
    "compiles nothing else",
    applies_to=f"vllm-cpu {VLLM_CPU_VERSION}",
    proof="`tests/adaptations/test_vllm_eager_sampler_on_cpu.py::test_vllms_own_draw_is_a_torch_compile_function`",
)


def apply() -> None:
    found = checked(ADAPTATION)
    if found is None:
        return
    (original,) = found

    @functools.wraps(original, updated=())  # not torch.compile's attributes
    def compiled_random_sample(logits):
        return random_sample(logits)

    # ``forward_cpu`` looks the function up in its module at each call
    setattr(importlib.import_module(SAMPLER_MODULE), TARGET.name, mark(compiled_random_sample))
    logger.debug("vLLM's CPU sampler draws eagerly, without torch.compile")


def random_sample(logits):
    """One token per row of ``logits``, drawn from their softmax: the Gumbel-max draw ``argmax(probs / q)`` with
    ``q ~ Exp(1)``. ``u`` = 0 gives ``q`` = inf, a ratio of 0, never a division by zero; ``u`` < 1, so ``q`` > 0."""
    import torch

    probs = logits.softmax(dim=-1, dtype=torch.float32)
    exponential = torch.rand_like(probs).log_().neg_()
    return probs.div_(exponential).argmax(dim=-1).view(-1)
