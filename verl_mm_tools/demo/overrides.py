"""The trainer's command line and environment for a demo run: verl's CPU overrides (``cpu.overrides``), the rollout
engine's, the task's (GRPO, the mm_tool loop and its tools, the turn-discount reward), the chosen trainer's with the
step hook, and the user's last; ``config/command.sh`` writes them down to rerun or edit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from verl_mm_tools.agent_loop.hook_config import FULLY_ASYNC_ENTRY, MANAGER_TQ_OVERRIDE, hook_overrides
from verl_mm_tools.cpu.overrides import (
    THREAD_ENV,
    cpu_environment,
    cpu_trainer_overrides,
    fully_async_overrides,
    separate_async_overrides,
)
from verl_mm_tools.cpu.vllm_cpu import ROLLOUT_NAME as VLLM_ROLLOUT
from verl_mm_tools.cpu.vllm_cpu import vllm_rollout_overrides
from verl_mm_tools.demo.judge import judge_overrides
from verl_mm_tools.demo.options import FULLY_ASYNC, DemoOptions
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.demo.tasks import MICRO_BATCH
from verl_mm_tools.supervise import write_trainer_script

MAX_TURNS = 3  # assistant turns per trajectory


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
        *(() if options.judge else task.reward),  # --judge: the rule joins the judge (``trainer_command``)
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
        *(fully_async_task_overrides(batch, rollouts, steps, task.overrides) if options.trainer == FULLY_ASYNC else []),
    ]


def requested_test_freq(overrides: tuple[str, ...], steps: int) -> int:
    """How often the task validates: its last ``trainer.test_freq``, else once, after the last step."""
    values = [item.split("=", 1)[1] for item in overrides if item.startswith("trainer.test_freq=")]
    return int(values[-1]) if values else steps


# The fully async trainer's partial rollout and staleness: a weight sync after every training step (so syncs
# interrupt generations in flight, which resume), and up to half a step's prompts generated ahead on older weights.
TRIGGER_PARAMETER_SYNC_STEP = 1
STALENESS_THRESHOLD = 1.0


def fully_async_task_overrides(batch: int, rollouts: int, steps: int, task_overrides: tuple[str, ...]) -> list[str]:
    """The task's size as verl's fully async trainer counts it: prompts fed one at a time (``cpu.overrides``), a
    step of ``batch`` prompts (``ppo_mini_batch_size`` x ``require_batches``), ``steps`` x ``batch`` prompts in all
    (``rollout.total_rollout_steps``, which sets the training steps), validated about as often as the task asks
    (``fully_async_test_freq``)."""
    validate_every = requested_test_freq(task_overrides, steps)
    return [
        f"rollout.n={rollouts}",
        f"trainer.test_freq={fully_async_test_freq(steps, validate_every)}",
        f"rollout.total_rollout_steps={steps * batch * TRIGGER_PARAMETER_SYNC_STEP}",
        # a step's prompts in flight at once (verl's default: 16 per server): the next step's are generating while
        # the trainer trains, so its weight sync interrupts them and verl's client resumes them (partial rollout)
        f"async_training.concurrent_samples_per_replica={batch}",
        "async_training.partial_rollout=true",
        f"async_training.trigger_parameter_sync_step={TRIGGER_PARAMETER_SYNC_STEP}",
        f"async_training.staleness_threshold={STALENESS_THRESHOLD}",
    ]


def fully_async_test_freq(steps: int, validate_every: int) -> int:
    """verl's fully async trainer logs a step's metrics at the next step's weight sync, and the last step's only when
    ``trainer.test_freq`` does not divide the step count (``FullyAsyncTrainer.fit``); it validates at multiples of
    ``test_freq`` only, never at the end. So: the first frequency from ``validate_every`` on that does not divide
    ``steps`` (a task validating every 5 of 40 steps validates every 6 here), or ``steps + 1`` (every step logged, no
    validation after training began) for a task that validates once, at its end or never (verl's test_freq <= 0)."""
    if not 0 < validate_every < steps:
        return steps + 1
    return next(freq for freq in range(validate_every, steps + 2) if steps % freq)


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
    if trainer == FULLY_ASYNC:  # its step hook is the entry point (``trainer_command``)
        return fully_async_overrides()
    extra = separate_async_overrides() if trainer == "separate_async" else []
    return [f"trainer.v1.trainer_mode={trainer}", *hook_overrides(v1=True), *extra]


def trainer_command(options: DemoOptions, paths: DemoPaths, address: str | None = None) -> list[str]:
    """The trainer's command; ``address``: a running Ray cluster's (``--nodes 2``) for verl's ``ray.init`` to join."""
    # User overrides come last: hydra lets the last value of a key win.
    rollout = vllm_rollout_overrides() if options.rollout == VLLM_ROLLOUT else []
    overrides = [
        *cpu_trainer_overrides(classic=options.trainer == "classic"),
        *rollout,
        *task_overrides(options, paths),
    ]
    if options.judge:
        from verl_mm_tools.tiny import tiny_model_path

        judge = tiny_model_path(family=options.tiny_family)
        overrides += judge_overrides(options.spec.reward, str(judge), gpus=ray_sizes(overrides)[1])
    if address is not None:
        overrides = [*without_ray_sizes(overrides), *cluster_overrides(address)]
    overrides += options.overrides
    entry = FULLY_ASYNC_ENTRY if options.trainer == FULLY_ASYNC else "verl.trainer.main_ppo"
    return [sys.executable, "-m", entry, *overrides]


RAY_SIZES = ("ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus")


def without_ray_sizes(overrides: list[str]) -> list[str]:
    """The overrides without the sizes of a Ray cluster verl would start (``ray.init`` refuses num_cpus / num_gpus
    when it joins a running cluster: the cluster's nodes declare their own)."""
    return [item for item in overrides if item.lstrip("+~").split("=", 1)[0] not in RAY_SIZES]


def cluster_overrides(address: str) -> list[str]:
    """Join the running cluster at ``address`` (verl's ``ray.init(**ray_kwargs.ray_init)``)."""
    return [f"+ray_kwargs.ray_init.address={address}", "ray_kwargs.ray_init.num_cpus=null"]


def ray_sizes(overrides: list[str]) -> tuple[int, int]:
    """The logical CPUs and GPUs the overrides ask verl's own Ray cluster for (the last value of each wins)."""
    sizes = {"ray_kwargs.ray_init.num_cpus": 0, "ray_kwargs.ray_init.num_gpus": 0}
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if key in sizes and value.isdigit():
            sizes[key] = int(value)
    return sizes["ray_kwargs.ray_init.num_cpus"], sizes["ray_kwargs.ray_init.num_gpus"]


def trainer_environment(paths: DemoPaths) -> dict[str, str]:
    env = cpu_environment()
    env["VERL_FILE_LOGGER_PATH"] = str(paths.metrics)
    # your tool or environment module next to where you run the demo imports in verl's Ray workers too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    return env


# The environment variables ``config/command.sh`` sets before the trainer command.
SCRIPT_ENV = (
    "VERL_PLATFORM",
    "VERL_ENGINE_DEVICE",
    "VERL_FILE_LOGGER_PATH",
    "TOKENIZERS_PARALLELISM",
    "PYTHONPATH",
    *THREAD_ENV,
)


def write_command_script(command: list[str], env: dict[str, str], paths: DemoPaths) -> Path:
    return write_trainer_script(
        paths.config / "command.sh", command, env, SCRIPT_ENV, "The trainer command of this demo run."
    )
