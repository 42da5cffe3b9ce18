"""Step metrics (``mm_tool/*``) from a batch's per-trajectory ``extra_fields`` (written by ``state``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from verl_mm_tools.agent_loop.state import (
    ABORTED_KEY,
    DISTINCT_IMAGES_KEY,
    FLOAT_IMAGES_KEY,
    GENERATE_S_KEY,
    IMAGE_BYTES_KEY,
    LATER_CACHED_TOKENS_KEY,
    LATER_PROMPT_TOKENS_KEY,
    MASKED_KEY,
    PER_TOOL_KEY,
    PREFIX,
    PROCESSOR_RUNS_KEY,
    RESUME_IMAGES_KEY,
    RESUME_PREFILL_KEY,
    RESUMED_KEY,
    RESUMES_KEY,
    STOP_REASON_KEY,
    WEIGHT_VERSIONS_KEY,
    StopReason,
    ToolStats,
)
from verl_mm_tools.rewards.common import ATTEMPTS_KEY

CALL_RATE = PREFIX + "tool_call_rate"  # the share of a step's trajectories that called a tool at least once
# 1 for a step whose tool-call rate fell below half the highest of the previous call_rate_window steps
# (step.CallRateWatch)
CALL_RATE_COLLAPSED = CALL_RATE + "/collapsed"
# the share of the prompt tokens of second and later generations that the engine's prefix cache held (engines that
# report it: verl's vLLM server)
PREFIX_CACHE_HIT_RATE = PREFIX + "prefix_cache_hit_rate"
# verl's fully async trainer (partial rollout): generations resumed after a weight sync, trajectories whose
# generations ran under more than one weight version, the largest version span of one trajectory, and generations
# aborted without a resume (partial_rollout off: their trajectories are masked)
RESUMED_COUNT = RESUMED_KEY + "/count"
MULTI_VERSION_COUNT = PREFIX + "multi_version_trajectories/count"
VERSION_SPAN_MAX = PREFIX + "version_span/max"
ABORTED_COUNT = ABORTED_KEY + "/count"
# what the step's resumes cost the engine: requests after a generation's first, prompt tokens prefilled again,
# images sent (and, the sync having reset vLLM's encoder cache, encoded) again
RESUMES_COUNT = RESUMES_KEY + "/count"
RESUME_PREFILL_SUM = RESUME_PREFILL_KEY + "/sum"
RESUME_IMAGES_SUM = RESUME_IMAGES_KEY + "/sum"
# images the HF image processor processed in the rollout, per image of the step's trajectories: 1 when each image was
# processed once (``agent_loop/image_features.py``)
PROCESSOR_RUNS_PER_IMAGE = PREFIX + "processor_runs_per_image"
# the bytes of image inputs the step's samples carry to the trainer over the raw bytes of the step's distinct images (by
# content: an image that several samples or trajectories show counts once below the line, and once per sample above
# it, as verl sends each sample whole): ~1 with compact images, each shown once; 8 with Qwen-VL's float pixel values
# (issue #59)
IMAGE_BYTES_OVER_RAW = PREFIX + "image_bytes_over_raw"
# the share of the step's images sent as float pixel values, their family having no compact form (0 on every family
# docs/model_families.md lists)
FLOAT_IMAGE_SHARE = PREFIX + "float_image_share"
# the slowest trajectory's seconds awaiting the engine, on both trainers: a rollout phase cannot be shorter, so
# (timing_s/gen - this) / timing_s/step is the step's share spent in the rollout outside generation (bench figure 5)
GENERATE_S_MAX = GENERATE_S_KEY + "/max"


def aggregate_metrics(non_tensor_batch: Mapping[str, Any]) -> dict[str, float]:
    """Step-level metrics from a batch's mm_tool extra fields (trajectories of other loops are skipped)."""
    stop = non_tensor_batch.get(STOP_REASON_KEY)
    if stop is None:
        return {}
    rows = [index for index, reason in enumerate(stop) if reason is not None]
    if not rows:
        return {}
    metrics = {}
    attempts = np.asarray([non_tensor_batch[ATTEMPTS_KEY][index] for index in rows], dtype=np.float64)
    metrics[PREFIX + "attempts/mean"] = float(attempts.mean())
    for key in (
        "turns",
        "tool_calls",
        "tool_errors",
        "tool_time_s",
        "images",
        "image_tokens",
        "budget_refusals",
        "budget_downscales",
        "dropped_turns",
        "masked",
        "invalid_actions",
        "ignored_calls",
    ):
        values = np.asarray([non_tensor_batch[PREFIX + key][index] for index in rows], dtype=np.float64)
        metrics[f"{PREFIX}{key}/mean"] = float(values.mean())
    # tool-use collapse shows here first: the share of trajectories that call at all (``CallRateWatch``)
    metrics[CALL_RATE] = float(np.mean([non_tensor_batch[PREFIX + "tool_calls"][index] > 0 for index in rows]))
    metrics[MASKED_KEY + "/count"] = float(sum(non_tensor_batch[MASKED_KEY][index] for index in rows))
    valid = sum(non_tensor_batch[PREFIX + "valid_actions"][index] for index in rows)
    actions = valid + sum(non_tensor_batch[PREFIX + "tool_errors"][index] for index in rows)
    actions += sum(non_tensor_batch[PREFIX + "invalid_actions"][index] for index in rows)
    metrics[PREFIX + "valid_action_rate"] = float(valid / actions) if actions else 1.0
    for reason in StopReason:
        metrics[f"{PREFIX}stop/{reason.value}"] = sum(stop[index] == reason.value for index in rows) / len(rows)
    metrics.update(_per_tool_metrics([non_tensor_batch[PER_TOOL_KEY][index] for index in rows]))
    prompt_tokens = sum(non_tensor_batch[LATER_PROMPT_TOKENS_KEY][index] for index in rows)
    if prompt_tokens:
        metrics[PREFIX_CACHE_HIT_RATE] = (
            sum(non_tensor_batch[LATER_CACHED_TOKENS_KEY][index] for index in rows) / prompt_tokens
        )
    metrics.update(_version_metrics(non_tensor_batch, rows))
    metrics.update(_processor_metrics(non_tensor_batch, rows))
    if GENERATE_S_KEY in non_tensor_batch:  # batches of loops older than the key: none
        metrics[GENERATE_S_MAX] = float(max(non_tensor_batch[GENERATE_S_KEY][index] for index in rows))
    return metrics


def _processor_metrics(non_tensor_batch: Mapping[str, Any], rows: list[int]) -> dict[str, float]:
    """Image-processor runs per image (batches of loops older than the key, or without images: none)."""
    if PROCESSOR_RUNS_KEY not in non_tensor_batch:
        return {}
    images = sum(non_tensor_batch[PREFIX + "images"][index] for index in rows)
    if not images:
        return {}
    metrics = {
        PROCESSOR_RUNS_PER_IMAGE: float(sum(non_tensor_batch[PROCESSOR_RUNS_KEY][index] for index in rows) / images)
    }
    if DISTINCT_IMAGES_KEY not in non_tensor_batch:  # batches of loops older than the keys
        return metrics
    metrics[FLOAT_IMAGE_SHARE] = float(sum(non_tensor_batch[FLOAT_IMAGES_KEY][index] for index in rows) / images)
    distinct: dict[str, int] = {}
    for index in rows:  # an image several trajectories show (a GRPO group's prompt image) counts once
        distinct.update(non_tensor_batch[DISTINCT_IMAGES_KEY][index])
    raw = sum(distinct.values())
    if raw:
        metrics[IMAGE_BYTES_OVER_RAW] = float(sum(non_tensor_batch[IMAGE_BYTES_KEY][index] for index in rows) / raw)
    return metrics


def _version_metrics(non_tensor_batch: Mapping[str, Any], rows: list[int]) -> dict[str, float]:
    """Resumed and aborted generations, weight-version spans and what resumes cost (batches of loops older than
    these keys: none)."""
    if RESUMED_KEY not in non_tensor_batch:
        return {}
    spans = [non_tensor_batch[WEIGHT_VERSIONS_KEY][index] for index in rows]
    spans = [int(last) - int(first) for first, last in (span for span in spans if span is not None)]
    return {
        RESUMED_COUNT: float(sum(non_tensor_batch[RESUMED_KEY][index] for index in rows)),
        MULTI_VERSION_COUNT: float(sum(span > 0 for span in spans)),
        VERSION_SPAN_MAX: float(max(spans, default=0)),
        ABORTED_COUNT: float(sum(non_tensor_batch[ABORTED_KEY][index] for index in rows)),
        **{
            name: float(sum(non_tensor_batch[key][index] for index in rows))
            for name, key in (
                (RESUMES_COUNT, RESUMES_KEY),
                (RESUME_PREFILL_SUM, RESUME_PREFILL_KEY),
                (RESUME_IMAGES_SUM, RESUME_IMAGES_KEY),
            )
            if key in non_tensor_batch
        },
    }


def _per_tool_metrics(per_tool_rows: list[dict]) -> dict[str, float]:
    totals: dict[str, ToolStats] = defaultdict(ToolStats)
    callers: dict[str, int] = defaultdict(int)  # trajectories that called the tool
    for row in per_tool_rows:
        for name, stats in (row or {}).items():
            callers[name] += stats["calls"] > 0
            totals[name].calls += stats["calls"]
            totals[name].errors += stats["errors"]
            totals[name].time_s += stats["time_s"]
            totals[name].remote_calls += stats["remote_calls"]
    metrics = {}
    for name, stats in totals.items():
        metrics[f"{PREFIX}tool/{name}/calls_per_trajectory"] = stats.calls / len(per_tool_rows)
        metrics[f"{PREFIX}tool/{name}/call_rate"] = callers[name] / len(per_tool_rows)
        metrics[f"{PREFIX}tool/{name}/error_rate"] = stats.errors / stats.calls if stats.calls else 0.0
        metrics[f"{PREFIX}tool/{name}/time_s_per_call"] = stats.time_s / stats.calls if stats.calls else 0.0
        if stats.remote_calls:
            metrics[f"{PREFIX}tool/{name}/remote_calls_per_trajectory"] = stats.remote_calls / len(per_tool_rows)
    return metrics
