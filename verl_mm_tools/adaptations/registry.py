"""Every adaptation's record, in one list: what ``docs/verl_adaptations.md`` is generated from (``inventory.py``) and
what the tests check against the installed verl and vLLM. Collects each row from where it is declared: the
replacements' modules, the subclasses and copies of verl's code (the loop, its output, the step hooks, the test
harness's worker, the resume recording), and the rows that have no one module (``touchpoints``). Imports verl and
sits above every layer it reads (tests/test_layout_on_cpu.py); the plugin, the CPU backend and the vLLM plugin apply
their own groups without it."""

from __future__ import annotations

from verl_mm_tools.adaptations import cpu, fixes, guard, manager_tq, touchpoints, vllm_plugin
from verl_mm_tools.adaptations.record import Adaptation
from verl_mm_tools.agent_loop import loop_output, mm_tool_loop, resumes
from verl_mm_tools.runtime import workers
from verl_mm_tools.step_hook import fully_async, manager, replay_buffer

PATCHES = (*fixes.EVERY_RUN, *cpu.CPU_PATCHES, *vllm_plugin.VLLM_ADAPTATIONS)
ADAPTATIONS: tuple[Adaptation, ...] = tuple(
    sorted(
        (
            guard.ADAPTATION,
            manager_tq.ADAPTATION,
            loop_output.ADAPTATION,
            mm_tool_loop.ADAPTATION,
            resumes.ADAPTATION,
            workers.ADAPTATION,
            fully_async.ADAPTATION,
            manager.ADAPTATION,
            replay_buffer.ADAPTATION,
            *touchpoints.TOUCHPOINTS,
            *(patch.ADAPTATION for patch in PATCHES),
        ),
        key=lambda adaptation: adaptation.row,
    )
)
