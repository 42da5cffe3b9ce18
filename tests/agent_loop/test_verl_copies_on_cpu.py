"""The parts of verl's ``ToolAgentLoop`` that the mm_tool loop re-implements rather than calls, pinned by a hash of
verl's source: a verl upgrade that changes one of them fails here, naming what to re-check. The loop calls verl's
``_handle_generating_state``, Continuous-Token builder, tool parser and helpers as they are (not pinned).

After re-checking a change (and porting it to the mm_tool part named), update the hash.
"""

from __future__ import annotations

import hashlib
import inspect

import pytest
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

# verl's method -> (sha256 prefix of its source in verl 0.9.1, where mm_tool re-implements it)
COPIED = {
    "run": ("4d3b05be93f3261c", "agent_loop/prompt.py (AgentData, tool selection) and agent_loop/output.py (fields)"),
    "_handle_pending_state": ("87d7a6091d944342", "MMToolAgentLoop._handle_pending_state (tool format view)"),
    "_handle_processing_tools_state": (
        "6fb81493273afe9b",
        "agent_loop/tool_runner.py and MMToolAgentLoop._merge_context_turn (sessions, budget)",
    ),
}


def source_hash(method) -> str:
    method = getattr(method, "__wrapped__", method)  # run is wrapped by verl's rollout trace
    return hashlib.sha256(inspect.getsource(method).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(COPIED))
def test_the_verl_code_mm_tool_re_implements_is_unchanged(name):
    expected, ours = COPIED[name]
    assert source_hash(getattr(ToolAgentLoop, name)) == expected, (
        f"verl's ToolAgentLoop.{name} changed since verl 0.9.1; mm_tool re-implements it in {ours}: port the change "
        "there (tests/agent_loop/test_parity_on_cpu.py checks the outputs still match), then update the hash here"
    )
