"""verl's v1 trainer's step hook: a replay buffer that runs ``step.process_step`` on every batch it hands the trainer.

On the v1 trainer (``trainer.use_v1=true``, verl's default) agent loops put their outputs into TransferQueue and the
trainer samples batches from a replay buffer; the only channel from a sampled batch to verl's logger is the metrics
dict the replay buffer returns with it. Select this one for any trainer mode (sync, colocate_async,
separate_async) with::

    trainer.v1.sampler.custom_sampler.path=pkg://verl_mm_tools.step_hook.replay_buffer
    trainer.v1.sampler.custom_sampler.name=MMToolReplayBuffer

It samples exactly as verl's own (``ReplayBuffer`` for ``sync``, ``ReplayBufferAsync`` otherwise), then reads the
batch's extra fields, rewards and masks from TransferQueue and returns the step metrics (``mm_tool/*``, and
``tool_call_counts/*``, which verl's v1 trainer does not compute) with verl's; per-turn rewards for ``mm_turn_grpo``
are written back to ``rm_scores``.

Options (``trainer.v1.sampler.sampler_kwargs``): ``poll_interval_s`` (default 0.05): how often the buffer looks for
finished trajectories. verl's buffer polls every 2 s, which added up to 2 s to every step (and validation) on CPU; at
0.1 s the wait after the last trajectory was 0.04-0.06 s of a ~4.4 s CPU step, at 0.05 s ~0.02 s, each poll (one
TransferQueue ``kv_list``) ~3 ms of wall time and ~0.2 ms of the trainer's CPU (issue #49).

verl hands a custom sampler no DAPO group-filtering settings: ``algorithm.filter_groups`` cannot work with it, and
the mm_tool loop refuses the combination (``step.refuse_unsupported_with_hook``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import Adaptation, Section, Target
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.handoff import fill_missing_weight_versions
from verl_mm_tools.rewards.turn_credit import CONTINUATION_MARK
from verl_mm_tools.step_hook.batch import StepBatch
from verl_mm_tools.step_hook.judge import judge_masked_rows
from verl_mm_tools.step_hook.step import CallRateWatch, process_step
from verl_mm_tools.step_metrics import UNVERSIONED_SAMPLES

if TYPE_CHECKING:
    from transfer_queue import KVBatchMeta


DEFAULT_POLL_INTERVAL_S = 0.05
SAMPLER_OPTIONS = ("poll_interval_s",)


ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.trainer.ppo.v1.replay_buffer",
            "ReplayBuffer.sample",
            "cdcecebeb7f0b44e9726b62e208fb6821023591d8b91b0a9ad56750a96363e43",
        ),
    ),
    what=(
        "the v1 trainer's step hook (`trainer.v1.sampler.custom_sampler`): samples as verl's buffer does, then "
        "returns the step metrics, writes per-turn rewards to `rm_scores` and gives a sample masked before it "
        "generated the batch's oldest weight version; polls every 0.05 s"
    ),
    why=(
        "the returned metrics dict is the v1 trainer's only channel to the logger; verl's buffer polls every 2 s; "
        "the trainer's metrics read every sample's `min_global_steps` as an int, and verl drops a failed trajectory "
        "where the mm_tool loop masks it"
    ),
    applies_to="verl 0.9.1 v1 trainer",
    proof="none (an extension)",
)


@ADAPTATION.implements
class MMToolReplayBuffer(ReplayBuffer):
    """verl's replay buffer plus the mm_tool step hook (see module). ``trainer_mode`` other than ``sync`` builds a
    ``MMToolReplayBufferAsync``, as verl builds ``ReplayBufferAsync``."""

    def __new__(cls, *args: Any, trainer_mode: str = "sync", **kwargs: Any) -> MMToolReplayBuffer:  # verl's arguments
        if cls is MMToolReplayBuffer and trainer_mode != "sync":
            cls = MMToolReplayBufferAsync
        return super().__new__(cls)

    def __init__(self, *args: Any, sampler_kwargs: Mapping | None = None, **kwargs: Any) -> None:
        confirm(ADAPTATION)  # the verl method it samples as changed: refuses to start
        # verl's trainer passes sampler_kwargs by keyword (its config node, None when unset); it goes on unchanged
        kwargs["sampler_kwargs"] = sampler_kwargs
        super().__init__(*args, **kwargs)
        self.poll_interval = _poll_interval(sampler_kwargs or {})
        self.call_rate_watch = CallRateWatch()

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        step, lengths = read_step_batch(batch.keys, partition_id, global_steps)
        metrics.update(process_step(step, self.call_rate_watch))
        metrics.update(tool_call_counts(step.trajectories()))
        # a sync step generates with version global_steps - 1: the guess where no sample of the batch has one
        metrics[UNVERSIONED_SAMPLES] = float(fill_missing_weight_versions(batch.tags, fallback=global_steps - 1))
        if step.rm_scores is not None and any(fields.turn_credit for _, fields in step.ours):
            write_padded(batch.keys, partition_id, "rm_scores", step.rm_scores, lengths)
            mark_continuations(batch.keys, partition_id, step)
        if judge_masked_rows(step):  # process_step zeroed them in the hook's padded copy
            write_padded(batch.keys, partition_id, "response_mask", step.response_mask, lengths)
        return batch, metrics


@ADAPTATION.implements
class MMToolReplayBufferAsync(MMToolReplayBuffer, ReplayBufferAsync):
    """For ``colocate_async`` and ``separate_async``."""


def tool_call_counts(batch: StepBatch) -> dict[str, float]:
    """verl's ``tool_call_counts/{min,max,mean}``: its classic trainer computes them from the batch, its v1 trainer
    does not."""
    counts = [fields.tool_call_counts for _, fields in batch.ours]
    if not counts:
        return {}
    values = np.asarray(counts, dtype=np.float64)
    return {
        "tool_call_counts/min": float(values.min()),
        "tool_call_counts/max": float(values.max()),
        "tool_call_counts/mean": float(values.mean()),
    }


def _poll_interval(options: Mapping) -> float:
    unknown = sorted(set(options) - set(SAMPLER_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown trainer.v1.sampler.sampler_kwargs {unknown} for MMToolReplayBuffer; it takes "
            f"{list(SAMPLER_OPTIONS)}"
        )
    value = options.get("poll_interval_s", DEFAULT_POLL_INTERVAL_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 60:
        raise ConfigError(
            f"trainer.v1.sampler.sampler_kwargs.poll_interval_s must be in (0, 60] seconds, got {value!r}"
        )
    return float(value)


def read_step_batch(keys: list[str], partition_id: str, global_steps: int) -> tuple[StepBatch, list[int]]:
    """The sampled batch's extra fields, masks and rewards from TransferQueue (keys ``{uid}_{session}_{index}``),
    and each row's response length."""
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields", "response_mask"])
    rows = [fields if isinstance(fields, dict) else {} for fields in data.pop("extra_fields").tolist()]
    scores = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["rm_scores"])
    # no rm_scores yet when a colocated reward model scores the batch after sampling
    rm_scores = _padded(scores["rm_scores"], 0.0) if "rm_scores" in scores.keys() else None
    names = sorted({key for row in rows for key in row})
    step = StepBatch(
        columns={name: [row.get(name) for row in rows] for name in names},
        response_mask=_padded(data["response_mask"], 0),
        rm_scores=rm_scores,
        rollout_n=[int(key.rsplit("_", 2)[1]) for key in keys],
        reward_extra=[dict(row.get("reward_extra_info") or {}) for row in rows],
        step=global_steps,
        validate=partition_id == "val",
        trajectory_ids=[key.rsplit("_", 1)[0] for key in keys],
    )
    mask = data["response_mask"]
    return step, mask.offsets().diff().tolist() if mask.is_nested else [mask.shape[1]] * len(keys)


def mark_continuations(keys: list[str], partition_id: str, step: StepBatch) -> None:
    """mm_turn_grpo: the uid of every sample after a turn-credit trajectory's first gets ``CONTINUATION_MARK``, so
    the estimator takes its group baseline over trajectories (``rewards.turn_credit``)."""
    rows = [row for row, fields in step.ours if fields.turn_credit and fields.sample[0] > 0]
    if not rows:
        return
    uids = [keys[row].rsplit("_", 2)[0] + CONTINUATION_MARK for row in rows]
    fields = TensorDict({"uid": NonTensorStack(*(NonTensorData(uid) for uid in uids))}, batch_size=len(rows))
    tq.kv_batch_put(keys=[keys[row] for row in rows], partition_id=partition_id, fields=fields)


def _padded(tensor: torch.Tensor, padding: float) -> torch.Tensor:
    """TransferQueue packs a field's rows as a jagged nested tensor (or dense when it could not)."""
    return tensor.to_padded_tensor(padding) if tensor.is_nested else tensor


def write_padded(keys: list[str], partition_id: str, name: str, padded: torch.Tensor, lengths: list[int]) -> None:
    """Write a padded per-token field (turn-reward-placed ``rm_scores``, a judge-masked ``response_mask``) back to
    TransferQueue, each row at its own response length."""
    rows = torch.nested.as_nested_tensor(
        [padded[row, :length] for row, length in enumerate(lengths)], layout=torch.jagged
    )
    tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=TensorDict({name: rows}, batch_size=len(keys)))
