"""verl's Ray workers' process group on CPU: verl builds the backend ``"cpu:gloo,cpu:gloo"``, which torch rejects."""

from __future__ import annotations

import functools
from types import ModuleType

from verl_mm_tools.adaptations.guard import checked, install
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

CPU_BACKEND = "cpu:gloo"
TARGET = Target(
    "verl.utils.distributed",
    "initialize_global_process_group_ray",
    "761a94d1a2e058d31a0ac231c89a142abf5daf822e333bac75e84cafcf7507ac",
)
ADAPTATION = Adaptation(
    row=4,
    section=Section.REPLACEMENTS,
    where="`adaptations/cpu/gloo_backend.py` (CPU platform only, `VERL_PLATFORM=cpu`)",
    targets=(TARGET,),
    what='passes `backend="cpu:gloo"` unless the caller chose one',
    why='verl builds `"cpu:gloo,{device}:{backend}"`, on CPU `"cpu:gloo,cpu:gloo"`, which torch rejects',
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_without_the_gloo_patch_torch_rejects_verls_backend_string_on_cpu`",
)


def apply(_module: ModuleType | None = None) -> None:
    found = checked(ADAPTATION)
    if found is None:
        return
    (original,) = found

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: float | None = None, backend: str | None = None) -> None:
        return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

    install(TARGET, original, initialize_global_process_group_ray)
