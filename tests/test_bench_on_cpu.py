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


def test_step_figures_skip_warmup_compare_loops_and_trainers():
    def step(number, seconds, gen=2.0, slowest=None):
        timing = {"timing_s/agent_loop/generate_sequences/max": slowest} if slowest is not None else {}
        return {"step": number, "timing_s/step": seconds, "timing_s/gen": gen, **timing}

    warmup = [step(1, 60.0, 50.0, 1.0), step(2, 30.0, 20.0, 1.0)]  # one-time costs: left out
    metrics = {
        "tool_agent": [*warmup, step(3, 4.0), step(4, 5.0), step(5, 4.5)],
        "mm_tool": [*warmup, step(3, 4.4), step(4, 4.6), {"step": 5, "val-core/x": 1.0}],
        "mm_tool_classic": [*warmup, step(3, 4.0, 2.0, 1.2), step(4, 4.2, 2.2, 1.8), step(5, 4.4, 2.0, 1.1)],
    }
    lines = [figure.line() for figure in bench.step_figures(metrics)]
    assert lines == [
        "step/tool_agent_s 4.5 <=inf PASS",
        "step/mm_tool_s 4.5 <=inf PASS",
        "step/mm_tool_classic_s 4.2 <=inf PASS",
        "step/mm_tool_classic/rollout_outside_generation_share 0.1666 <=0.1 FAIL",  # mean of 0.8/4, 0.4/4.2, 0.9/4.4
        "step/ratio 1 <=1.05 PASS",
        "step/v1_vs_classic 1.071 <=1.10 PASS",  # 4.5 / 4.2
    ]
