"""The benchmark command runs end to end and prints one well-formed line per figure (values are not asserted:
they depend on the machine; targets are checked by reading the output, see README_VLMRL.md)."""

from __future__ import annotations

import re

from verl_mm_tools import bench
from verl_mm_tools.cli import main

LINE = re.compile(r"^(\S+) (-?[0-9.e+-]+|inf|nan) <=(\S+) (PASS|FAIL)$")


def test_bench_quick_prints_every_figure(capsys):
    assert main(["bench", "--quick", "--no-fail"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    names = {line.split()[0] for line in lines}
    for expected in ("ops/rotate90_over_transpose", "loop/448px/16turns/ratio", "loop/56px/mm_tool_turn16_over_turn2",
                     "memory/peak_added_over_raw_image_bytes"):
        assert expected in names


def test_figure_verdicts():
    assert bench.Figure("x", 1.04, "<= 1.05").line() == "x 1.04 <=1.05 PASS"
    assert bench.Figure("x", 1.2, "<= 1.05").line() == "x 1.2 <=1.05 FAIL"
