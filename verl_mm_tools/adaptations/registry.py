"""Every adaptation's record, in one list: what ``docs/verl_adaptations.md`` is generated from (``inventory.py``) and
what the tests check against the installed verl and vLLM. Imports verl (the rows of the agent-loop manager and of the
loop's output live with their subclasses); the plugin, the CPU backend and the vLLM plugin apply their own groups
without it."""

from __future__ import annotations

from verl_mm_tools.adaptations import cpu, fixes, guard, manager_tq, touchpoints, vllm_plugin
from verl_mm_tools.adaptations.record import Adaptation
from verl_mm_tools.agent_loop import loop_output

PATCHES = (*fixes.EVERY_RUN, *cpu.CPU_PATCHES, *vllm_plugin.VLLM_ADAPTATIONS)
ADAPTATIONS: tuple[Adaptation, ...] = tuple(
    sorted(
        (
            guard.ADAPTATION,
            manager_tq.ADAPTATION,
            loop_output.ADAPTATION,
            *touchpoints.TOUCHPOINTS,
            *(patch.ADAPTATION for patch in PATCHES),
        ),
        key=lambda adaptation: adaptation.row,
    )
)
