"""Batches as the step hook reads them, built from whole ``SampleFields`` (every key the loop writes), for tests that
hand the hook rows of their own."""

from __future__ import annotations

import dataclasses

from verl_mm_tools.handoff import SampleFields

# a one-sample trajectory that answered without a tool call: every count 0, the loop's default options
ANSWERED = SampleFields(
    max_masked_fraction=0.5,
    call_rate_window=0,
    turn_credit=False,
    turn_gamma=1.0,
    tool_call_counts=0,
    attempts=1,
    last_assistant_text="",
    turns=1,
    tool_calls=0,
    tool_errors=0,
    tool_time_s=0.0,
    valid_actions=0,
    invalid_actions=0,
    ignored_calls=0,
    per_tool={},
    env_infos=[],
    stop_reason="answered",
    masked=0,
    error="",
    dropped_turns=0,
    images=0,
    image_tokens=0,
    budget_refusals=0,
    budget_downscales=0,
    processor_runs=0,
    float_images=0,
    generate_s=0.0,
    later_prompt_tokens=0,
    later_cached_tokens=0,
    weight_versions=None,
    resumed_generations=0,
    aborted_generations=0,
    resumes=0,
    resume_prefill_tokens=0,
    resume_images=0,
    request_id="",
    sample=[0, 1],
    turn_rewards=[0.0],
    turn_spans=[[0, 1]],
    image_bytes=0,
    distinct_images={},
)


def columns(*rows: dict) -> dict[str, list]:
    """The batch columns of rows given as changes to ``ANSWERED``."""
    extra = [dataclasses.replace(ANSWERED, **row).extra_fields() for row in rows]
    return {key: [fields[key] for fields in extra] for key in extra[0]}
