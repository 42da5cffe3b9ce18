"""Teach verl's tool loader the ``remote:`` key: its ``initialize_tools_from_config`` is replaced (checked, as every
target of this package) by one that builds a ``RemoteTool`` (``verl_mm_tools.remote.tool``) for each entry with
``remote:``. Applied when verl imports its tool registry, as every fix of this package."""

from __future__ import annotations

import functools
from types import ModuleType

from verl_mm_tools.adaptations.guard import checked, install
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

TARGET = Target(
    "verl.tools.tool_registry",
    "initialize_tools_from_config",
    "7ab06dbb057968545ea13115f120910135eb9b9e64a78fbfaaba7ca646744b00",
)
ADAPTATION = Adaptation(
    row=9,
    section=Section.REPLACEMENTS,
    where="`adaptations/fixes/remote_tools.py` (every run, installed when verl imports its tool registry; the tool "
    "itself is `remote/tool.py`)",
    targets=(TARGET,),
    what="builds a `RemoteTool` (a Ray actor pool) for each tool-YAML entry with `remote:`, leaves every other entry "
    "to verl",
    why="verl's tool YAML has no way to run a tool outside the trainer's agent-loop workers",
    applies_to=VERL,
    proof="`tests/adaptations/test_tool_loader_on_cpu.py::"
    "test_verls_own_loader_ignores_remote_and_builds_the_tool_in_process` (verl silently drops `remote:` and builds "
    "the tool in-process)",
)


def apply(_module: ModuleType | None = None) -> None:
    found = checked(ADAPTATION)
    if found is None:
        return
    (original,) = found
    from verl_mm_tools.remote.tool import with_remote_tools

    # wrapped: the target's source (and hash) stays reachable through __wrapped__, as for every replacement
    install(TARGET, original, functools.update_wrapper(with_remote_tools(original), original))
