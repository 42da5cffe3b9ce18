"""Teach verl's tool loader the ``remote:`` key: its ``initialize_tools_from_config`` is replaced (checked, as every
target of this package) by one that builds a ``RemoteTool`` (``verl_mm_tools.remote.tool``) for each entry with
``remote:``. Applied when verl imports its tool registry, as every fix of this package."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.tools.base_tool import BaseTool

TARGET = Target(
    "verl.tools.tool_registry",
    "initialize_tools_from_config",
    "7ab06dbb057968545ea13115f120910135eb9b9e64a78fbfaaba7ca646744b00",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="builds a `RemoteTool` (a Ray actor pool) for each tool-YAML entry with `remote:`, leaves every other entry "
    "to verl",
    why="verl's tool YAML has no way to run a tool outside the trainer's agent-loop workers",
    applies_to=VERL,
    proof="`tests/adaptations/test_tool_loader_on_cpu.py::"
    "test_verls_own_loader_ignores_remote_and_builds_the_tool_in_process` (verl silently drops `remote:` and builds "
    "the tool in-process)",
)


@ADAPTATION.replaces(TARGET)
def initialize_tools_from_config(
    original: Callable[..., list[BaseTool]], tools_config_file: str | Path | IO[str]
) -> list[BaseTool]:
    # imported at the call (verl loads its tools once per worker): the remote tool imports verl's tool modules, which
    # the plugin's load must not
    from verl_mm_tools.remote.tool import with_remote_tools

    return with_remote_tools(original)(tools_config_file)
