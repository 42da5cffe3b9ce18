"""The command line answers at once: parsing imports no verl, every option has help, every bad value is a one-line
usage error naming the valid range (exit 2)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from verl_mm_tools.cli import DEMO_ROLLOUTS, DEMO_TASKS, DEMO_TRAINERS, build_parser, main

HEAVY_PACKAGES = ("verl", "torch", "transformers", "ray", "numpy", "PIL", "pandas")


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl_mm_tools.cli", *argv], capture_output=True, text=True, timeout=120
    )


def test_parsing_imports_nothing_heavy():
    code = (
        "import json, sys\n"
        "from verl_mm_tools.cli import build_parser\n"
        "build_parser().parse_args(['demo', '--task', 'learn'])\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_PACKAGES!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("argv, exit_code", [(["--help"], 0), (["demo", "--help"], 0), (["demo", "--steps", "-1"], 2)])
def test_help_and_usage_errors_answer_without_importing_anything_heavy(argv, exit_code):
    """What made the command line slow (importing verl took 6-15 s) is counted, not timed: ``-X importtime`` lists
    every module the command imported, and none of the heavy packages may be among them."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "verl_mm_tools.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == exit_code, result.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert sorted(name for name in imported if name.split(".")[0] in HEAVY_PACKAGES) == []
    assert "verl_mm_tools.cli" in imported or "verl_mm_tools" in imported  # the report was read


USAGE_ERRORS = [
    (["demo", "--steps", "-1"], "verl-mm-tools demo: error: argument --steps: must be a whole number >= 1, got -1"),
    (["demo", "--steps", "two"], "verl-mm-tools demo: error: argument --steps: must be a whole number >= 1, got 'two'"),
    (["demo", "--seed", "-3"], "verl-mm-tools demo: error: argument --seed: must be a whole number >= 0, got -3"),
    (
        ["demo", "--seeds", "0,-1"],
        "verl-mm-tools demo: error: argument --seeds: expected comma-separated whole "
        "numbers such as 0,1,2, got '0,-1' (each >= 0)",
    ),
    (
        ["tiny-model", "--seed", "x"],
        "verl-mm-tools tiny-model: error: argument --seed: must be a whole number >= 0, got 'x'",
    ),
    (
        ["view", "dir", "--serve", "70000"],
        "verl-mm-tools view: error: argument --serve: must be a whole number between 0 and 65535, got 70000",
    ),
    (
        ["make-data", "zoom", "--out", "x", "--target", "4"],
        "verl-mm-tools make-data zoom: error: argument --target: must be a whole number >= 8, got 4",
    ),
    (
        ["make-data", "rotation", "--out", "x", "--side", "10"],
        "verl-mm-tools make-data rotation: error: argument --side: must be a whole number between 28 and 4096, got 10",
    ),
    (
        ["make-data", "zoom", "--out", "x", "--train-size", "0"],
        "verl-mm-tools make-data zoom: error: argument --train-size: must be a whole number >= 1, got 0",
    ),
    (
        ["make-data", "geo3k", "--source", "s", "--out", "x", "--max-attempts", "0"],
        "verl-mm-tools make-data geo3k: error: argument --max-attempts: must be a whole number >= 1, got 0",
    ),
]


@pytest.mark.parametrize("argv, message", USAGE_ERRORS, ids=[" ".join(argv) for argv, _ in USAGE_ERRORS])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_range(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == message


def test_a_value_only_the_command_can_check_is_a_usage_error_too(tmp_path, capsys):
    # zoom's --target against its --side: the writer's ConfigError, without a traceback
    assert main(["make-data", "zoom", "--out", str(tmp_path), "--side", "64", "--target", "20"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "verl-mm-tools make-data: error: zoom target must be between 8 and side/4=16 px, got 20\n"
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_the_valid_values_parse():
    args = build_parser().parse_args(
        ["demo", "--steps", "1", "--seed", "0", "--seeds", "0,1,2", "--trainer", "classic"]
    )
    assert (args.steps, args.seed, args.seeds, args.trainer) == (1, 0, [0, 1, 2], "classic")
    assert build_parser().parse_args(["view", "d", "--serve", "0"]).serve == 0
    assert build_parser().parse_args(["make-data", "rotation", "--out", "x", "--side", "4096"]).side == 4096


def _options_without_help(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                missing += _options_without_help(subparser, f"{prefix}{name} ")
        elif not action.help:
            missing.append(prefix + (action.option_strings[-1] if action.option_strings else action.dest))
    return missing


def test_every_option_and_argument_has_help():
    assert _options_without_help(build_parser()) == []


def test_the_top_level_help_says_what_the_tool_does_and_lists_the_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[2:4] == [
        "Multimodal multi-turn tool use for verl (image tools, the mm_tool agent loop).",
        "Commands: build the tiny test VLM, train it on CPU, write data, view, benchmark, evaluate, reuse "
        "trajectories.",
    ]
    listed = [
        line.split()[0]
        for line in lines[lines.index("  COMMAND") + 1 :]
        if line.startswith("    ") and not line.startswith("     ")
    ]
    assert listed == ["tiny-model", "demo", "view", "make-data", "bench", "eval", "export-sft", "sft", "rescore"]


def test_the_bench_help_documents_the_exit_status():
    result = run_cli("bench", "--help")
    assert result.returncode == 0
    assert (
        "exit status: 0 when every figure was measured, checks met or not; 1 with\n--strict when a check was "
        "missed; 2 on a usage error."
    ) in result.stdout


def test_the_demo_choices_are_the_demo_s_own():
    from verl_mm_tools.demo import options as demo

    assert DEMO_TASKS == tuple(sorted(demo.TASKS))
    assert DEMO_TRAINERS == demo.TRAINERS
    assert DEMO_ROLLOUTS == demo.ROLLOUTS
