"""``verl-mm-tools`` command line: tiny-model, ... (one sub-command per job)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from pathlib import Path

from verl_mm_tools.tiny import DEFAULT_FAMILY, FAMILIES, TEMPLATES, tiny_model_path
from verl_mm_tools.data.command import add_make_data_command
from verl_mm_tools.viewer.command import add_view_command


def _tiny_model(args: argparse.Namespace) -> int:
    path = tiny_model_path(family=args.family, seed=args.seed, out=args.out, template=args.template)
    sys.stdout.write(f"{path}\n")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from verl_mm_tools import bench

    with contextlib.ExitStack() as stack:
        step_dir = None
        if args.step:
            step_dir = Path(args.step_out) if args.step_out else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        # the trainer runs' progress goes to stderr: stdout holds only the figure lines
        figures = bench.run(str(tiny_model_path()), quick=args.quick, step_dir=step_dir,
                            say=lambda line: sys.stderr.write(line + "\n"))
    for figure in figures:
        sys.stdout.write(figure.line() + "\n")
    return 0 if all(figure.passed for figure in figures) or args.no_fail else 1


def _seed_list(text: str) -> list[int]:
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers such as 0,1,2, got {text!r}") from None


def _demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from verl_mm_tools.cpu.demo import DemoOptions, run_demo, run_sweep

    options = DemoOptions(out=Path(args.out), task=args.task, steps=args.steps, seed=args.seed, trainer=args.trainer,
                          warm_start=not args.no_warm_start, overrides=tuple(args.overrides))

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    if args.seeds:
        return run_sweep(options, args.seeds, say)
    return run_demo(options, say)


def build_parser() -> argparse.ArgumentParser:
    from verl_mm_tools.cpu.demo import TASKS as DEMO_TASKS
    from verl_mm_tools.cpu.demo import TRAINERS as DEMO_TRAINERS

    parser = argparse.ArgumentParser(prog="verl-mm-tools", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser("tiny-model", help="build (or reuse) the embedded tiny VLM and print its directory")
    tiny.add_argument("--out", help="directory to build into (default: the user cache, reused across runs)")
    tiny.add_argument("--family", default=DEFAULT_FAMILY, choices=sorted(FAMILIES))
    tiny.add_argument("--seed", type=int, default=0, help="weights and tokenizer seed (default 0)")
    tiny.add_argument("--template", default="family", choices=TEMPLATES,
                      help="chat template: 'family' renders like the real family (Qwen2-VL / Qwen2.5-VL ignore tools; "
                           "Qwen3-VL renders them), 'tool_aware' a Qwen2.5-text-style tool template (default: family)")
    tiny.set_defaults(run=_tiny_model)

    demo = commands.add_parser(
        "demo", help="train the tiny VLM with verl's own GRPO trainer on CPU (mm_tool loop, rotate tool), ~5 min"
    )
    demo.add_argument("--out", default="verl_mm_tools_demo", help="directory for everything the run writes")
    demo.add_argument("--task", choices=sorted(DEMO_TASKS), default="rotation",
                      help="rotation: arrow pictures (the loop's showcase); learn: the learning proof, red or blue "
                      "pictures, stops once the reward reaches 0.9 (exit 3 if it does not); learn_tool: the same "
                      "with a rotate call before every answer")
    demo.add_argument("--steps", type=int, default=None, help="training steps (default: 30 rotation, 80 learn and learn_tool)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--seeds", type=_seed_list, help="comma-separated seeds: one run each under OUT/seed_<n>, then a table "
                      "(the learning proof's sweep: --task learn --seeds 0,1,2)")
    demo.add_argument("--trainer", choices=DEMO_TRAINERS, default="sync",
                      help="verl's v1 trainer mode (sync, its default; colocate_async; separate_async) or its classic "
                      "(deprecated) trainer")
    demo.add_argument("--no-warm-start", action="store_true",
                      help="train the random tiny model as is (it will not call the tool)")
    demo.add_argument("overrides", nargs="*", help="hydra overrides for verl's trainer, e.g. trainer.save_freq=-1")
    demo.set_defaults(run=_demo)

    add_view_command(commands)
    add_make_data_command(commands)

    bench = commands.add_parser("bench", help="benchmarks: name value target PASS|FAIL, one line per figure")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions (noisier)")
    bench.add_argument("--no-fail", action="store_true", help="exit 0 even when a target is missed")
    bench.add_argument("--step", action="store_true",
                       help="also verl's CPU training step: tool_agent and mm_tool on verl's v1 trainer, mm_tool on the "
                       "classic trainer (three trainer runs, ~5 min)")
    bench.add_argument("--step-out", help="keep the --step runs' files here (default: a temporary directory)")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
