"""verl's torchrun process group (``verl.trainer.sft_trainer``) on CPU: the same ``"cpu:gloo,cpu:gloo"`` as
``gloo_backend``, and the function takes no backend to pass on."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

from verl_mm_tools.adaptations.cpu.gloo_backend import CPU_BACKEND
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

TARGET = Target(
    "verl.utils.distributed",
    "initialize_global_process_group",
    "33a5452c4dde00591e00692a5f967cc7b424a3b7ebd9da7cb23697209ddbd0e1",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what='verl\'s function with the backend `"cpu:gloo"` (and no `set_device`, a no-op on CPU)',
    why='verl builds `"cpu:gloo,{device}:{backend}"`, on CPU `"cpu:gloo,cpu:gloo"`: "ValueError: Duplicate device '
    'type cpu in backend string" before the SFT trainer starts; the function takes no backend to pass on '
    "(`gloo_backend` is its Ray twin)",
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::"
    "test_without_the_torchrun_gloo_patch_torch_rejects_verls_backend_string_on_cpu`",
)


# verl's function takes no backend to pass on, so this is verl's, with "cpu:gloo" (set_device is a no-op here)
@ADAPTATION.replaces(TARGET)
def initialize_global_process_group(
    _original: Callable[..., tuple[int, int, int]], timeout_second: float = 36000
) -> tuple[int, int, int]:
    import torch.distributed

    torch.distributed.init_process_group(
        backend=CPU_BACKEND,
        timeout=timedelta(seconds=timeout_second),
        init_method=os.environ.get("DIST_INIT_METHOD", None),
    )
    return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
