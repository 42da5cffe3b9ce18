"""What one trajectory did, as fixed-key ``extra_fields`` that verl carries into the batch.

Keys are the same for every trajectory (verl concatenates per-key arrays across workers). ``tool_call_counts`` is
the key verl's own ``compute_data_metrics`` reads (``tool_call_counts/{min,max,mean}``); the ``mm_tool/*`` keys are
aggregated per step by ``aggregate_metrics``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

STOP_REASONS = ("answered", "turn_limit", "length_limit", "budget", "error")
PREFIX = "mm_tool/"


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0
    time_s: float = 0.0


@dataclass
class TrajectoryStats:
    per_tool: dict[str, ToolStats] = field(default_factory=lambda: defaultdict(ToolStats))
    invalid_actions: int = 0
    ignored_calls: int = 0
    images: int = 0
    image_tokens: int = 0
    budget_refusals: int = 0
    budget_downscales: int = 0
    dropped_turns: int = 0
    attempts: int = 0
    turn_rewards: list[float] = field(default_factory=list)
    last_assistant_text: str = ""
    env_infos: list[dict] = field(default_factory=list)
    masked: bool = False
    stop_reason: str = "answered"
    error: str = ""

    @property
    def tool_calls(self) -> int:
        return sum(stats.calls for stats in self.per_tool.values())

    @property
    def tool_errors(self) -> int:
        return sum(stats.errors for stats in self.per_tool.values())

    def record_call(self, tool_name: str, seconds: float, failed: bool) -> None:
        stats = self.per_tool[tool_name]
        stats.calls += 1
        stats.errors += int(failed)
        stats.time_s += seconds

    def to_extra_fields(self) -> dict:
        return {
            "tool_call_counts": self.tool_calls,
            "attempts": max(1, self.attempts),  # answers given; read by the mm_turn_discount reward manager
            "last_assistant_text": self.last_assistant_text,
            PREFIX + "turn_rewards": list(self.turn_rewards),
            PREFIX + "env_infos": list(self.env_infos),
            PREFIX + "tool_calls": self.tool_calls,
            PREFIX + "tool_errors": self.tool_errors,
            PREFIX + "tool_time_s": sum(stats.time_s for stats in self.per_tool.values()),
            PREFIX + "valid_actions": self.tool_calls - self.tool_errors,
            PREFIX + "invalid_actions": self.invalid_actions,
            PREFIX + "ignored_calls": self.ignored_calls,
            PREFIX + "images": self.images,
            PREFIX + "image_tokens": self.image_tokens,
            PREFIX + "budget_refusals": self.budget_refusals,
            PREFIX + "budget_downscales": self.budget_downscales,
            PREFIX + "dropped_turns": self.dropped_turns,
            PREFIX + "masked": int(self.masked),
            PREFIX + "stop_reason": self.stop_reason,
            PREFIX + "error": self.error,
            PREFIX + "per_tool": {name: vars(stats).copy() for name, stats in self.per_tool.items()},
        }


def aggregate_metrics(non_tensor_batch: dict) -> dict[str, float]:
    """Step-level metrics from a batch's mm_tool extra fields (trajectories of other loops are skipped)."""
    stop = non_tensor_batch.get(PREFIX + "stop_reason")
    if stop is None:
        return {}
    rows = [index for index, reason in enumerate(stop) if reason is not None]
    if not rows:
        return {}
    metrics = {}
    attempts = np.asarray([non_tensor_batch["attempts"][index] for index in rows], dtype=np.float64)
    metrics[PREFIX + "attempts/mean"] = float(attempts.mean())
    for key in ("tool_calls", "tool_errors", "tool_time_s", "images", "image_tokens", "budget_refusals",
                "budget_downscales", "dropped_turns", "masked", "invalid_actions", "ignored_calls"):
        values = np.asarray([non_tensor_batch[PREFIX + key][index] for index in rows], dtype=np.float64)
        metrics[f"{PREFIX}{key}/mean"] = float(values.mean())
    metrics[PREFIX + "masked/count"] = float(sum(non_tensor_batch[PREFIX + "masked"][index] for index in rows))
    valid = sum(non_tensor_batch[PREFIX + "valid_actions"][index] for index in rows)
    actions = valid + sum(non_tensor_batch[PREFIX + "tool_errors"][index] for index in rows)
    actions += sum(non_tensor_batch[PREFIX + "invalid_actions"][index] for index in rows)
    metrics[PREFIX + "valid_action_rate"] = float(valid / actions) if actions else 1.0
    for reason in STOP_REASONS:
        metrics[f"{PREFIX}stop/{reason}"] = sum(stop[index] == reason for index in rows) / len(rows)
    metrics.update(_per_tool_metrics([non_tensor_batch[PREFIX + "per_tool"][index] for index in rows]))
    return metrics


def _per_tool_metrics(per_tool_rows: list[dict]) -> dict[str, float]:
    totals: dict[str, ToolStats] = defaultdict(ToolStats)
    for row in per_tool_rows:
        for name, stats in (row or {}).items():
            totals[name].calls += stats["calls"]
            totals[name].errors += stats["errors"]
            totals[name].time_s += stats["time_s"]
    metrics = {}
    for name, stats in totals.items():
        metrics[f"{PREFIX}tool/{name}/calls_per_trajectory"] = stats.calls / len(per_tool_rows)
        metrics[f"{PREFIX}tool/{name}/error_rate"] = stats.errors / stats.calls if stats.calls else 0.0
        metrics[f"{PREFIX}tool/{name}/time_s_per_call"] = stats.time_s / stats.calls if stats.calls else 0.0
    return metrics
