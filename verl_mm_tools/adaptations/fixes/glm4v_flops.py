"""GLM-V, every training step's metrics. verl's ``ESTIMATE_FUNC["glm4v"]`` is the Qwen2 estimator, which reads
``config.hidden_size``; transformers 5's ``Glm4vConfig`` keeps the language model's sizes in ``text_config`` only
("AttributeError: 'Glm4vConfig' object has no attribute 'hidden_size'" after the first update). Fixed: for a config
without root sizes the estimator gets its ``text_config``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.guard import calling, mark
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from transformers import PretrainedConfig

FLOPS_MODULE = "verl.utils.flops_counter"
TARGET = Target(
    FLOPS_MODULE, "_estimate_qwen2_flops", "cdfe1bd44db56fc162adf55efe994858e2b8bad7985a244e1b85653d44e34ff6"
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="gives the Qwen2 estimator the config's `text_config` where the root has no sizes",
    why="transformers 5's `Glm4vConfig` has no root `hidden_size`: the MFU estimate raises after the first update",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_glm4v_flops_estimate_fails_on_transformers_5_and_the_fix_counts_the_language_model`",
)


# not a replacement of the target: verl's Qwen2 models keep it; the fix goes in ESTIMATE_FUNC["glm4v"] only
@ADAPTATION.implements
def estimate_glm4v_flops(
    estimate: Callable[..., float],
    config: PretrainedConfig,
    tokens_sum: int,
    batch_seqlens: Sequence[int],
    delta_time: float,
) -> float:
    language = config if hasattr(config, "hidden_size") else config.text_config
    return estimate(language, tokens_sum, batch_seqlens, delta_time)


@ADAPTATION.installs
def install(estimate: Callable[..., float]) -> None:
    """``estimate_glm4v_flops`` as ``ESTIMATE_FUNC["glm4v"]``, where verl has the Qwen2 estimator."""
    flops = importlib.import_module(FLOPS_MODULE)
    if flops.ESTIMATE_FUNC.get("glm4v") is not estimate:  # fixed already, or verl no longer uses it for GLM-V
        return
    flops.ESTIMATE_FUNC["glm4v"] = mark(calling(estimate_glm4v_flops, estimate))
