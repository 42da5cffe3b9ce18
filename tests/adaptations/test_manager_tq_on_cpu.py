"""verl's v1 agent-loop worker scoring a trajectory exported as several samples (``adaptations/manager_tq.py``): verl
0.9.1 stacks every sample's position ids to score them together, which Qwen-VL's (4, L) M-RoPE ids of different
lengths cannot do; the fixed worker scores the final sample alone (verl copies its score to the others)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

from verl_mm_tools.adaptations.manager_tq import final_sample_scoring_worker


class _Reward:
    """One reward worker handle: ``compute_score.remote(data)`` scores the batch it is given."""

    def __init__(self):
        self.batch_sizes: list[int] = []
        self.compute_score = self

    async def remote(self, data):
        self.batch_sizes.append(len(data))
        return {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}


class _WorkerState:
    """What ``_compute_score`` reads of the worker, without Ray or a model: Qwen-VL position ids, (4, L) per sample."""

    def __init__(self):
        self.reward = _Reward()
        self.reward_loop_worker_handles = [self.reward]

    def _compute_multi_modal_inputs(self, output, input_ids):
        return {}

    def _compute_position_ids(self, input_ids, attention_mask, multi_modal_inputs, mm_processor_kwargs=None):
        return torch.arange(input_ids.shape[1]).expand(1, 4, -1)


def worker(actor_class: type):
    return type("StubWorker", (_WorkerState, actor_class), {})()


def trajectory() -> list[AgentLoopOutput]:
    """Two samples of one trajectory (mm_tool ``export: per_turn``), of different lengths."""
    return [
        AgentLoopOutput(
            prompt_ids=list(range(prompt)),
            response_ids=[7] * response,
            response_mask=[1] * response,
            metrics=AgentLoopMetrics(),
            mm_processor_kwargs={},
        )
        for prompt, response in ((5, 3), (9, 4))
    ]


def test_verls_own_worker_fails_to_score_samples_of_different_lengths():
    """The bug. When this stops failing, verl fixed it: drop MMToolAgentLoopManagerTQ."""
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(8\) must match the size of tensor b \(13\)"):
        asyncio.run(worker(AgentLoopWorkerTQ.__ray_actor_class__)._compute_score(trajectory(), kwargs={}))


def test_the_fixed_worker_scores_the_final_sample_alone():
    fixed = worker(final_sample_scoring_worker().__ray_actor_class__)
    outputs = trajectory()
    asyncio.run(fixed._compute_score(outputs, kwargs={}))
    assert fixed.reward.batch_sizes == [1]
    assert (outputs[0].reward_score, outputs[1].reward_score) == (None, 1.0)  # verl's postprocess copies it back
