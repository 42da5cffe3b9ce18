"""What a demo run is asked to do (``DemoOptions``), checked when it is made: a wrong choice is a ConfigError naming
the choices before anything is built or started."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_mm_tools.cpu.names import ROLLOUT_NAME as HF_ROLLOUT
from verl_mm_tools.cpu.vllm_cpu import ROLLOUT_NAME as VLLM_ROLLOUT
from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_UNSUPPORTED, VLLM_CPU_VERSION, vllm_cpu_problem
from verl_mm_tools.demo.tasks import TASKS, DemoTask, get_task
from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.tiny import FAMILIES

# verl's trainers: the v1 trainer's modes (verl's default is sync) and the classic (deprecated) trainer.
TRAINERS = ("sync", "colocate_async", "separate_async", "classic")
# verl's fully async trainer (verl.experimental.fully_async_policy: rollouter and trainer on separate resources,
# partial rollout, bounded staleness), through verl-mm-tools' entry point with the step hook
FULLY_ASYNC = "fully_async"
DEMO_TRAINERS = (*TRAINERS, FULLY_ASYNC)
# The rollout engine: verl's own vLLM server (vllm-cpu inside) or the project's transformers server (``hf``).
ROLLOUTS = (VLLM_ROLLOUT, HF_ROLLOUT)


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
    trainer: str = "sync"  # one of DEMO_TRAINERS
    rollout: str = VLLM_ROLLOUT  # one of ROLLOUTS
    warm_start: bool = True
    # fit the warm start with verl's own SFT trainer on demonstrations the loop recorded (``demo.cold_start``)
    sft_warm_start: bool = False
    family: str | None = None  # the tiny model's VLM family; None: the task's (``tiny_family``)
    dumps: bool = True  # mm_tool's trajectory dumps (verl's rollout dumps: trainer.rollout_data_dir=null)
    overrides: tuple[str, ...] = ()
    tools: Path | None = None  # a verl tool YAML replacing the task's tools (your own tools, say)
    env: str | None = None  # the environment of every trajectory: a registered name or a class path
    export: str = "per_trajectory"  # the mm_tool loop's export: training samples per trajectory
    nodes: int = 1  # Ray nodes started on this machine (``runtime.cluster``): 2 puts the rollout and the trainer apart
    judge: bool = False  # the reward from judge_reward, the tiny model judging on verl's reward-model server

    def __post_init__(self) -> None:
        get_task(self.task)  # an unknown task is a ConfigError now, not a KeyError later
        check_rollout(self)
        if self.export != "per_trajectory" and self.trainer in ("classic", FULLY_ASYNC):
            raise ConfigError(
                f"--export {self.export} needs verl's v1 trainer (one of its modes: sync, colocate_async, "
                f"separate_async); the {self.trainer} trainer takes one sample per trajectory"
            )
        check_nodes(self)
        check_family(self)
        check_warm_start(self)
        check_tools_and_env(self)
        check_judge(self)

    @property
    def tiny_family(self) -> str:
        """The tiny model's VLM family: the one asked for, else the task's (``DemoTask.family``)."""
        return self.spec.family if self.family is None else self.family

    @property
    def tool_parser(self) -> str:
        """verl's multi_turn.format for the family's tool calls."""
        return FAMILIES[self.tiny_family].tool_parser

    @property
    def spec(self) -> DemoTask:
        return get_task(self.task)

    @property
    def total_steps(self) -> int:
        return self.spec.steps if self.steps is None else self.steps


def check_judge(options: DemoOptions) -> None:
    """The judge runs where it was tried: verl's v1 sync trainer, vLLM serving policy and judge."""
    if not options.judge:
        return
    if options.trainer != "sync" or options.rollout != VLLM_ROLLOUT or options.nodes != 1:
        raise ConfigError(
            f"--judge runs on verl's v1 sync trainer with the vllm rollout on one node (the reward-model server is "
            f"verl's vLLM server on a pool of its own), got --trainer {options.trainer} --rollout {options.rollout} "
            f"--nodes {options.nodes}"
        )


def check_rollout(options: DemoOptions) -> None:
    """A known rollout engine, and vllm-cpu installed when it is verl's vLLM server."""
    if options.rollout not in ROLLOUTS:
        raise ConfigError(
            f"unknown rollout {options.rollout!r}; choose one of {ROLLOUTS}." + did_you_mean(options.rollout, ROLLOUTS)
        )
    problem = vllm_cpu_problem() if options.rollout == VLLM_ROLLOUT else None
    if problem:
        raise ConfigError(
            f"--rollout vllm (the default) needs vllm-cpu {VLLM_CPU_VERSION}, but {problem}. Install "
            "the CPU stack with scripts/install_cpu.sh (README_VLMRL.md), or generate with the "
            "project's transformers server: --rollout hf"
        )


# The trainers whose rollout and training run on resource pools of their own: with one logical GPU per node, the two
# pools land on different nodes.
MULTI_NODE_TRAINERS = ("separate_async", FULLY_ASYNC)


def check_nodes(options: DemoOptions) -> None:
    if options.nodes not in (1, 2):
        raise ConfigError(f"--nodes must be 1 or 2 (Ray nodes started on this machine), got {options.nodes}")
    if options.nodes == 2 and options.trainer not in MULTI_NODE_TRAINERS:
        raise ConfigError(
            f"--nodes 2 puts the rollout and the trainer on different Ray nodes, which needs a trainer with a "
            f"resource pool for each: --trainer {' or '.join(MULTI_NODE_TRAINERS)} (got {options.trainer})"
        )


def check_family(options: DemoOptions) -> None:
    """A known model family, one the chosen rollout engine can generate with."""
    family = options.tiny_family
    if family not in FAMILIES:
        raise ConfigError(
            f"unknown family {family!r}; choose one of {sorted(FAMILIES)}." + did_you_mean(family, FAMILIES)
        )
    if options.rollout == VLLM_ROLLOUT and family in VLLM_CPU_UNSUPPORTED:
        raise ConfigError(
            f"--family {family} cannot generate with --rollout vllm: {VLLM_CPU_UNSUPPORTED[family]}. Pass --rollout hf"
        )


def check_warm_start(options: DemoOptions) -> None:
    """The warm start demonstrates hermes tool calls; the SFT warm start needs a task it can fit."""
    if options.warm_start and options.tool_parser != "hermes":
        raise ConfigError(
            f"the warm start demonstrates hermes tool calls, but {options.tiny_family} writes {options.tool_parser} "
            "calls; pass --no-warm-start with this family"
        )
    if options.sft_warm_start and not (options.warm_start and get_task(options.task).sft_cold_start):
        fitted = [name for name, task in TASKS.items() if task.sft_cold_start]
        raise ConfigError(
            f"--sft-warm-start fits the warm start of the tasks {fitted} with verl's SFT trainer; --task "
            f"{options.task}{' --no-warm-start' if not options.warm_start else ''} has none it can fit"
        )


def check_tools_and_env(options: DemoOptions) -> None:
    """The user's tool YAML exists and the environment imports here (a typo fails now, not in every rollout
    worker)."""
    if options.tools is not None and not Path(options.tools).is_file():
        raise ConfigError(f"--tools {options.tools}: no such file; give a verl tool YAML (tools: - class_name: ...)")
    if options.tools is not None or options.env is not None:
        importable_from_here()
    if options.env is not None:
        from verl_mm_tools.envs import make_environment

        make_environment(options.env)


def importable_from_here() -> None:
    """Modules in the working directory import in this process, as in the trainer's (``trainer_environment``): a
    console script's import path does not hold the working directory."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
