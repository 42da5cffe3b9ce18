"""verl's worker classes in one process (no Ray, no GPU): the agent-loop worker, its reward worker and
verl-mm-tools' agent-loop manager, run on verl's event loop."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig
from verl.protocol import DataProto

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopManager,
        AgentLoopOutput,
        AgentLoopWorker,
        _InternalAgentLoopOutput,
    )
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient

    from verl_mm_tools.step_hook.manager import MMToolAgentLoopManager

ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopWorker._agent_loop_postprocess",
            "0673c29ea3dbbbecc8b42274244afb73f7befd9d6d605654eaf4c149b4259bf6",
        ),
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopWorker._postprocess",
            "d55eabeea2dc52a69666bfccaeee1c2c381d732ee8cd183e57cd6744733f12bf",
        ),
    ),
    what="postprocesses each of a loop's several samples into its own row, as the v1 worker does",
    why=("the in-process test and bench harness runs the classic worker, which takes one output per trajectory"),
    applies_to="verl 0.9.1",
    proof="none (test harness)",
)


@contextlib.contextmanager
def restored_loop_registry() -> Iterator[None]:
    """verl's worker writes agent_loop_config_path entries (our loop options) into its process-wide registry: put it
    back afterwards, so one run's loop options (a dump_dir, an export) never leak into later rollouts."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    saved = dict(_agent_loop_registry)
    try:
        yield
    finally:
        _agent_loop_registry.clear()
        _agent_loop_registry.update(saved)


def make_worker(config: DictConfig, server: LLMServerClient | None, *, per_sample: bool = False) -> Any:
    """verl's real AgentLoopWorker (the class Ray would wrap), talking to ``server``; with ``per_sample``, one that
    takes loops returning several training samples per trajectory (``per_sample_worker_class``)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return (per_sample_worker_class() if per_sample else AgentLoopWorker)(config, server)


@ADAPTATION.implements
def per_sample_worker_class() -> type:
    """verl's classic AgentLoopWorker, taking a loop's list of training samples as verl's v1 worker does (mm_tool
    ``export`` per_turn / auto): each sample goes through verl's own per-output postprocess (multimodal inputs,
    position ids) into its own row; a trajectory's rows follow each other, its dataset columns repeated. Rewards
    are not copied between samples here (the v1 worker does that)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    confirm(ADAPTATION)  # the verl methods it overrides changed: refuses to start

    class PerSampleAgentLoopWorker(AgentLoopWorker):
        async def _agent_loop_postprocess(  # type: ignore[override, unused-ignore]  # returns each sample's row
            self, output: AgentLoopOutput | list[AgentLoopOutput], validate: bool, **kwargs: object
        ) -> list[_InternalAgentLoopOutput]:
            postprocess = super()._agent_loop_postprocess  # zero-argument super() fails inside a comprehension
            return [
                await postprocess(item, validate, **kwargs)
                for item in (output if isinstance(output, list) else [output])
            ]

        # inputs: each trajectory's list of samples (verl's: one output per trajectory)
        def _postprocess(  # type: ignore[override, unused-ignore]  # takes samples per trajectory
            self,
            inputs: list[list[_InternalAgentLoopOutput]],
            input_non_tensor_batch: dict[str, np.ndarray] | None = None,
            **kwargs: bool,
        ) -> DataProto:
            counts = [len(samples) for samples in inputs]
            repeated = {
                key: np.repeat(values, counts, axis=0) for key, values in (input_non_tensor_batch or {}).items()
            }
            samples = [sample for trajectory in inputs for sample in trajectory]
            padded = prompts_padded_alike(samples, self.tokenizer.pad_token_id)
            return super()._postprocess(padded, repeated, **kwargs)

    return PerSampleAgentLoopWorker


def prompts_padded_alike(samples: list[_InternalAgentLoopOutput], pad_id: int) -> list[_InternalAgentLoopOutput]:
    """The samples with their prompts left-padded to the widest one's. verl's classic worker pads each prompt to
    ``rollout.prompt_length``, and a later sample of a trajectory holds the earlier turns in its prompt, so it can be
    wider; verl's v1 worker, which stores each sample unpadded, takes it as it is. The pads are what verl's own left
    padding holds: ``pad_id`` tokens, attention 0, and position 0, but 1 in the text row of M-RoPE's (1, 4, L)
    position ids (verl's text row starts from ones; transformers' ``get_rope_index`` leaves pads at 0, as
    ``compute_position_id_with_mask`` does); a valid token's positions do not depend on the pads."""
    import torch

    widest = max(sample.prompt_ids.size(1) for sample in samples)
    padded = []
    for sample in samples:
        pad = widest - sample.prompt_ids.size(1)
        if not pad:
            padded.append(sample)
            continue
        if sample.teacher_ids is not None or sample.routed_experts is not None:
            raise NotImplementedError("padding a sample with teacher log-probs or MoE routing to a wider prompt")
        ids = torch.full((1, pad), pad_id, dtype=sample.prompt_ids.dtype)
        positions = sample.position_ids
        pad_positions = positions.new_zeros((*positions.shape[:-1], pad))
        if positions.dim() == 3:  # M-RoPE's (1, 4, L): verl's text row pads with 1
            pad_positions[:, 0] = 1
        update = {
            "prompt_ids": torch.cat([ids, sample.prompt_ids], dim=1),
            "input_ids": torch.cat([ids, sample.input_ids], dim=1),
            "attention_mask": torch.cat([torch.zeros_like(ids), sample.attention_mask], dim=1),
            "position_ids": torch.cat([pad_positions, positions], dim=-1),
        }
        padded.append(sample.model_copy(update=update))
    return padded


def in_process_manager(config: DictConfig, *, per_sample: bool = False) -> tuple[MMToolAgentLoopManager, Any]:
    """``MMToolAgentLoopManager`` over one in-process AgentLoopWorker (no Ray), and that worker, whose
    ``llm_client`` the caller sets: trajectories scored by verl's reward worker in-process, the step hook publishing
    dumps. Call the manager's ``generate_sequences`` on verl's event loop (``generate``). ``per_sample``: the worker
    takes loops that return several samples per trajectory (``make_worker``)."""
    from verl_mm_tools.step_hook.manager import MMToolAgentLoopManager

    worker = make_worker(config, None, per_sample=per_sample)
    worker.reward_loop_worker_handles = [InProcessActor(in_process_reward_worker(config))]
    manager = MMToolAgentLoopManager.__new__(MMToolAgentLoopManager)  # no Ray: the in-process worker is the actor
    manager.config = config
    # an in-process stand-in for Ray's actor handle: the same ``method.remote(...)`` calls
    manager.agent_loop_workers = [InProcessActor(worker)]  # type: ignore[list-item, unused-ignore]
    return manager, worker


def generate(worker: AgentLoopWorker | AgentLoopManager, batch: DataProto) -> DataProto:
    """Run ``worker.generate_sequences`` (an AgentLoopWorker or a manager) on verl's event loop (the one verl's
    reward worker and agent loops capture)."""
    from verl.utils.ray_utils import get_event_loop

    async def run() -> DataProto:
        return await worker.generate_sequences(batch)

    return get_event_loop().run_until_complete(run())


class InProcessActor:
    """Stands in for a Ray actor handle: ``handle.method.remote(...)`` returns the awaitable of the local call."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=getattr(self._target, name))


def in_process_reward_worker(config: DictConfig) -> RewardLoopWorker:
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    return RewardLoopWorker(config)
