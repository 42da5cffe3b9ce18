"""The changes to verl a CPU run needs, one module each, applied only when the CPU platform is selected
(``VERL_PLATFORM=cpu``, by ``verl_mm_tools.cpu.register_cpu_backend``). Each is installed by ``guard.apply``, which
checks its targets first.

verl's modules bind these functions by name at import (``from verl.utils.distributed import ...``), so a patch replaces
the function in its home module and in every already-imported verl module that bound it. Each is applied right after
verl imports its target's module (``import_order.call_after_import``), before any other module can bind the name, and
a process that never imports it pays nothing for it.
"""

from __future__ import annotations

import functools

from verl_mm_tools.adaptations.cpu import (
    equal_length_position_ids,
    gloo_backend,
    saved_hf_dtype,
    sharded_save_to_cpu,
    torchrun_gloo_backend,
    unpinned_offload,
    v1_position_ids,
)
from verl_mm_tools.adaptations.guard import apply_declared
from verl_mm_tools.adaptations.import_order import call_after_import

CPU_PATCHES = (
    gloo_backend,
    torchrun_gloo_backend,
    equal_length_position_ids,
    v1_position_ids,
    unpinned_offload,
    sharded_save_to_cpu,
    saved_hf_dtype,
)


def apply_cpu_patches() -> None:
    """Each patch right after verl imports the module of its target: at once where verl imported it already."""
    for patch in CPU_PATCHES:
        call_after_import(patch.ADAPTATION.targets[0].module, functools.partial(apply_declared, patch))
