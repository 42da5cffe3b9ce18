"""Gemma 4, every tool call with a list or object argument. verl's ``Gemma4ToolParser._parse_arguments`` reads a
value as a ``<|"|>``-quoted string or as the bare text up to the next ``,`` or ``}``, so
``call:zoom_in{bbox_2d:[440,10,600,300]}`` becomes ``{"bbox_2d": "[440"}`` and an object value ``box:{x:1,y:2}``
becomes ``"{x:1"`` plus a stray top-level ``y``. Fixed: the arguments are read by
``verl_mm_tools.parsers.gemma4.parse_gemma4_arguments``; malformed text raises ``ValueError``, which verl's
``extract_tool_calls`` logs for that one call (so that method is pinned too). verl's call regex
(``call:NAME{...}<tool_call|>``, lazy) is kept: a call only ends at ``}<tool_call|>``, so nested objects and braces
inside strings reach the parser whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.parsers.gemma4 import parse_gemma4_arguments

if TYPE_CHECKING:
    from verl.experimental.agent_loop.tool_parser import Gemma4ToolParser

TOOL_PARSER_MODULE = "verl.experimental.agent_loop.tool_parser"
PARSE = Target(
    TOOL_PARSER_MODULE,
    "Gemma4ToolParser._parse_arguments",
    "9e5b684128b2e0077e2c86d41b613f0c72f6ecb1b5a3de853c18b7d217936dae",
)
# not replaced: the fix relies on verl parsing each call on its own and logging (not raising) a call whose arguments
# raise
EXTRACT = Target(
    TOOL_PARSER_MODULE,
    "Gemma4ToolParser.extract_tool_calls",
    "b5866a37688c3afc68011eb14e178b5254530c2823522464ab1f1bd42ef2d1c6",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(PARSE, EXTRACT),
    what="reads a call's arguments as Gemma 4's chat template writes them (`parse_gemma4_arguments`: `<|\"|>` "
    "strings, nested `[...]` lists and `{key:value}` objects, bare true/false/null and numbers, other bare text a "
    "string as in verl); malformed arguments raise a `ValueError` naming the problem, the character and the text, "
    "which verl's `extract_tool_calls` logs, skipping that call only. verl's call regex is kept: a call ends only at "
    "`}<tool_call|>`, so nested objects reach the parser whole",
    why="verl reads a bare value up to the next `,` or `}`: `bbox_2d:[440,10,600,300]` gives "
    '`{"bbox_2d": "[440"}` (the rest is lost), `box:{x:1,y:2}` gives `"{x:1"` and a stray `y`; every list or object '
    "argument is broken on Gemma 4 (the built-in image tools take `x1`..`y2` as numbers)",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::test_verls_gemma4_parser_reads_a_list_argument_as_a_fragment`",
)


# parse: verl's reading, not called (the fix reads every value itself); extract_tool_calls is checked, not replaced
@ADAPTATION.replaces(PARSE)
def _parse_arguments(_parse: Callable[..., dict], self: Gemma4ToolParser, args_str: str) -> dict:
    return parse_gemma4_arguments(args_str)
