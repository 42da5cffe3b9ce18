"""``verl-mm-tools rescore``: its arguments (parsing imports nothing heavy) and its run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.judging import add_judge_arguments, judge_flags
from verl_mm_tools.trajectories.rescore_options import DEFAULT_MANAGER, REPORT_FILE, TRAJECTORIES, RescoreOptions

DESCRIPTION = """\
Score recorded trajectories (training dumps: the mm_tool loop's dump_dir;
verl-mm-tools eval output) again with another reward function or reward
manager, through verl's own reward worker and manager classes, as training
scores them: no policy model, no inference server (the model's tokenizer and
processor rebuild the token ids the record does not keep). Writes
OUT/report.json, OUT/report.txt and OUT/rows.jsonl (eval's format: the
recorded scores and the new ones side by side, each row with both) and
OUT/trajectories (copies whose reward is the new score, the recorded one kept
as reward_before: verl-mm-tools view OUT/trajectories shows both). Records
that cannot be read or scored are listed with their reason.

With --judge URL --judge-model NAME, a VLM judge at that OpenAI-compatible
endpoint scores every record (judge_reward, docs/judge.md): the question of its
prompt, its prompt images and the tool images --judge-images chooses (from its
PNGs: the pixels the model saw), then its final answer; plus --reward-fn's score
times --judge-option rule_weight=W. The report adds the judge's counts.
"""


def add_rescore_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "rescore",
        help="score recorded trajectories again with another reward function or manager",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("records", nargs="+", type=Path, help="dump folders, eval output folders or trajectory.json")
    command.add_argument("--out", type=Path, required=True, help="output folder (empty, new or an earlier rescore's)")
    command.add_argument(
        "--reward-fn",
        help="a built-in reward function scoring every record (also rows whose extra_info names another); with "
        "--judge, a rule reward added to the judge's (--judge-option rule_weight=W)",
    )
    command.add_argument(
        "--reward-manager",
        default=DEFAULT_MANAGER,
        help=f"a reward manager of verl's registry: verl's naive, dapo, ... or ours (default {DEFAULT_MANAGER})",
    )
    command.add_argument(
        "--model-path",
        help="the model whose tokenizer and processor rebuild the tokens (default: the one each record names)",
    )
    command.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a hydra override of verl's trainer config, as in training (e.g. +reward.reward_kwargs.gamma=0.5); "
        "repeatable",
    )
    command.add_argument("--strict", action="store_true", help="exit 1 if any record could not be rescored")
    add_judge_arguments(
        command,
        images_help="the tool images of each record the judge sees besides its prompt's: all, none, named (those "
        "its final answer names, 'Image 3') or last:N (default all)",
    )
    command.set_defaults(run=run_rescore)


def run_rescore(args: argparse.Namespace) -> int:
    from verl_mm_tools.trajectories.read import BadRecord
    from verl_mm_tools.trajectories.rescore import rescore

    judge = judge_flags(args)
    if judge is None and args.reward_fn is None and args.reward_manager == DEFAULT_MANAGER and not args.override:
        raise ConfigError(
            "rescore needs something to score with: --reward-fn NAME, --reward-manager NAME, --judge URL or "
            "--override reward settings"
        )
    options = RescoreOptions(
        records=tuple(args.records),
        out=args.out,
        reward_fn=args.reward_fn,
        reward_manager=args.reward_manager,
        model_path=args.model_path,
        overrides=tuple(args.override),
        judge=judge,
    )
    report = rescore(options)
    rows = sum(figures["rows"] for mode, figures in _rescored(report).items())
    for bad in report["bad_records"]:
        sys.stderr.write(f"verl-mm-tools rescore: left out {BadRecord(Path(bad['path']), bad['reason']).line()}\n")
    sys.stdout.write(report["table"] + "\n")
    sys.stdout.write(
        f"rescored {rows} trajectories; could not rescore {len(report['bad_records'])} (listed in "
        f"{args.out / REPORT_FILE}); trajectories: verl-mm-tools view {args.out / TRAJECTORIES}\n"
    )
    return 1 if args.strict and report["bad_records"] else 0


def _rescored(report: dict) -> dict:
    """The rescored figures of every data source of every mode."""
    return {
        (mode, source): figures
        for mode, sources in report["modes"].items()
        if mode.endswith("rescored")
        for source, figures in sources.items()
    }
