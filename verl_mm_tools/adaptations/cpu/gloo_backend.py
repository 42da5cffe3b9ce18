"""verl's Ray workers' process group on CPU: verl builds the backend ``"cpu:gloo,cpu:gloo"``, which torch rejects."""

from __future__ import annotations

from collections.abc import Callable

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

CPU_BACKEND = "cpu:gloo"
TARGET = Target(
    "verl.utils.distributed",
    "initialize_global_process_group_ray",
    "761a94d1a2e058d31a0ac231c89a142abf5daf822e333bac75e84cafcf7507ac",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what='passes `backend="cpu:gloo"` unless the caller chose one',
    why='verl builds `"cpu:gloo,{device}:{backend}"`, on CPU `"cpu:gloo,cpu:gloo"`, which torch rejects',
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_without_the_gloo_patch_torch_rejects_verls_backend_string_on_cpu`",
)


@ADAPTATION.replaces(TARGET)
def initialize_global_process_group_ray(
    original: Callable[..., None], timeout_second: float | None = None, backend: str | None = None
) -> None:
    return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)
