"""``verl-mm-tools demo``: verl's own GRPO trainer (``python -m verl.trainer.main_ppo``, real Ray) training the
embedded tiny VLM on CPU, with the ``mm_tool`` loop, the rotate tool and the ``mm_turn_discount`` reward manager.

Steps: build (or reuse) the tiny model; write the synthetic rotation task; warm-start the model on the output format
(``warm_start``, cached); launch the trainer as a subprocess with the CPU overrides (``config``); print one line per
training step from verl's file logger; end with where the checkpoint, logs and dumps are.

Everything a run writes goes under ``--out``::

    config/      tools.yaml, agent_loops.yaml, command.sh (the exact trainer command, to rerun or edit)
    data/        train.parquet, val.parquet
    logs/        trainer.log (all trainer output), metrics.jsonl (verl's metrics, one line per step)
    checkpoints/ verl's actor checkpoint (trainer.default_local_dir)
    rollouts/    verl's rollout dumps, one JSONL per step (trainer.rollout_data_dir)
    trajectories/  mm_tool trajectory dumps with images (``verl-mm-tools view`` renders them)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from verl_mm_tools.agent_loop.harness import ROTATE_TOOLS_YAML
from verl_mm_tools.cpu.config import THREAD_ENV, cpu_environment, cpu_trainer_overrides

logger = logging.getLogger(__name__)

MANAGER = "verl_mm_tools.agent_loop.manager.MMToolAgentLoopManager"
# The step line: (label, verl metric key, format).
STEP_FIELDS = (
    ("reward", "critic/score/mean", "{:.3f}"),
    ("turns", "num_turns/mean", "{:.2f}"),
    ("tool calls", "tool_call_counts/mean", "{:.2f}"),
    ("images", "timing_s/mm_tool/images/mean", "{:.2f}"),
    ("masked", "timing_s/mm_tool/masked/count", "{:.0f}"),
    ("logprob diff", "training/rollout_probs_diff_max", "{:.1e}"),
    ("step", "timing_s/step", "{:.1f}s"),
)
STOP_TIMEOUT_S = 60
# Sequences per forward/backward in the trainer: 8 made old_log_prob + update_actor ~1.8x faster than 32 (measured,
# 32 trajectories of ~600 tokens per step, one thread).
MICRO_BATCH = 8
VALIDATION_REWARD = "val-core/verl_mm_tools/rotation/reward/mean@1"


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    steps: int = 30
    prompts_per_step: int = 8
    rollouts_per_prompt: int = 4
    train_size: int = 64
    val_size: int = 16
    lr: float = 1e-4
    seed: int = 0
    warm_start: bool = True
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class DemoPaths:
    """Where a run's inputs are (the model is in the user cache) and where it writes (under ``out``)."""

    out: Path
    model: Path
    train: Path
    val: Path

    @property
    def config(self) -> Path:
        return self.out / "config"

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    @property
    def rollouts(self) -> Path:
        return self.out / "rollouts"

    @property
    def trajectories(self) -> Path:
        return self.out / "trajectories"

    @property
    def metrics(self) -> Path:
        return self.logs / "metrics.jsonl"

    @property
    def trainer_log(self) -> Path:
        return self.logs / "trainer.log"


def prepare(options: DemoOptions, say: Callable[[str], None]) -> DemoPaths:
    """The model, data and config files of a run (the model and warm start are cached across runs)."""
    from verl_mm_tools.cpu.warm_start import WarmStartSpec, warm_started_model
    from verl_mm_tools.data.rotation import write_rotation_dataset
    from verl_mm_tools.tiny import tiny_model_path

    out = options.out.resolve()
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    tools = out / "config" / "tools.yaml"
    tools.write_text(ROTATE_TOOLS_YAML)
    say("tiny model")
    model = tiny_model_path()
    if options.warm_start:
        say(f"warm start on the output format (random labels; cached after the first run; log {out / 'logs'})")
        with quiet(out / "logs" / "warm_start.log"):
            model = warm_started_model(model, tools, WarmStartSpec(seed=options.seed))
    say("rotation task")
    train, val = write_rotation_dataset(out / "data", train_size=options.train_size, val_size=options.val_size,
                                        seed=options.seed)
    paths = DemoPaths(out=out, model=model, train=train, val=val)
    loops = [{"name": "mm_tool", "_target_": "verl_mm_tools.agent_loop.MMToolAgentLoop",
              "dump_dir": str(paths.trajectories), "dump_max_per_step": 8}]
    (paths.config / "agent_loops.yaml").write_text(json.dumps(loops))
    return paths


@contextlib.contextmanager
def quiet(log_path: Path) -> Iterator[None]:
    """Send what verl and transformers print (progress bars, dataset notices) to a log file instead of the screen."""
    with log_path.open("a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        yield


def task_overrides(options: DemoOptions, paths: DemoPaths) -> list[str]:
    """The rotation task on the tiny model: GRPO, the mm_tool loop with the rotate tool, the turn-discount reward."""
    batch = options.prompts_per_step
    return [
        f"data.train_files={paths.train}", f"data.val_files={paths.val}",
        f"data.train_batch_size={batch}", "data.max_prompt_length=512", "data.max_response_length=256",
        f"data.seed={options.seed}",
        f"actor_rollout_ref.model.path={paths.model}",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={options.rollouts_per_prompt}",
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={paths.config / 'tools.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=mm_tool",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={paths.config / 'agent_loops.yaml'}",
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}",
        f"actor_rollout_ref.actor.optim.lr={options.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
        "reward.reward_manager.name=mm_turn_discount",
        "+reward.reward_kwargs.reward_fn=rotation_reward_180",
        "+reward.reward_kwargs.reward_fn_kwargs.require_tag=true",
        "trainer.logger=[console,file]", "trainer.project_name=verl_mm_tools", "trainer.experiment_name=cpu_demo",
        f"trainer.total_training_steps={options.steps}", "trainer.total_epochs=1000",
        f"trainer.save_freq={options.steps}", f"trainer.test_freq={options.steps}", "trainer.val_before_train=false",
        f"trainer.default_local_dir={paths.checkpoints}", f"trainer.rollout_data_dir={paths.rollouts}",
    ]


def trainer_command(options: DemoOptions, paths: DemoPaths) -> list[str]:
    # User overrides come last: hydra lets the last value of a key win.
    overrides = [*cpu_trainer_overrides(), *task_overrides(options, paths), *options.overrides]
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def trainer_environment(paths: DemoPaths) -> dict[str, str]:
    env = cpu_environment()
    env["VERL_FILE_LOGGER_PATH"] = str(paths.metrics)
    return env


def write_command_script(command: list[str], env: dict[str, str], paths: DemoPaths) -> Path:
    script = paths.config / "command.sh"
    names = ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_FILE_LOGGER_PATH", "TOKENIZERS_PARALLELISM", *THREAD_ENV)
    exports = " ".join(f"{name}={shlex.quote(env[name])}" for name in names if name in env)
    script.write_text(f"#!/usr/bin/env bash\n# The trainer command of this demo run.\n{exports} \\\n  "
                      + " \\\n  ".join(shlex.quote(part) for part in command) + ' "$@"\n')
    script.chmod(0o755)
    return script


def format_step(step: int, total: int, metrics: dict) -> str:
    parts = [f"step {step}/{total}"]
    for label, key, fmt in STEP_FIELDS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    return "  ".join(parts)


def read_new_steps(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete JSON lines of verl's file logger after byte ``offset``; returns them and the new offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    records = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return records, offset + len(complete)


def tree_memory_bytes(pid: int) -> int:
    """Proportional set size (shared pages split between their users) of a process and its descendants (Ray's
    workers descend from the trainer's driver). Summed RSS would count Ray's shared object store once per process."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


@dataclass
class RunResult:
    returncode: int
    steps: list[dict]
    seconds: float
    first_step_after_s: float | None
    peak_memory_bytes: int


def run_trainer(command: list[str], env: dict[str, str], paths: DemoPaths, total_steps: int,
                say: Callable[[str], None], poll_s: float = 1.0) -> RunResult:
    """Run the trainer subprocess to its end, printing a line per step; SIGTERM it if we are interrupted."""
    started = time.monotonic()
    with paths.trainer_log.open("wb") as log, terminate_raises():
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        steps, offset, peak, first_step = [], 0, 0, None
        try:
            while True:
                finished = process.poll() is not None
                records, offset = read_new_steps(paths.metrics, offset)
                for record in records:
                    first_step = first_step or time.monotonic() - started
                    steps.append(record["data"])
                    say(format_step(record["step"], total_steps, record["data"]))
                peak = max(peak, tree_memory_bytes(process.pid))
                if finished:
                    break
                time.sleep(poll_s)
        except BaseException:
            stop_trainer(process)
            raise
    return RunResult(process.returncode, steps, time.monotonic() - started, first_step, peak)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """While the trainer runs, SIGTERM to us raises SystemExit, so the trainer (in its own session) is stopped too."""
    def exit_on_term(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_trainer(process: subprocess.Popen) -> None:
    """SIGTERM the driver (it shuts its Ray cluster down; SIGINT does nothing), then kill its process group."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.warning("the trainer did not stop within %ss of SIGTERM; killing its process group", STOP_TIMEOUT_S)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def log_tail(path: Path, lines: int = 25) -> Iterator[str]:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    yield from text[-lines:]


def run_demo(options: DemoOptions, say: Callable[[str], None]) -> int:
    """The whole demo; returns the trainer's exit status."""
    if options.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {options.steps}")
    clock = time.monotonic()
    paths = prepare(options, lambda what: say(f"[{time.monotonic() - clock:5.1f}s] {what}"))
    command, env = trainer_command(options, paths), trainer_environment(paths)
    paths.metrics.unlink(missing_ok=True)
    script = write_command_script(command, env, paths)
    say(f"[{time.monotonic() - clock:5.1f}s] verl trainer: python -m verl.trainer.main_ppo ({script}); "
        f"log {paths.trainer_log}")
    result = run_trainer(command, env, paths, options.steps, say)
    summary = summarize(result, paths, time.monotonic() - clock)
    for line in summary:
        say(line)
    return result.returncode


def summarize(result: RunResult, paths: DemoPaths, total_s: float) -> list[str]:
    lines = []
    if result.returncode != 0:
        lines += [f"the trainer failed (exit status {result.returncode}); the end of {paths.trainer_log}:",
                  *("  " + line for line in log_tail(paths.trainer_log))]
    startup = f"{result.first_step_after_s:.0f}s to the first step, " if result.first_step_after_s else ""
    validation = [step[VALIDATION_REWARD] for step in result.steps if VALIDATION_REWARD in step]
    if validation:
        lines.append(f"validation reward {validation[-1]:.3f} (greedy, on pictures the training split does not hold)")
    lines += [
        f"done in {total_s:.0f}s ({startup}{len(result.steps)} steps); peak memory of the trainer's processes "
        f"{result.peak_memory_bytes / 2**30:.1f} GiB (PSS, summed)",
        f"checkpoint:   {paths.checkpoints}",
        f"logs:         {paths.trainer_log}",
        f"metrics:      {paths.metrics}",
        f"rollouts:     {paths.rollouts}",
        f"trajectories: {paths.trajectories}  (verl-mm-tools view {paths.trajectories})",
        f"command:      {paths.config / 'command.sh'}",
    ]
    return lines
