"""``verl-mm-tools demo``: verl's own GRPO trainer (``python -m verl.trainer.main_ppo``, real Ray) training the
embedded tiny VLM on CPU, with the ``mm_tool`` loop, the rotate tool and the ``mm_turn_discount`` reward manager.

Steps: build (or reuse) the tiny model; write the synthetic task; warm-start the model on the output format
(``warm_start``, cached); launch the trainer as a subprocess with the CPU backend's overrides (``cpu.overrides``);
print one line per training step from verl's file logger; end with where the checkpoint, logs and dumps are.

The tasks and when each has learned: ``tasks``. This module runs the steps in order; its parts: ``options`` (what
a run is asked), ``prepare`` (model, data, config files), ``overrides`` (the trainer's command), ``watch`` (the
trainer process, through ``verl_mm_tools.supervise``), ``metrics`` (verl's step metrics) and ``summary``.

Everything a run writes goes under ``--out``::

    config/      tools.yaml, agent_loops.yaml, command.sh (the exact trainer command, to rerun or edit)
    data/        train.parquet, val.parquet
    logs/        trainer.log (all trainer output), metrics.jsonl (verl's metrics, one line per step)
    checkpoints/ verl's actor checkpoint (trainer.default_local_dir)
    rollouts/    verl's rollout dumps, one JSONL per step (trainer.rollout_data_dir)
    trajectories/  mm_tool trajectory dumps with images (``verl-mm-tools view`` renders them)
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from verl_mm_tools.demo.options import DEMO_TRAINERS, FULLY_ASYNC, DemoOptions, importable_from_here
from verl_mm_tools.demo.overrides import ray_sizes, trainer_command, trainer_environment, write_command_script
from verl_mm_tools.demo.prepare import DemoPaths, prepare
from verl_mm_tools.demo.summary import learning_curve, summarize
from verl_mm_tools.demo.watch import LEARNING_FAILED, NodeWatch, RunResult, run_trainer
from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.record import STAGING_DIR
from verl_mm_tools.viewer.curve import CURVE_PICTURE, curve_svg


def run_demo(options: DemoOptions, say: Callable[[str], None]) -> int:
    """The whole demo; returns its exit status: the trainer's, or LEARNING_FAILED when a task with a reward target
    did not reach it."""
    result, _ = run_demo_result(options, say)
    return result.returncode


def run_demo_result(options: DemoOptions, say: Callable[[str], None]) -> tuple[RunResult, DemoPaths]:
    if options.total_steps < 1:
        raise ValueError(f"--steps must be >= 1, got {options.total_steps}")
    if options.trainer not in DEMO_TRAINERS:
        raise ConfigError(
            f"unknown trainer {options.trainer!r}; choose one of {DEMO_TRAINERS}."
            + did_you_mean(options.trainer, DEMO_TRAINERS)
        )
    if options.tools is not None or options.env is not None:
        importable_from_here()  # the warm start imports the user's modules here, from where the demo runs
    clock = time.monotonic()
    paths = prepare(options, lambda what: say(f"[{time.monotonic() - clock:5.1f}s] {what}"))
    if options.nodes > 1:
        result = _on_local_cluster(options, paths, clock, say)
    else:
        result = _train(options, paths, trainer_command(options, paths), clock, say)
    _discard_unpublished(paths.trajectories, say)
    _finish(options, paths, result, clock, say)
    return result, paths


def _on_local_cluster(options: DemoOptions, paths: DemoPaths, clock: float, say: Callable[[str], None]) -> RunResult:
    """``--nodes 2``: start Ray nodes on this machine (each with one logical GPU, so verl's trainer pool and its
    rollout pool land on different nodes) with the trainer's environment, point verl at them, always stop them."""
    from verl_mm_tools.runtime.cluster import local_cluster

    num_cpus, num_gpus = ray_sizes(trainer_command(options, paths))
    per_node_gpus = max(1, num_gpus // options.nodes)
    sizes = f"{num_cpus} CPUs, {per_node_gpus} GPU each"
    say(f"[{time.monotonic() - clock:5.1f}s] starting {options.nodes} Ray nodes on this machine ({sizes})")
    env = trainer_environment(paths)
    with local_cluster(nodes=options.nodes, num_cpus=num_cpus, num_gpus=per_node_gpus, env=env) as cluster:
        names = ", ".join(node.name for node in cluster.nodes)
        say(f"[{time.monotonic() - clock:5.1f}s] Ray nodes {names} up at {cluster.address}")
        nodes = NodeWatch(
            raylets={node.name: raylet for node in cluster.nodes if (raylet := node.raylet()) is not None},
            node_ids={node.name: node.node_id() or "unknown" for node in cluster.nodes},
        )
        command = trainer_command(options, paths, address=cluster.address)

        def cluster_pids() -> set[int]:
            return {process.pid for process in cluster.processes()}

        return _train(options, paths, command, clock, say, cluster_pids=cluster_pids, nodes=nodes)


def _train(
    options: DemoOptions,
    paths: DemoPaths,
    command: list[str],
    clock: float,
    say: Callable[[str], None],
    cluster_pids: Callable[[], set[int]] = set,
    nodes: NodeWatch | None = None,
) -> RunResult:
    env = trainer_environment(paths)
    paths.metrics.unlink(missing_ok=True)
    script = write_command_script(command, env, paths)
    trainer = "classic trainer" if options.trainer == "classic" else f"v1 trainer, {options.trainer}"
    if options.trainer == FULLY_ASYNC:
        trainer = "fully async trainer (partial rollout)"
    say(
        f"[{time.monotonic() - clock:5.1f}s] verl {trainer}: python -m {command[2]} ({script}); log {paths.trainer_log}"
    )
    say(
        f"[{time.monotonic() - clock:5.1f}s] starting Ray, the rollout server and the actor: the first step usually "
        f"comes 45-120 s from now on 2 cores (verl's output: {paths.trainer_log})"
    )
    return run_trainer(
        command, env, paths, options.spec, options.total_steps, say, cluster_pids=cluster_pids, nodes=nodes
    )


def _finish(
    options: DemoOptions, paths: DemoPaths, result: RunResult, clock: float, say: Callable[[str], None]
) -> None:
    if options.spec.stop_at_reward is not None:
        curve = learning_curve(result, options.spec)
        (paths.out / "learning_curve.json").write_text(json.dumps(curve, indent=1))
        (paths.out / CURVE_PICTURE).write_text(curve_svg(curve))
        if result.returncode == 0 and not result.learned:
            result.returncode = LEARNING_FAILED
    for line in summarize(result, paths, options.spec, time.monotonic() - clock):
        say(line)


def _discard_unpublished(trajectories: Path, say: Callable[[str], None]) -> None:
    """Trajectories staged for a step the trainer never finished (it was stopped once the model learned, or
    failed) have no step or reward: remove them rather than leave them for the viewer."""
    staging = trajectories / STAGING_DIR
    if staging.is_dir():
        count = sum(1 for entry in staging.iterdir() if entry.is_dir())
        shutil.rmtree(staging, ignore_errors=True)
        if count:
            say(f"removed {count} trajectory dumps of a step the trainer did not finish")
