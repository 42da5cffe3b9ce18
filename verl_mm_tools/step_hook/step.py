"""What happens to a batch of finished mm_tool trajectories before verl trains on it (or scores it in validation),
the same on both of verl's trainers:

1. step metrics (``stats.aggregate_metrics``, and ``mm_tool/reward/mean``: the mean reward per trajectory) and the
   tool-call guard (``CallRateWatch``: a warning when the share of trajectories that call a tool falls by half);
2. the masked-batch guard: a batch in which more than ``max_masked_fraction`` of the mm_tool trajectories were
   masked (trained on nothing) stops the run with the most common error (``MaskedBatchError``);
3. trajectory dumps: the step and rewards are added and the caps enforced (``dump``);
4. per-turn rewards for ``mm_turn_grpo``: each trajectory's ``mm_tool/turn_rewards`` go onto the last token of each
   of its assistant turns in ``rm_scores``; a trajectory exported as several samples has its samples' returns chained
   (``rewards.turn_credit``).

The v1 trainer's ``MMToolReplayBuffer`` (``replay_buffer``) and the classic trainer's ``MMToolAgentLoopManager``
(``manager``) each build a ``StepBatch`` from what their trainer hands them and call ``process_step``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter

import torch

from verl_mm_tools.agent_loop.state import (
    CALL_RATE_WINDOW_KEY,
    ERROR_KEY,
    MASKED_KEY,
    MASKED_LIMIT_KEY,
    PREFIX,
    SAMPLE_KEY,
    STOP_REASON_KEY,
    TURN_CREDIT_KEY,
    TURN_GAMMA_KEY,
    TURN_REWARDS_KEY,
    TURN_SPANS_KEY,
    is_final_sample,
)
from verl_mm_tools.errors import VerlMMToolsError
from verl_mm_tools.rewards.turn_credit import chain_sample_returns, place_turn_rewards
from verl_mm_tools.step_hook.batch import StepBatch
from verl_mm_tools.step_hook.dump import finalize_step_dumps
from verl_mm_tools.step_hook.stats import CALL_RATE, CALL_RATE_COLLAPSED, aggregate_metrics

logger = logging.getLogger(__name__)


class MaskedBatchError(VerlMMToolsError, RuntimeError):
    """Too many trajectories of one batch were masked: training on it would train on (nearly) nothing."""


class CallRateWatch:
    """Tool-use collapse guard, one per trainer: remembers each training step's tool-call rate and warns when a step's
    falls below half the highest of the previous ``call_rate_window`` steps (the loop option)."""

    def __init__(self):
        self.rates: list[tuple[int, float]] = []  # (step, tool-call rate) of the training steps seen

    def check(self, batch: StepBatch, metrics: dict[str, float]) -> None:
        windows = [int(window) for window in batch.column(CALL_RATE_WINDOW_KEY) if window is not None]
        if batch.validate or CALL_RATE not in metrics or not windows or min(windows) == 0:
            return
        window, rate = min(windows), metrics[CALL_RATE]
        earlier = self.rates[-window:]
        self.rates.append((batch.step, rate))
        if not earlier:
            return
        peak_step, peak = max(earlier, key=lambda entry: entry[1])
        collapsed = rate < peak / 2
        metrics[CALL_RATE_COLLAPSED] = float(collapsed)
        if collapsed:
            logger.warning(
                "tool-use collapse: %.0f%% of step %d's trajectories called a tool, against %.0f%% at step %d (within "
                "the last %d steps, the mm_tool option call_rate_window). The policy is dropping its tools: check "
                "that calling can pay (the reward, the tools' errors: mm_tool/tool/*/error_rate), and consider a KL "
                "loss to the starting policy or a lower learning rate.",
                100 * rate,
                batch.step,
                100 * peak,
                peak_step,
                window,
            )


def process_step(batch: StepBatch, watch: CallRateWatch | None = None) -> dict[str, float]:
    """Metrics of the batch (``mm_tool/*``); raises MaskedBatchError (see module). ``watch``: the trainer's tool-call
    guard (None: none)."""
    trajectories = batch.trajectories()
    metrics = aggregate_metrics(trajectories.columns)
    if watch is not None:
        watch.check(trajectories, metrics)
    samples = [sample for sample in batch.column(SAMPLE_KEY) if sample is not None]
    if samples:  # mm_tool rows: how many training samples a trajectory became (export)
        metrics[PREFIX + "samples_per_trajectory"] = len(samples) / sum(map(is_final_sample, samples))
    ours = [row for row, reason in enumerate(trajectories.column(STOP_REASON_KEY)) if reason is not None]
    if trajectories.rm_scores is not None and ours:
        # per trajectory: verl's critic/score/mean counts a trajectory exported as several samples once per sample
        metrics[PREFIX + "reward/mean"] = float(trajectories.rm_scores[ours].sum(dim=-1).mean())
        metrics.update(_reward_by_tool_use(trajectories, ours, trajectories.rm_scores))
    check_masked_fraction(trajectories)
    # before turn rewards join rm_scores: a dump shows the manager's score
    metrics.update(finalize_step_dumps(trajectories))
    unplaced = _place_turn_rewards(batch)
    if unplaced is not None:
        metrics[PREFIX + "turn_rewards/unplaced"] = float(unplaced)
    return metrics


def _reward_by_tool_use(batch: StepBatch, rows: list[int], rm_scores: torch.Tensor) -> dict[str, float]:
    """The mean reward of the trajectories that called a tool and of those that did not: whether calling pays, what
    a policy that is dropping its tools (or taking them up) follows."""
    calls = batch.column(PREFIX + "tool_calls")
    rewards = rm_scores.sum(dim=-1)
    metrics = {}
    for name, called in (("with_tool_calls", True), ("without_tool_calls", False)):
        chosen = [row for row in rows if ((calls[row] or 0) > 0) == called]
        if chosen:
            metrics[f"{PREFIX}reward/{name}"] = float(rewards[chosen].mean())
    return metrics


def check_masked_fraction(batch: StepBatch) -> None:
    """Raise MaskedBatchError when the mm_tool trajectories masked in this batch exceed their loop's limit."""
    rows = [
        (masked, error, limit)
        for masked, error, limit in zip(
            batch.column(MASKED_KEY), batch.column(ERROR_KEY), batch.column(MASKED_LIMIT_KEY)
        )
        if masked is not None
    ]
    limits = [float(limit) for _, _, limit in rows if limit is not None]
    errors = [str(error) for masked, error, _ in rows if masked]
    if not rows or len(errors) / len(rows) <= min(limits, default=1.0):
        return
    example, count = _most_common(errors)
    kind = "validation" if batch.validate else "training"
    raise MaskedBatchError(
        f"{len(errors)} of {len(rows)} mm_tool trajectories of {kind} step {batch.step} were masked (trained on "
        f"nothing), more than max_masked_fraction={min(limits):g}; the most common error ({count} of them): "
        f"{example}. {_advice(example)}"
    )


ENGINE_ERRORS = ("EngineDeadError", "EngineAbortedError")  # vLLM's dead engine; a reply the engine aborted


def _advice(error: str) -> str:
    if any(name in error for name in ENGINE_ERRORS):
        return (
            "The rollout engine failed, not the data: its own log (the rollout server's lines in the trainer's "
            "log: vLLMHttpServer, EngineCore) says why it died or aborted the requests."
        )
    return (
        "Fix the cause (often the data or the config: prompts longer than data.max_prompt_length, images over the "
        "mm_tool budget, unreadable image files), or raise max_masked_fraction in the mm_tool agent-loop config."
    )


def _most_common(errors: list[str]) -> tuple[str, int]:
    """The most common error, counting errors that differ only in their numbers (a token count, say) as one;
    returns its first occurrence and the count."""
    kinds = [re.sub(r"\d+", "N", error) for error in errors]
    kind, count = Counter(kinds).most_common(1)[0]
    return errors[kinds.index(kind)], count


def _place_turn_rewards(batch: StepBatch) -> int | None:
    """Per-turn rewards onto rm_scores for the rows whose loop uses turn credit; how many rows could not be placed
    (None when no row uses turn credit)."""
    rows = [row for row, enabled in enumerate(batch.column(TURN_CREDIT_KEY)) if enabled]
    if not rows:
        return None
    if batch.rm_scores is None:
        logger.warning(
            "mm_turn_grpo: no rewards at this point (reward not computed during rollout); per-turn rewards "
            "of %d trajectories were not placed",
            len(rows),
        )
        return len(rows)
    turn_rewards, turn_spans = batch.column(TURN_REWARDS_KEY), batch.column(TURN_SPANS_KEY)
    # verl copies the final reward to every sample of a trajectory: it belongs to the final one only
    samples = batch.column(SAMPLE_KEY)
    earlier = [row for row in rows if not is_final_sample(samples[row])]
    batch.rm_scores[torch.tensor(earlier, dtype=torch.long)] = 0.0
    index = torch.tensor(rows)
    scores = batch.rm_scores[index]
    skipped = place_turn_rewards(scores, [turn_spans[row] for row in rows], [turn_rewards[row] for row in rows])
    batch.rm_scores[index] = scores
    gammas = batch.column(TURN_GAMMA_KEY)
    for trajectory in batch.trajectory_samples(rows):
        gamma = 1.0 if gammas[trajectory[0]] is None else float(gammas[trajectory[0]])
        chain_sample_returns(batch.rm_scores, trajectory, [turn_spans[row] for row in trajectory], gamma)
    if skipped:
        logger.warning("mm_turn_grpo: %d trajectories' turn counts did not match their turn rewards", skipped)
    return skipped
