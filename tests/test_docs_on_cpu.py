"""The documentation names what the code has: every mm_tool option in the options table, with its default."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from verl_mm_tools.agent_loop.config import MMToolLoopConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_mm_tool_option_has_a_row_in_the_options_table():
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    table = concepts[concepts.index("## mm_tool options") :]
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    assert rows == {field.name for field in dataclasses.fields(MMToolLoopConfig)}


def test_the_options_table_gives_each_choice_option_s_default_and_every_value():
    from verl_mm_tools.agent_loop.config import CHOICES

    concepts = (ROOT / "docs" / "concepts.md").read_text()
    table = concepts[concepts.index("## mm_tool options") :]
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[2:4]
        for line in table.splitlines()
        if line.startswith("| `")
    }
    defaults = {field.name: field.default for field in dataclasses.fields(MMToolLoopConfig)}
    for name, choice in CHOICES.items():
        default, meaning = rows[name]
        assert default.strip() == f"`{defaults[name].value}`", name
        assert all(f"`{value}`" in meaning for value in choice.values() if value != defaults[name].value), name
