"""GLM-V, every training step's metrics. verl's ``ESTIMATE_FUNC["glm4v"]`` is the Qwen2 estimator, which reads
``config.hidden_size``; transformers 5's ``Glm4vConfig`` keeps the language model's sizes in ``text_config`` only
("AttributeError: 'Glm4vConfig' object has no attribute 'hidden_size'" after the first update). Fixed: for a config
without root sizes the estimator gets its ``text_config``."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.guard import checked, mark
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from transformers import PretrainedConfig

FLOPS_MODULE = "verl.utils.flops_counter"
TARGET = Target(
    FLOPS_MODULE, "_estimate_qwen2_flops", "cdfe1bd44db56fc162adf55efe994858e2b8bad7985a244e1b85653d44e34ff6"
)
ADAPTATION = Adaptation(
    row=27,
    section=Section.REPLACEMENTS,
    where=f'`adaptations/fixes/glm4v_flops.py`: `{FLOPS_MODULE}.ESTIMATE_FUNC["glm4v"]`, the target (every run)',
    targets=(TARGET,),
    what="gives the Qwen2 estimator the config's `text_config` where the root has no sizes",
    why="transformers 5's `Glm4vConfig` has no root `hidden_size`: the MFU estimate raises after the first update",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_glm4v_flops_estimate_fails_on_transformers_5_and_the_fix_counts_the_language_model`",
)


def apply(_module: ModuleType | None = None) -> None:
    flops = importlib.import_module(FLOPS_MODULE)
    found = checked(ADAPTATION)
    if found is None:
        return
    (estimate,) = found
    if flops.ESTIMATE_FUNC.get("glm4v") is not estimate:  # fixed already, or verl no longer uses it for GLM-V
        return

    @functools.wraps(estimate)
    def estimate_glm4v_flops(
        config: PretrainedConfig, tokens_sum: int, batch_seqlens: Sequence[int], delta_time: float
    ) -> float:
        language = config if hasattr(config, "hidden_size") else config.text_config
        return estimate(language, tokens_sum, batch_seqlens, delta_time)

    flops.ESTIMATE_FUNC["glm4v"] = mark(estimate_glm4v_flops)
