"""``verl-mm-tools eval``: its arguments (parsing imports nothing heavy) and its run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from verl_mm_tools.cli_types import whole_number
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.judging import add_judge_arguments, judge_flags

if TYPE_CHECKING:
    from tqdm import tqdm
    from transformers import PreTrainedTokenizerBase

DESCRIPTION = """\
Score a model on a dataset with the same tools, image workspace, budget,
environments and rewards as training: verl's AgentLoopWorker runs the mm_tool
loop on every row, talking to an OpenAI-compatible chat endpoint (--endpoint)
or to a local checkpoint (--checkpoint), greedy, or --samples N answers per row
at --temperature (then the report adds pass_at_n and best_reward_mean). With
--judge URL --judge-model NAME, a VLM judge at that OpenAI-compatible endpoint
scores every row (judge_reward: the question, the prompt's images and the tool
images --judge-images chooses, then the final answer; docs/judge.md), plus
--reward-fn's score times --judge-option rule_weight=W; the report adds the
judge's counts (judged, parse failures, failed, cache hits, mean score). Writes
OUT/report.json, OUT/report.txt, OUT/<mode>/rows.jsonl (each sample's reward,
stop reason, calls and endpoint faults) and OUT/<mode>/trajectories
(verl-mm-tools view shows them).
"""


def add_eval_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "eval",
        help="score a model through the mm_tool loop: an endpoint or a checkpoint",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("--data", type=Path, required=True, help="a parquet file verl's RLHFDataset reads")
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--endpoint", help="an OpenAI-compatible API's base URL, e.g. http://127.0.0.1:8000/v1")
    source.add_argument(
        "--checkpoint",
        type=Path,
        help="a Hugging Face model folder or a verl FSDP checkpoint (trainer.default_local_dir, a "
        "global_step_N folder or its actor folder)",
    )
    command.add_argument("--model", help="the endpoint's model name (--endpoint)")
    command.add_argument(
        "--model-path",
        help="the model's processor and tokenizer, a local folder (default: --model "
        "with an endpoint; the checkpoint's own with --checkpoint)",
    )
    command.add_argument("--tools", type=Path, help="verl's tool YAML (required unless --no-tools)")
    modes = command.add_mutually_exclusive_group()
    modes.add_argument("--no-tools", action="store_true", help="run without tools only")
    modes.add_argument("--with-and-without-tools", action="store_true", help="run both and report them side by side")
    command.add_argument(
        "--loop-config",
        type=Path,
        help="the training run's agent-loop YAML (actor_rollout_ref.rollout.agent.agent_loop_config_path): "
        "its mm_tool options apply; eval adds dumps for every row",
    )
    command.add_argument(
        "--reward-fn",
        help="a built-in reward function for rows whose extra_info names none; with --judge, a rule reward added to "
        "the judge's (--judge-option rule_weight=W)",
    )
    command.add_argument("--concurrency", type=whole_number(1), default=8, help="requests at once (default 8)")
    command.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    command.add_argument(
        "--retries",
        type=whole_number(0),
        default=3,
        help="tries after a timeout, connection failure, HTTP 429/5xx or malformed answer (default 3)",
    )
    command.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="the environment variable holding the API key (default OPENAI_API_KEY; unset: none)",
    )
    command.add_argument(
        "--samples",
        type=whole_number(1),
        default=1,
        help="answers per row, each scored and dumped (verl's val_kwargs.n; default 1)",
    )
    command.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature (verl's val_kwargs.temperature; default 0, greedy, for one sample and 1.0 for "
        "several; 0 with --samples above 1 is refused)",
    )
    command.add_argument(
        "--batch-size", type=whole_number(1), default=32, help="rows per batch, each with its samples (default 32)"
    )
    command.add_argument("--max-turns", type=whole_number(1), default=4, help="assistant turns per row (default 4)")
    command.add_argument(
        "--response-length",
        type=whole_number(1),
        default=1024,
        help="tokens a trajectory may generate, tool answers included (default 1024)",
    )
    command.add_argument("--out", type=Path, default=Path("verl_mm_tools_eval"), help="output folder")
    command.add_argument(
        "overrides",
        nargs="*",
        help="hydra overrides of verl's trainer config, as in training (reward, loop options, ...)",
    )
    add_judge_arguments(
        command,
        images_help="the tool images the judge sees besides the prompt's: all, none, named (those the final answer "
        "names, 'Image 3') or last:N (default: the --loop-config's judge_images, else all)",
    )
    command.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from verl_mm_tools.evaluate.run import NO_TOOLS, TOOLS, EvalOptions, evaluate

    judge = judge_flags(args)
    if judge is not None:
        judge.check(args.reward_fn)  # its mistakes before a checkpoint is merged
    make_client, model_path = _client(args)
    modes = (TOOLS, NO_TOOLS) if args.with_and_without_tools else (NO_TOOLS,) if args.no_tools else (TOOLS,)
    options = EvalOptions(
        data=args.data,
        out=args.out,
        model_path=model_path,
        tools_yaml=args.tools,
        loop_config=args.loop_config,
        modes=modes,
        reward_fn=args.reward_fn,
        batch_size=args.batch_size,
        max_turns=args.max_turns,
        response_length=args.response_length,
        samples=args.samples,
        temperature=args.temperature,
        overrides=tuple(args.overrides),
        judge=judge,
    )
    bar = _progress_bar(args.data, len(modes) * args.samples)
    try:
        report = evaluate(options, make_client, progress=bar.update)
    finally:
        bar.close()
    sys.stdout.write(report["table"] + "\n")
    sys.stdout.write(
        f"report: {args.out / 'report.json'}; trajectories: verl-mm-tools view {args.out / modes[0] / 'trajectories'}\n"
    )
    return 0


def _client(args: argparse.Namespace) -> tuple[Callable[[PreTrainedTokenizerBase], object], str]:
    """What answers the worker's generate calls, made from the model's tokenizer, and the model's path."""
    if args.checkpoint is not None:
        from verl_mm_tools.evaluate.checkpoint import CheckpointClient, model_dir

        path = model_dir(args.checkpoint, args.out / "merged_checkpoint")
        return (lambda tokenizer: CheckpointClient(path)), args.model_path or str(path)
    from verl_mm_tools.evaluate.endpoint import EndpointClient, EndpointSettings

    if not args.model:
        raise ConfigError("--endpoint needs --model (the name the endpoint serves the model under)")
    settings = EndpointSettings(
        url=args.endpoint,
        model=args.model,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        retries=args.retries,
        api_key_env=args.api_key_env,
    )
    return (lambda tokenizer: EndpointClient(settings, tokenizer)), args.model_path or args.model


def _progress_bar(data: Path, runs_per_row: int) -> tqdm:
    import pyarrow.parquet as pq
    from tqdm import tqdm

    total = pq.ParquetFile(data).metadata.num_rows * runs_per_row
    return tqdm(total=total, unit="trajectory", desc="eval", file=sys.stderr)
