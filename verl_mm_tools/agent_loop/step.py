"""What happens to a batch of finished mm_tool trajectories before verl trains on it (or scores it in validation),
the same on both of verl's trainers:

1. step metrics (``stats.aggregate_metrics``, plus ``tool_call_counts/{min,max,mean}``);
2. the masked-batch guard: a batch in which more than ``max_masked_fraction`` of the mm_tool trajectories were
   masked (trained on nothing) stops the run with the most common error (``MaskedBatchError``);
3. trajectory dumps: the step and rewards are added and the caps enforced (``dump``);
4. per-turn rewards for ``mm_turn_grpo``: each trajectory's ``mm_tool/turn_rewards`` go onto the last token of each
   of its assistant turns in ``rm_scores`` (``rewards.turn_credit``).

The v1 trainer's ``MMToolReplayBuffer`` (``replay_buffer``) and the classic trainer's ``MMToolAgentLoopManager``
(``manager``) each build a ``StepBatch`` from what their trainer hands them and call ``process_step``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from verl_mm_tools.agent_loop.dump import finalize_step_dumps
from verl_mm_tools.agent_loop.stats import PREFIX, aggregate_metrics
from verl_mm_tools.errors import ConfigError, VerlMMToolsError
from verl_mm_tools.rewards.turn_credit import place_turn_rewards

logger = logging.getLogger(__name__)

MASKED_LIMIT_KEY = PREFIX + "max_masked_fraction"
TURN_CREDIT_KEY = PREFIX + "turn_credit"
TURN_REWARDS_KEY = PREFIX + "turn_rewards"


class MaskedBatchError(VerlMMToolsError, RuntimeError):
    """Too many trajectories of one batch were masked: training on it would train on (nearly) nothing."""


@dataclass
class StepBatch:
    """One batch of finished trajectories as either trainer hands it over.

    ``columns`` holds the loop's extra fields, one sequence per key with a value per row (None where a row lacks
    the key, e.g. a trajectory of another agent loop). ``rm_scores`` is changed in place by ``process_step``.
    """

    columns: Mapping[str, Sequence]
    response_mask: torch.Tensor  # (rows, response length), right-padded with 0
    rm_scores: torch.Tensor | None  # like response_mask; None when rewards are computed after this point
    rollout_n: list[int]  # each row's rollout number within its prompt group
    reward_extra: list[dict] = field(default_factory=list)  # each row's reward_extra_info ({} when unknown)
    step: int = -1
    validate: bool = False

    def column(self, key: str) -> list:
        values = self.columns.get(key)
        return [None] * len(self.rollout_n) if values is None else list(values)


def process_step(batch: StepBatch) -> dict[str, float]:
    """Metrics of the batch (``mm_tool/*``, ``tool_call_counts/*``); raises MaskedBatchError (see module)."""
    metrics = aggregate_metrics(batch.columns)
    metrics.update(_tool_call_counts(batch))
    check_masked_fraction(batch)
    metrics.update(finalize_step_dumps(batch))  # before turn rewards join rm_scores: a dump shows the manager's score
    unplaced = _place_turn_rewards(batch)
    if unplaced is not None:
        metrics[PREFIX + "turn_rewards/unplaced"] = float(unplaced)
    return metrics


def _tool_call_counts(batch: StepBatch) -> dict[str, float]:
    counts = [value for value in batch.column("tool_call_counts") if value is not None]
    if not counts:
        return {}
    values = np.asarray(counts, dtype=np.float64)
    return {"tool_call_counts/min": float(values.min()), "tool_call_counts/max": float(values.max()),
            "tool_call_counts/mean": float(values.mean())}


def check_masked_fraction(batch: StepBatch) -> None:
    """Raise MaskedBatchError when the mm_tool trajectories masked in this batch exceed their loop's limit."""
    rows = [(masked, error, limit) for masked, error, limit in
            zip(batch.column(PREFIX + "masked"), batch.column(PREFIX + "error"), batch.column(MASKED_LIMIT_KEY))
            if masked is not None]
    limits = [float(limit) for _, _, limit in rows if limit is not None]
    errors = [str(error) for masked, error, _ in rows if masked]
    if not rows or len(errors) / len(rows) <= min(limits, default=1.0):
        return
    example, count = _most_common(errors)
    kind = "validation" if batch.validate else "training"
    raise MaskedBatchError(
        f"{len(errors)} of {len(rows)} mm_tool trajectories of {kind} step {batch.step} were masked (trained on "
        f"nothing), more than max_masked_fraction={min(limits):g}; the most common error ({count} of them): "
        f"{example}. Fix the cause (often the data or the config: prompts longer than data.max_prompt_length, "
        "images over the mm_tool budget, unreadable image files), or raise max_masked_fraction in the mm_tool "
        "agent-loop config."
    )


def _most_common(errors: list[str]) -> tuple[str, int]:
    """The most common error, counting errors that differ only in their numbers (a token count, say) as one;
    returns its first occurrence and the count."""
    kinds = Counter(re.sub(r"\d+", "N", error) for error in errors)
    kind, count = kinds.most_common(1)[0]
    return next(error for error in errors if re.sub(r"\d+", "N", error) == kind), count


def _place_turn_rewards(batch: StepBatch) -> int | None:
    """Per-turn rewards onto rm_scores for the rows whose loop uses turn credit; how many rows could not be placed
    (None when no row uses turn credit)."""
    rows = [row for row, enabled in enumerate(batch.column(TURN_CREDIT_KEY)) if enabled]
    if not rows:
        return None
    if batch.rm_scores is None:
        logger.warning("mm_turn_grpo: no rewards at this point (reward not computed during rollout); per-turn rewards "
                       "of %d trajectories were not placed", len(rows))
        return len(rows)
    turn_rewards = batch.column(TURN_REWARDS_KEY)
    index = torch.tensor(rows)
    scores = batch.rm_scores[index]
    skipped = place_turn_rewards(scores, batch.response_mask[index], [turn_rewards[row] for row in rows])
    batch.rm_scores[index] = scores
    if skipped:
        logger.warning("mm_turn_grpo: %d trajectories' turn counts did not match their turn rewards", skipped)
    return skipped


# ----- which trainer-side hook a run needs ---------------------------------------------------------------------------

MANAGER_FQN = "verl_mm_tools.agent_loop.manager.MMToolAgentLoopManager"
SAMPLER_PATH = "pkg://verl_mm_tools.agent_loop.replay_buffer"
SAMPLER_NAME = "MMToolReplayBuffer"


def uses_v1_trainer(trainer_config) -> bool:
    return bool(trainer_config.trainer.get("use_v1", True))  # verl 0.9.1's default


def hook_overrides(trainer_config=None, *, v1: bool | None = None) -> list[str]:
    """The hydra overrides that select the step hook of the trainer this config runs (or of the v1 or classic
    trainer, by ``v1``)."""
    if v1 if v1 is not None else uses_v1_trainer(trainer_config):
        return [f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
                f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}"]
    return [f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_FQN}"]


def step_hook_configured(trainer_config) -> bool:
    """Whether ``process_step`` runs in this config's trainer: verl-mm-tools' replay buffer on the v1 trainer, its
    agent-loop manager (or a subclass) on the classic one."""
    if uses_v1_trainer(trainer_config):
        sampler = trainer_config.trainer.get("v1", {}).get("sampler", {}).get("custom_sampler") or {}
        return _loads_subclass(sampler.get("path"), sampler.get("name"), SAMPLER_NAME)
    agent = trainer_config.actor_rollout_ref.rollout.get("agent") or {}
    module, _, name = str(agent.get("agent_loop_manager_class") or "").rpartition(".")
    return _loads_subclass(f"pkg://{module}" if module else None, name, "MMToolAgentLoopManager")


def _loads_subclass(path: str | None, name: str | None, ours: str) -> bool:
    if not path or not name:
        return False
    from verl.utils.import_utils import load_extern_object

    try:
        configured = load_extern_object(path, name)
    except (ImportError, AttributeError, FileNotFoundError, ValueError):
        return False
    return isinstance(configured, type) and any(base.__name__ == ours and base.__module__.startswith("verl_mm_tools")
                                                for base in configured.__mro__)


def require_step_hook(trainer_config, needed_for: str) -> None:
    """Refuse an option that only works with the trainer-side hook when the hook is not configured."""
    if step_hook_configured(trainer_config):
        return
    trainer = "v1 (trainer.use_v1=true, verl's default)" if uses_v1_trainer(trainer_config) else "classic"
    raise ConfigError(
        f"{needed_for} needs verl-mm-tools' step hook, which this run's {trainer} trainer does not have: set "
        + " ".join(hook_overrides(trainer_config))
    )


def refuse_unsupported_with_hook(trainer_config) -> None:
    """verl hands a custom replay buffer no DAPO settings: with ours, ``algorithm.filter_groups`` would silently do
    nothing, so it is refused."""
    filter_groups = trainer_config.algorithm.get("filter_groups") or {}
    if uses_v1_trainer(trainer_config) and filter_groups.get("enable") and step_hook_configured(trainer_config):
        raise ConfigError(
            "algorithm.filter_groups.enable=true (DAPO dynamic sampling) does not work with verl-mm-tools' replay "
            f"buffer: verl gives a custom sampler ({SAMPLER_NAME}) no group-filtering settings, so no group would be "
            "filtered. Drop trainer.v1.sampler.custom_sampler (losing mm_tool step metrics, dumps and mm_turn_grpo) "
            "or disable filter_groups."
        )
