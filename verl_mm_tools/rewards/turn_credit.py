"""Turn-level credit for multi-turn trajectories: the ``mm_turn_grpo`` advantage estimator.

Definitions, for trajectory i of a prompt group (same ``uid``) whose assistant turns j = 1..T_i are the runs of
generated tokens (``response_mask == 1``):

- turn reward ``R_ij``: the sum of ``token_level_rewards`` from the first token of turn j up to (not including) the
  first token of turn j+1, so a reward placed on turn j's last token, or on the context tokens after it, belongs to
  turn j. The reward manager's final score sits on the last token and belongs to the last turn;
  the step hook (``step_hook.step``) places the loop's per-turn rewards (tool step rewards + environment rewards,
  ``mm_tool/turn_rewards``) on the last token of each turn.
- discounted return from turn j on: ``G_ij = sum_{k >= j} gamma^(k - j) R_ik``;
- baseline and scale: the mean ``b`` and standard deviation ``s`` over the group of the whole-trajectory returns
  ``G_i1``;
- advantage of every generated token of turn j: ``A_ij = (G_ij - b) / (s + eps)`` (``G_ij - b`` when
  ``norm_adv_by_std_in_grpo`` is off, as in Dr.GRPO).

Why one baseline per group and not per turn index (verl RFC #7244): normalising the returns of turn j only over the
trajectories that reached turn j subtracts a baseline whose number of terms depends on the trajectory's own
stopping turn, an action-dependent baseline, which biases the gradient whenever the policy decides when to stop
(every tool-use agent does). ``b`` depends on no action of the trajectory being credited beyond what plain GRPO
already accepts, so the estimator is as unbiased as GRPO. With one turn, or with only a final reward and gamma = 1,
it is exactly GRPO.

Select it with ``algorithm.adv_estimator=mm_turn_grpo``; ``algorithm.gamma`` is the per-turn discount.

A trajectory exported as several training samples (the mm_tool loop's ``export``, on verl's v1 trainer) gets the
same credit: the step hook places each sample's own turn rewards (the final reward only on the final sample), adds to
each earlier sample's last turn the discounted return of the next sample's first turn (``chain_sample_returns``), so
``G_ij`` of every turn is the trajectory's, and marks every sample after a trajectory's first with
``CONTINUATION_MARK`` in its ``uid``, so the group baseline and scale are still taken over trajectories (their first
samples' whole returns) while every sample's turns get their advantages.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from verl.trainer.config import AlgoConfig

logger = logging.getLogger(__name__)

ESTIMATOR_NAME = "mm_turn_grpo"
CONTINUATION_MARK = "#mm_turn_sample"  # appended to the uid of a trajectory's samples after its first


def turn_spans(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in a response mask row: the assistant turns."""
    values = mask_row.tolist()
    spans, start = [], None
    for position, value in enumerate(values):
        if value and start is None:
            start = position
        elif not value and start is not None:
            spans.append((start, position))
            start = None
    if start is not None:
        spans.append((start, len(values)))
    return spans


def _turn_returns(rewards_row: torch.Tensor, spans: Sequence[Sequence[int]], gamma: float) -> list[float]:
    """``G_ij`` of each turn of one row (its rewards up to the next turn's start, the last turn's to the row's end)."""
    bounds = [start for start, _ in spans[1:]] + [rewards_row.shape[0]]
    # strict=False: without spans, bounds still holds the row's end
    turn_rewards = [float(rewards_row[start:bound].sum()) for (start, _), bound in zip(spans, bounds, strict=False)]
    returns, running = [], 0.0
    for reward in reversed(turn_rewards):
        running = reward + gamma * running
        returns.append(running)
    return returns[::-1]


def compute_turn_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgoConfig | None = None,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage-estimator signature; see the module docstring for the definition."""
    gamma = float(getattr(config, "gamma", 1.0) if config is not None else 1.0)
    if config is not None:
        norm_adv_by_std_in_grpo = bool(getattr(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo))
    with torch.no_grad():
        spans = [turn_spans(row) for row in response_mask]
        returns = [_turn_returns(token_level_rewards[i], spans[i], gamma) for i in range(len(spans))]
        groups = [str(uid).split(CONTINUATION_MARK)[0] for uid in index]
        starts = [CONTINUATION_MARK not in str(uid) for uid in index]
        baseline, scale = _group_statistics(
            [group for group, start in zip(groups, starts, strict=True) if start],
            [row[0] if row else 0.0 for row, start in zip(returns, starts, strict=True) if start],
        )
        advantages = torch.zeros_like(token_level_rewards, dtype=torch.float32)
        for i, (row_spans, row_returns) in enumerate(zip(spans, returns, strict=True)):
            b, s = baseline.get(groups[i], 0.0), scale.get(groups[i], 1.0)
            for (start, end), value in zip(row_spans, row_returns, strict=True):
                advantage = (value - b) / (s + epsilon) if norm_adv_by_std_in_grpo else value - b
                advantages[i, start:end] = advantage
        advantages = advantages * response_mask
    return advantages, advantages


def _group_statistics(index: list[str], whole_returns: list[float]) -> tuple[dict[str, float], dict[str, float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for uid, value in zip(index, whole_returns, strict=True):
        groups[uid].append(value)
    baseline, scale = {}, {}
    for uid, values in groups.items():
        if len(values) == 1:  # as verl's GRPO: a lone sample is its own baseline-free advantage
            baseline[uid], scale[uid] = 0.0, 1.0
        else:
            tensor = torch.tensor(values, dtype=torch.float32)
            baseline[uid], scale[uid] = float(tensor.mean()), float(tensor.std())
    return baseline, scale


def chain_sample_returns(
    rm_scores: torch.Tensor, rows: list[int], spans_per_row: Sequence[Sequence[Sequence[int]] | None], gamma: float
) -> None:
    """One trajectory's samples ``rows`` (in order, each holding its own turn rewards): add to each earlier sample's
    last turn's last token gamma times the return of the next sample's first turn (in place)."""
    following = None
    for row, spans in reversed(list(zip(rows, spans_per_row, strict=True))):
        spans = [tuple(span) for span in spans or []]
        if not spans:
            continue
        if following is not None:
            rm_scores[row, spans[-1][1] - 1] += gamma * following
        following = _turn_returns(rm_scores[row], spans, gamma)[0]


def place_turn_rewards(
    rm_scores: torch.Tensor,
    turn_spans_per_row: Sequence[Sequence[Sequence[int]] | None],
    turn_rewards_per_row: Sequence[Sequence[float] | None],
) -> int:
    """Add each trajectory's per-turn rewards on the last generated token of each of its turns (in place); a row's
    turns are its ``[start, end)`` response spans, as the loop recorded them.

    Returns how many trajectories were skipped because their turn count did not match their reward list (they keep
    only the final score; the caller reports them).
    """
    skipped = 0
    for i, (spans, rewards) in enumerate(zip(turn_spans_per_row, turn_rewards_per_row, strict=True)):
        spans, rewards = list(spans or []), list(rewards or [])
        if not spans:  # masked trajectory: nothing is trained, nothing to credit
            continue
        if len(spans) != len(rewards) or any(end <= start for start, end in spans):
            skipped += 1
            continue
        for (_, end), reward in zip(spans, rewards, strict=True):
            rm_scores[i, end - 1] += float(reward)
    return skipped
