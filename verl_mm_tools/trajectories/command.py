"""``verl-mm-tools export-sft`` and ``verl-mm-tools sft``: their arguments (parsing imports nothing heavy) and runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_mm_tools.cli_types import whole_number

DESCRIPTION = """\
Write recorded trajectories (training dumps: the mm_tool loop's dump_dir;
verl-mm-tools eval output) as verl's multi-turn SFT parquet: OUT/train.parquet
(messages with <image> and <video> placeholders, images, videos, tools,
enable_thinking: what verl.utils.dataset.multiturn_sft_dataset.MultiTurnSFTDataset
reads) and
OUT/export.json (rows, records used, records skipped by each filter, records
that could not be read and why, the data overrides of verl's SFT trainer).
Masked trajectories are never exported, validation ones only with --split val
or all. Records that cannot be read (bad fields, files outside their folder,
unreadable images) are left out, each named on stderr; --strict then exits 1.
Trajectories whose prompt holds videos need --video-root: each video's file
must lie under it, and is checked against the record (the frames sampled and
their size); a row names the file with the sampling keys that give the frames
the model saw. Without it, or when a check fails, the trajectory is skipped and
counted with the reason.
"""


def add_export_sft_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "export-sft",
        help="recorded trajectories as verl's multi-turn SFT parquet (a cold start)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("records", nargs="+", type=Path, help="dump folders, eval output folders or trajectory.json")
    command.add_argument("--out", type=Path, required=True, help="output folder")
    command.add_argument("--min-reward", type=float, help="keep trajectories scored at least this")
    command.add_argument(
        "--stop",
        action="append",
        default=[],
        help=(
            "keep trajectories that ended so (answered, turn_limit, length_limit, budget, tool_failed, episode_done); "
            "repeatable"
        ),
    )
    command.add_argument("--tool-used", action="append", default=[], help="keep trajectories that called NAME")
    command.add_argument("--data-source", action="append", default=[], help="keep rows of this data source")
    command.add_argument(
        "--best-of",
        action="store_true",
        help="keep each prompt's best-scored trajectory (eval --samples N, or a GRPO group)",
    )
    command.add_argument(
        "--split",
        choices=("train", "val", "all"),
        default="train",
        help="which trajectories: training ones (default), validation ones (eval output is validation) or all",
    )
    command.add_argument("--strict", action="store_true", help="exit 1 if any record could not be read")
    command.add_argument(
        "--per-turn",
        action="store_true",
        help="one row per assistant turn (the conversation up to it) instead of one per trajectory",
    )
    command.add_argument(
        "--video-root",
        type=Path,
        help="the folder the prompts' video files are under (records with videos are skipped without it); rows "
        "name only files that resolve inside it",
    )
    command.set_defaults(run=run_export_sft)


def run_export_sft(args: argparse.Namespace) -> int:
    from verl_mm_tools.trajectories.read import BadRecord
    from verl_mm_tools.trajectories.sft import SUMMARY_FILE, TRAIN_FILE, SFTFilters, export_sft

    filters = SFTFilters(
        min_reward=args.min_reward,
        stops=tuple(args.stop),
        tools_used=tuple(args.tool_used),
        data_sources=tuple(args.data_source),
        best_of=args.best_of,
        split=args.split,
    )
    summary = export_sft(args.records, args.out, filters, per_turn=args.per_turn, video_root=args.video_root)
    skipped = ", ".join(f"{count} {reason}" for reason, count in summary["skipped"].items()) or "none"
    seen = ", ".join(f"{count} {split}" for split, count in summary["splits_seen"].items())
    for bad in summary["bad_records"]:
        sys.stderr.write(f"verl-mm-tools export-sft: left out {BadRecord(Path(bad['path']), bad['reason']).line()}\n")
    sys.stdout.write(
        f"wrote {summary['rows']} rows from {summary['records']} trajectories to {args.out / TRAIN_FILE} "
        f"(seen: {seen}; exported: the {args.split} split)\n"
        f"skipped: {skipped}; unreadable: {len(summary['bad_records'])} (listed in {args.out / SUMMARY_FILE})\n"
        f"train: {summary['verl_command']}\n"
    )
    return 1 if args.strict and summary["bad_records"] else 0


SFT_DESCRIPTION = """\
Run verl's own multi-turn SFT trainer (python -m verl.trainer.sft_trainer,
under torchrun) on CPU on an export-sft parquet, with the CPU overrides it
needs (verl_mm_tools.cpu.sft), and print the Hugging Face model folder it saved
after the last step. OUT holds command.sh (the exact command, to rerun or
edit; on GPUs drop the CPU overrides), sft_trainer.log and checkpoints/.
"""


def add_sft_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "sft",
        help="verl's own SFT trainer on CPU on an export-sft parquet (a cold start for RL)",
        description=SFT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("--model", required=True, help="the model folder to start from")
    command.add_argument("--data", type=Path, nargs="+", required=True, help="export-sft parquet files")
    command.add_argument("--out", type=Path, required=True, help="output folder (must hold no checkpoints)")
    command.add_argument("--steps", type=whole_number(1), default=40, help="optimizer steps (default 40)")
    command.add_argument("--batch-size", type=whole_number(1), default=4, help="rows per step (default 4)")
    command.add_argument("--lr", type=float, default=3e-3, help="learning rate (default 3e-3, for the tiny model)")
    command.add_argument("--seed", type=whole_number(0), default=0, help="data order and initialisation (default 0)")
    command.add_argument("overrides", nargs="*", help="hydra overrides of verl's sft_trainer config, last")
    command.set_defaults(run=run_sft)


def run_sft(args: argparse.Namespace) -> int:
    from verl_mm_tools.cpu.sft import run_verl_sft

    model = run_verl_sft(
        args.model,
        args.data,
        args.out,
        overrides=args.overrides,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    sys.stdout.write(f"{model}\n")
    return 0
