"""verl builds forward-only models (a KL loss's reference policy) with ``CPUOffloadPolicy(pin_memory=True)``, and
pinning host memory needs an accelerator: the module's ``CPUOffloadPolicy`` becomes a subclass that never pins (the
parameters already live in host memory)."""

from __future__ import annotations

import importlib
from typing import Any

from verl_mm_tools.adaptations.guard import PATCHED_MARK, mark
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

OFFLOAD_MODULE = "verl.workers.engine.fsdp.transformer_impl"
TARGET = Target(  # the method that builds the policy: the module's CPUOffloadPolicy is what it calls
    OFFLOAD_MODULE, "FSDPEngine._build_fsdp_module", "35b7b539858443e45894da2d9675fb5a1d7b2bbb7c7c8b35605b0746d3179213"
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="a subclass that never pins memory",
    why="verl builds forward-only models (a KL loss's reference policy) with `CPUOffloadPolicy(pin_memory=True)`; "
    "pinning needs an accelerator",
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_verl_still_builds_forward_only_models_with_pinned_offload`"
    " with `::test_pinned_offload_fails_without_an_accelerator_and_the_patched_policy_never_pins`",
)


@ADAPTATION.installs
def unpinned_offload_policy(_build_fsdp_module: object) -> None:
    """The module's ``CPUOffloadPolicy`` (``OFFLOAD_MODULE``), the class the checked target calls, becomes a subclass
    that never pins. Once: the target is not what is replaced, so the guard cannot tell; the class's mark does."""
    module: Any = importlib.import_module(OFFLOAD_MODULE)  # patched below
    if getattr(module.CPUOffloadPolicy, PATCHED_MARK, False):
        return

    class UnpinnedCPUOffloadPolicy(module.CPUOffloadPolicy):  # original, verl's class
        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    module.CPUOffloadPolicy = mark(UnpinnedCPUOffloadPolicy)
