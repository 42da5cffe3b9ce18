"""Every adaptation's record, in one list: what ``docs/verl_adaptations.md`` is generated from (``inventory.py``) and
what the tests check against the installed verl and vLLM. Imports verl (the agent-loop manager's row lives with its
subclass); the plugin, the CPU backend and the vLLM plugin apply their own groups without it."""

from __future__ import annotations

from verl_mm_tools.adaptations import cpu, fixes, guard, manager_tq, touchpoints, vllm_plugin
from verl_mm_tools.adaptations.record import Adaptation

PATCHES = (*fixes.EVERY_RUN, *cpu.CPU_PATCHES, *vllm_plugin.VLLM_ADAPTATIONS)
ADAPTATIONS: tuple[Adaptation, ...] = tuple(
    sorted(
        (guard.ADAPTATION, manager_tq.ADAPTATION, *touchpoints.TOUCHPOINTS, *(patch.ADAPTATION for patch in PATCHES)),
        key=lambda adaptation: adaptation.row,
    )
)
