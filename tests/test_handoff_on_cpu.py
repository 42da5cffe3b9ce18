"""The typed hand-off (``handoff.SampleFields``): its keys, how a row of a batch reads back, and what a row of
another agent loop or a record of an older version reads as."""

from __future__ import annotations

import dataclasses

import pytest

from verl_mm_tools.agent_loop.state import TrajectoryState, TrajectoryStats
from verl_mm_tools.handoff import LoopSettings, SampleFields, StopReason

SETTINGS = LoopSettings(max_masked_fraction=0.25, call_rate_window=4, turn_credit=True, turn_gamma=0.9)


def fields_of(calls: int, sample: int = 0, samples: int = 1) -> SampleFields:
    state = TrajectoryState(stats=TrajectoryStats(images=1 + calls, attempts=2))
    for _ in range(calls):
        state.stats.record_call("rotate", 0.5, failed=False)
    for reward in range(samples):
        turn = state.start_turn(prompt_end=3, images_before=1)
        turn.sample, turn.reward, turn.response_span = reward, float(reward), (0, 2)
    state.stop_reason = StopReason.TURN_LIMIT
    return state.sample_fields(SETTINGS, sample, samples)


def columns(*rows: SampleFields | None) -> dict[str, list]:
    """Rows as verl concatenates them: a key a row lacks (another loop's) reads None there."""
    keys = {SampleFields.key(item.name) for item in dataclasses.fields(SampleFields)}
    return {key: [None if row is None else row.extra_fields()[key] for row in rows] for key in keys}


def test_every_field_is_an_mm_tool_key_but_the_three_verl_and_the_reward_managers_read():
    keys = [SampleFields.key(item.name) for item in dataclasses.fields(SampleFields)]
    assert [key for key in keys if not key.startswith("mm_tool/")] == [
        "tool_call_counts",
        "attempts",
        "last_assistant_text",
    ]
    assert SampleFields.key("stop_reason") == "mm_tool/stop_reason" and len(set(keys)) == len(keys)


def test_the_loops_record_reads_back_field_for_field_and_another_loops_row_reads_none():
    first, last = fields_of(2, 0, 2), fields_of(2, 1, 2)
    assert (first.tool_calls, first.tool_call_counts, first.valid_actions, first.attempts) == (2, 2, 2, 2)
    assert (first.sample, last.sample, first.is_final, last.is_final) == ([0, 2], [1, 2], False, True)
    assert (first.turn_rewards, last.turn_rewards, first.turn_spans) == ([0.0], [1.0], [[0, 2]])
    assert first.per_tool == {"rotate": {"calls": 2, "errors": 0, "time_s": 1.0, "remote_calls": 0}}
    assert (first.stop_reason, first.turn_gamma, first.call_rate_window) == ("turn_limit", 0.9, 4)
    batch = columns(first, None, last)
    assert SampleFields.rows(batch, 3) == [first, None, last]
    with pytest.raises(ValueError, match="1 of the batch's 3 rows are not the mm_tool loop's"):
        SampleFields.every_row(batch)


def test_a_row_missing_a_key_names_it():
    batch = columns(fields_of(1))
    del batch["mm_tool/image_bytes"]
    with pytest.raises(KeyError, match="mm_tool/image_bytes"):
        SampleFields.of_row(batch, 0)
