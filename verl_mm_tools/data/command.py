"""``verl-mm-tools make-data {rotation,zoom,count,geo3k,miniwob,video}``: write verl RL parquet for built-in tasks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_mm_tools.cli_types import whole_number
from verl_mm_tools.errors import ConfigError


def _rotation(args: argparse.Namespace) -> list[Path]:
    from verl_mm_tools.data.rotation import write_rotation_dataset

    return list(
        write_rotation_dataset(
            args.out,
            train_size=args.train_size,
            val_size=args.val_size,
            seed=args.seed,
            angles=args.angles,
            side=args.side,
        )
    )


def _zoom(args: argparse.Namespace) -> list[Path]:
    from verl_mm_tools.data.zoom import write_zoom_dataset

    return list(
        write_zoom_dataset(
            args.out,
            train_size=args.train_size,
            val_size=args.val_size,
            seed=args.seed,
            side=args.side,
            target=args.target,
        )
    )


def _count(args: argparse.Namespace) -> list[Path]:
    from verl_mm_tools.data.count import write_count_dataset

    return list(write_count_dataset(args.out, train_size=args.train_size, val_size=args.val_size, seed=args.seed))


def _geo3k(args: argparse.Namespace) -> list[Path]:
    from verl_mm_tools.data.geo3k import convert_geo3k

    return list(convert_geo3k(args.source, args.out, max_attempts=args.max_attempts).values())


def _miniwob(args: argparse.Namespace) -> list[Path]:
    from verl_mm_tools.data.miniwob import write_miniwob_dataset

    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    return list(write_miniwob_dataset(args.out, tasks=tasks, episodes=args.episodes, val_episodes=args.val_episodes))


def _video(args: argparse.Namespace) -> list[Path]:
    from verl_mm_tools.data.video import write_video_dataset

    return list(
        write_video_dataset(
            args.out, train_size=args.train_size, val_size=args.val_size, seed=args.seed, seconds=args.seconds
        )
    )


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"--out {out} is a file, not a folder; pass a folder (new or existing) to write the parquet into"
        )
    for path in args.write(args):
        sys.stdout.write(f"{path}\n")
    return 0


def add_make_data_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    make_data = commands.add_parser("make-data", help="write verl parquet for a built-in task")
    tasks = make_data.add_subparsers(dest="task", required=True)
    for name, write, help_text in (
        ("rotation", _rotation, "synthetic rotation estimation (train/val parquet)"),
        ("zoom", _zoom, "V*-like: a small digit in a large image (train/val parquet)"),
        ("count", _count, "count the red squares, where the python tool pays (train/val parquet)"),
        ("video", _video, "a colour flashing between the prompt's frames, where get_frames pays (MP4 + parquet)"),
    ):
        task = tasks.add_parser(name, help=help_text)
        task.add_argument("--out", required=True, help="output directory")
        task.add_argument("--train-size", type=whole_number(1), default=512, help="training rows (default 512)")
        task.add_argument("--val-size", type=whole_number(1), default=64, help="validation rows (default 64)")
        task.add_argument(
            "--seed",
            type=whole_number(0),
            default=0,
            help="seed of the pictures (default 0; validation uses its own, so no picture is shared)",
        )
        task.set_defaults(run=_run, write=write)
    tasks.choices["rotation"].add_argument(
        "--angles",
        choices=("quarter", "uniform"),
        default="quarter",
        help="quarter: arrows turned by multiples of 90 degrees; uniform: text and shapes turned by any whole angle",
    )
    tasks.choices["rotation"].add_argument(
        "--side",
        type=whole_number(28, 4096),
        default=None,
        help="picture side in pixels (default 56 quarter, 448 uniform)",
    )
    tasks.choices["zoom"].add_argument(
        "--side", type=whole_number(32), default=1024, help="image side in pixels (default 1024)"
    )
    tasks.choices["zoom"].add_argument(
        "--target", type=whole_number(8), default=24, help="digit box side in pixels, at most SIDE/4 (default 24)"
    )
    tasks.choices["video"].add_argument(
        "--seconds", type=whole_number(2, 60), default=4, help="clip length in seconds, at 10 fps (default 4)"
    )
    geo3k = tasks.add_parser("geo3k", help="convert a downloaded hiyouga/geometry3k to mm_tool parquet")
    geo3k.add_argument("--source", required=True, help="directory (or parquet file) of the dataset as on the hub")
    geo3k.add_argument("--out", required=True, help="output directory")
    geo3k.add_argument(
        "--max-attempts",
        type=whole_number(1),
        default=3,
        help="answers allowed by the feedback environment (default 3)",
    )
    geo3k.set_defaults(run=_run, write=_geo3k)
    miniwob = tasks.add_parser("miniwob", help="MiniWoB++ web tasks for the miniwob environment (seeded episodes)")
    miniwob.add_argument("--out", required=True, help="output directory")
    miniwob.add_argument(
        "--tasks",
        default="click-test,click-button,click-link,click-dialog,enter-text,focus-text",
        help="comma-separated MiniWoB task names (default: the six the oracle solves)",
    )
    miniwob.add_argument("--episodes", type=whole_number(1), default=64, help="training episodes per task (default 64)")
    miniwob.add_argument(
        "--val-episodes", type=whole_number(1), default=16, help="validation episodes per task (default 16)"
    )
    miniwob.set_defaults(run=_run, write=_miniwob)
