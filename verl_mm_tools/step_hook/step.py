"""What happens to a batch of finished mm_tool trajectories before verl trains on it (or scores it in validation),
the same on both of verl's trainers:

1. step metrics (``stats.aggregate_metrics``, and ``mm_tool/reward/mean``: the mean reward per trajectory) and the
   tool-call guard (``CallRateWatch``: a warning when the share of trajectories that call a tool falls by half);
2. a judge reward's images leave the batch, the trajectories it could not score are masked where asked, and its
   metrics (``judge``: ``mm_tool/judge/*``);
3. the masked-batch guard: a batch in which more than ``max_masked_fraction`` of the mm_tool trajectories were
   masked (trained on nothing) stops the run with the most common error (``MaskedBatchError``);
4. trajectory dumps: the step and rewards are added and the caps enforced (``dump``);
5. per-turn rewards for ``mm_turn_grpo``: each trajectory's ``mm_tool/turn_rewards`` go onto the last token of each
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

from verl_mm_tools.errors import VerlMMToolsError
from verl_mm_tools.rewards.turn_credit import chain_sample_returns, place_turn_rewards
from verl_mm_tools.step_hook.batch import StepBatch
from verl_mm_tools.step_hook.dump import finalize_step_dumps
from verl_mm_tools.step_hook.judge import judge_step
from verl_mm_tools.step_metrics import (
    CALL_RATE,
    CALL_RATE_COLLAPSED,
    REWARD_MEAN,
    REWARD_WITH_TOOLS,
    REWARD_WITHOUT_TOOLS,
    TURN_REWARDS_UNPLACED,
    aggregate_metrics,
)

logger = logging.getLogger(__name__)


class MaskedBatchError(VerlMMToolsError, RuntimeError):
    """Too many trajectories of one batch were masked: training on it would train on (nearly) nothing."""


class CallRateWatch:
    """Tool-use collapse guard, one per trainer: remembers each training step's tool-call rate and warns when a step's
    falls below half the highest of the previous ``call_rate_window`` steps (the loop option)."""

    def __init__(self) -> None:
        self.rates: list[tuple[int, float]] = []  # (step, tool-call rate) of the training steps seen

    def check(self, batch: StepBatch, metrics: dict[str, float]) -> None:
        windows = [int(fields.call_rate_window) for _, fields in batch.ours]
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
    metrics = aggregate_metrics([fields for _, fields in batch.ours])
    if watch is not None:
        watch.check(trajectories, metrics)
    ours = [row for row, _ in trajectories.ours]
    if trajectories.rm_scores is not None and ours:
        metrics[REWARD_MEAN] = float(trajectories.rm_scores[ours].sum(dim=-1).mean())
        metrics.update(_reward_by_tool_use(trajectories, ours, trajectories.rm_scores))
    metrics.update(judge_step(batch))
    check_masked_fraction(trajectories)
    # before turn rewards join rm_scores: a dump shows the manager's score
    metrics.update(finalize_step_dumps(trajectories))
    unplaced = _place_turn_rewards(batch)
    if unplaced is not None:
        metrics[TURN_REWARDS_UNPLACED] = float(unplaced)
    return metrics


def _reward_by_tool_use(batch: StepBatch, rows: list[int], rm_scores: torch.Tensor) -> dict[str, float]:
    """The mean reward of the trajectories that called a tool and of those that did not: whether calling pays, what
    a policy that is dropping its tools (or taking them up) follows."""
    calls = [0 if fields is None else fields.tool_calls for fields in batch.fields]
    rewards = rm_scores.sum(dim=-1)
    metrics = {}
    for name, called in ((REWARD_WITH_TOOLS, True), (REWARD_WITHOUT_TOOLS, False)):
        chosen = [row for row in rows if (calls[row] > 0) == called]
        if chosen:
            metrics[name] = float(rewards[chosen].mean())
    return metrics


def check_masked_fraction(batch: StepBatch) -> None:
    """Raise MaskedBatchError when the mm_tool trajectories masked in this batch exceed their loop's limit."""
    rows = [fields for _, fields in batch.ours]
    errors = [str(fields.error) for fields in rows if fields.masked]
    limit = min((float(fields.max_masked_fraction) for fields in rows), default=1.0)
    if not rows or len(errors) / len(rows) <= limit:
        return
    example, count = _most_common(errors)
    kind = "validation" if batch.validate else "training"
    raise MaskedBatchError(
        f"{len(errors)} of {len(rows)} mm_tool trajectories of {kind} step {batch.step} were masked (trained on "
        f"nothing), more than max_masked_fraction={limit:g}; the most common error ({count} of them): "
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
    credited = [(row, fields) for row, fields in batch.ours if fields.turn_credit]
    rows = [row for row, _ in credited]
    if not rows:
        return None
    if batch.rm_scores is None:
        logger.warning(
            "mm_turn_grpo: no rewards at this point (reward not computed during rollout); per-turn rewards "
            "of %d trajectories were not placed",
            len(rows),
        )
        return len(rows)
    # verl copies the final reward to every sample of a trajectory: it belongs to the final one only
    earlier = [row for row, fields in credited if not fields.is_final]
    batch.rm_scores[torch.tensor(earlier, dtype=torch.long)] = 0.0
    index = torch.tensor(rows)
    scores = batch.rm_scores[index]
    skipped = place_turn_rewards(
        scores, [fields.turn_spans for _, fields in credited], [fields.turn_rewards for _, fields in credited]
    )
    batch.rm_scores[index] = scores
    by_row = dict(credited)
    for trajectory in batch.trajectory_samples(rows):
        gamma = float(by_row[trajectory[0]].turn_gamma)
        chain_sample_returns(batch.rm_scores, trajectory, [by_row[row].turn_spans for row in trajectory], gamma)
    if skipped:
        logger.warning("mm_turn_grpo: %d trajectories' turn counts did not match their turn rewards", skipped)
    return skipped
