"""verl builds forward-only models (a KL loss's reference policy) with ``CPUOffloadPolicy(pin_memory=True)``, and
pinning host memory needs an accelerator: the module's ``CPUOffloadPolicy`` becomes a subclass that never pins (the
parameters already live in host memory)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from verl_mm_tools.adaptations.guard import PATCHED_MARK, checked, mark
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

OFFLOAD_MODULE = "verl.workers.engine.fsdp.transformer_impl"
TARGET = Target(  # the method that builds the policy: the module's CPUOffloadPolicy is what it calls
    OFFLOAD_MODULE, "FSDPEngine._build_fsdp_module", "35b7b539858443e45894da2d9675fb5a1d7b2bbb7c7c8b35605b0746d3179213"
)
ADAPTATION = Adaptation(
    row=7,
    section=Section.REPLACEMENTS,
    where=f"`adaptations/cpu/unpinned_offload.py`: `{OFFLOAD_MODULE}.CPUOffloadPolicy`, the class the target calls "
    "(CPU only)",
    targets=(TARGET,),
    what="a subclass that never pins memory",
    why="verl builds forward-only models (a KL loss's reference policy) with `CPUOffloadPolicy(pin_memory=True)`; "
    "pinning needs an accelerator",
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_verl_still_builds_forward_only_models_with_pinned_offload`"
    " with `::test_pinned_offload_fails_without_an_accelerator_and_the_patched_policy_never_pins`",
)


def apply(_module: ModuleType | None = None) -> None:
    module: Any = importlib.import_module(OFFLOAD_MODULE)  # patched below
    original = module.CPUOffloadPolicy
    if getattr(original, PATCHED_MARK, False) or checked(ADAPTATION) is None:
        return

    class UnpinnedCPUOffloadPolicy(module.CPUOffloadPolicy):  # original, verl's class
        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    module.CPUOffloadPolicy = mark(UnpinnedCPUOffloadPolicy)
