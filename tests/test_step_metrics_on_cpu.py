"""The step metrics of a batch's samples (``step_metrics.aggregate_metrics``): a trajectory's statistics count once,
the image bytes on every sample that carries them."""

from __future__ import annotations

import dataclasses

import pytest

from verl_mm_tools.agent_loop.state import TrajectoryState, TrajectoryStats
from verl_mm_tools.handoff import LoopSettings
from verl_mm_tools.step_metrics import (
    IMAGE_BYTES_OVER_RAW,
    SAMPLES_PER_TRAJECTORY,
    aggregate_metrics,
    mean_metric,
    tool_metric,
)

SETTINGS = LoopSettings(max_masked_fraction=0.5, call_rate_window=0, turn_credit=False, turn_gamma=1.0)


def per_turn_samples(calls: int, sample_bytes: list[int], distinct: dict[str, int]):
    """One trajectory exported as one sample per turn, each carrying the images up to its turn."""
    stats = TrajectoryStats(images=len(sample_bytes), sample_image_bytes=sample_bytes, distinct_images=distinct)
    state = TrajectoryState(stats=stats)
    for _ in range(calls):
        state.stats.record_call("zoom_in", 0.25, failed=False)
    return [state.sample_fields(SETTINGS, index, len(sample_bytes)) for index in range(len(sample_bytes))]


def test_a_per_turn_trajectorys_statistics_count_once_and_every_samples_image_bytes_count():
    # three turns of 100-byte images: the samples carry 1, 2 and 3 of them, 600 bytes for 300 distinct
    one = per_turn_samples(2, [100, 200, 300], {"a": 100, "b": 100, "c": 100})
    other = per_turn_samples(0, [100], {"a": 100})  # shows image a again: it counts once below the line
    metrics = aggregate_metrics(one + other)
    assert metrics[IMAGE_BYTES_OVER_RAW] == pytest.approx(700 / 300)
    assert metrics[SAMPLES_PER_TRAJECTORY] == 2.0
    assert metrics[mean_metric("tool_calls")] == 1.0  # (2 + 0) / 2 trajectories, not per sample
    assert metrics[tool_metric("zoom_in", "calls_per_trajectory")] == 1.0
    assert metrics[tool_metric("zoom_in", "time_s_per_call")] == 0.25


def test_no_trajectory_gives_no_metrics_and_an_unknown_mean_is_refused():
    assert aggregate_metrics([]) == {}
    assert aggregate_metrics([dataclasses.replace(per_turn_samples(0, [0], {})[0], sample=[0, 2])]) == {}
    with pytest.raises(KeyError, match="'reward' is not logged as a mean"):
        mean_metric("reward")
