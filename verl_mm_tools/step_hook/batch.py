"""One batch of finished trajectories as either trainer hands it to the step hook (``step.process_step``, the dumps'
finalisation)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from verl_mm_tools.handoff import SampleFields


@dataclass
class StepBatch:
    """One batch of finished trajectories as either trainer hands it over.

    ``columns`` holds the loop's extra fields, one sequence per key with a value per row (None where a row lacks
    the key, e.g. a trajectory of another agent loop); ``fields`` reads them per row. ``rm_scores`` is changed in
    place by ``process_step``.
    """

    columns: Mapping[str, Sequence]
    response_mask: torch.Tensor  # (rows, response length), right-padded with 0
    rm_scores: torch.Tensor | None  # like response_mask; None when rewards are computed after this point
    rollout_n: list[int]  # each row's rollout number within its prompt group
    reward_extra: list[dict] = field(default_factory=list)  # each row's reward_extra_info ({} when unknown)
    step: int = -1
    validate: bool = False
    # each row's trajectory (``{uid}_{session}`` on the v1 trainer); None where every row is its own trajectory
    trajectory_ids: list[str] | None = None

    @cached_property
    def fields(self) -> list[SampleFields | None]:
        """What the mm_tool loop handed over with each row (None for a row of another agent loop)."""
        return SampleFields.rows(self.columns, len(self.rollout_n))

    @property
    def ours(self) -> list[tuple[int, SampleFields]]:
        """The mm_tool rows, each with its fields."""
        return [(row, fields) for row, fields in enumerate(self.fields) if fields is not None]

    def trajectories(self) -> StepBatch:
        """One row per trajectory: each trajectory's final training sample (``export`` per_turn / auto give a
        trajectory several rows, each carrying the trajectory's statistics)."""
        rows = [row for row, fields in enumerate(self.fields) if fields is None or fields.is_final]
        if len(rows) == len(self.rollout_n):
            return self
        index = torch.tensor(rows, dtype=torch.long)
        return StepBatch(
            columns={key: [values[row] for row in rows] for key, values in self.columns.items()},
            response_mask=self.response_mask[index],
            rm_scores=None if self.rm_scores is None else self.rm_scores[index],
            rollout_n=[self.rollout_n[row] for row in rows],
            reward_extra=[self.reward_extra[row] for row in rows] if self.reward_extra else [],
            step=self.step,
            validate=self.validate,
            trajectory_ids=[self.trajectory_ids[row] for row in rows] if self.trajectory_ids else None,
        )

    def trajectory_samples(self, rows: list[int]) -> list[list[int]]:
        """The given rows of trajectories exported as several samples, grouped per trajectory in sample order."""
        grouped: dict[str, list[tuple[int, int]]] = {}  # trajectory -> (sample index, row)
        for row in rows:
            fields = self.fields[row]
            if fields is not None and fields.sample[1] > 1:
                if self.trajectory_ids is None:
                    raise ValueError("rows of multi-sample trajectories need trajectory_ids (the v1 trainer's keys)")
                grouped.setdefault(self.trajectory_ids[row], []).append((fields.sample[0], row))
        return [[row for _, row in sorted(group)] for group in grouped.values()]
