"""The step metrics (``mm_tool/*``) of a batch's trajectories, from what the loop handed the trainer
(``handoff.SampleFields``): the same figures for the training step's hook (``step_hook/step.py``) and for eval's
report (``evaluate/report.py``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from verl_mm_tools.handoff import PREFIX, SampleFields, StopReason, ToolStats

# the fields logged as their mean over the step's trajectories, ``mm_tool/<field>/mean``
MEAN_FIELDS = (
    "attempts",
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
)
CALL_RATE = PREFIX + "tool_call_rate"  # the share of a step's trajectories that called a tool at least once
# 1 for a step whose tool-call rate fell below half the highest of the previous call_rate_window steps
# (step.CallRateWatch)
CALL_RATE_COLLAPSED = CALL_RATE + "/collapsed"
MASKED_COUNT = PREFIX + "masked/count"
VALID_ACTION_RATE = PREFIX + "valid_action_rate"
# the share of the prompt tokens of second and later generations that the engine's prefix cache held (engines that
# report it: verl's vLLM server)
PREFIX_CACHE_HIT_RATE = PREFIX + "prefix_cache_hit_rate"
# verl's fully async trainer (partial rollout): generations resumed after a weight sync, trajectories whose
# generations ran under more than one weight version, the largest version span of one trajectory, and generations
# aborted without a resume (partial_rollout off: their trajectories are masked)
RESUMED_COUNT = PREFIX + "resumed_generations/count"
MULTI_VERSION_COUNT = PREFIX + "multi_version_trajectories/count"
VERSION_SPAN_MAX = PREFIX + "version_span/max"
ABORTED_COUNT = PREFIX + "aborted_generations/count"
# samples masked before they generated, given the batch's oldest weight version (handoff.fill_missing_weight_versions)
UNVERSIONED_SAMPLES = PREFIX + "unversioned_samples"
# what the step's resumes cost the engine: requests after a generation's first, prompt tokens prefilled again,
# images sent (and, the sync having reset vLLM's encoder cache, encoded) again
RESUMES_COUNT = PREFIX + "resumes/count"
RESUME_PREFILL_SUM = PREFIX + "resume_prefill_tokens/sum"
RESUME_IMAGES_SUM = PREFIX + "resume_images/sum"
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
# the mean reward per trajectory (verl's critic/score/mean counts a trajectory exported as several samples once per
# sample), and that of the trajectories that called a tool and of those that did not: whether calling pays
REWARD_MEAN = PREFIX + "reward/mean"
REWARD_WITH_TOOLS = PREFIX + "reward/with_tool_calls"
REWARD_WITHOUT_TOOLS = PREFIX + "reward/without_tool_calls"
SAMPLES_PER_TRAJECTORY = PREFIX + "samples_per_trajectory"  # the training samples a trajectory became (export)
# mm_turn_grpo: the trajectories whose turn rewards could not be placed
TURN_REWARDS_UNPLACED = PREFIX + "turn_rewards/unplaced"
# the dumps (``step_hook/dump.py``): trajectories published and skipped, the dump's size, a step whose publishing failed
DUMP_WRITTEN = PREFIX + "dump/written"
DUMP_SKIPPED = PREFIX + "dump/skipped"
DUMP_MB = PREFIX + "dump/mb"
DUMP_FAILED = PREFIX + "dump/failed"
# the slowest trajectory's seconds awaiting the engine, on both trainers: a rollout phase cannot be shorter, so
# (timing_s/gen - this) / timing_s/step is the step's share spent in the rollout outside generation (bench figure 5)
GENERATE_S_MAX = PREFIX + "generate_s/max"


def mean_metric(name: str) -> str:
    """The step metric of a ``MEAN_FIELDS`` field's mean."""
    if name not in MEAN_FIELDS:
        raise KeyError(f"{name!r} is not logged as a mean; the fields that are: {MEAN_FIELDS}")
    return f"{PREFIX}{name}/mean"


def stop_metric(reason: StopReason) -> str:
    return f"{PREFIX}stop/{reason.value}"


def tool_metric(tool: str, figure: str) -> str:
    """``figure`` (calls_per_trajectory, call_rate, error_rate, time_s_per_call, remote_calls_per_trajectory) of one
    tool."""
    return f"{PREFIX}tool/{tool}/{figure}"


def aggregate_metrics(samples: Sequence[SampleFields]) -> dict[str, float]:
    """Step-level metrics of a batch's mm_tool samples (none for none): each trajectory's statistics count once, from
    its final sample; the image bytes count on every sample that carries them."""
    trajectories = [fields for fields in samples if fields.is_final]
    if not trajectories:
        return {}
    metrics = {mean_metric(name): float(np.mean([getattr(t, name) for t in trajectories])) for name in MEAN_FIELDS}
    # tool-use collapse shows here first: the share of trajectories that call at all (``CallRateWatch``)
    metrics[CALL_RATE] = float(np.mean([t.tool_calls > 0 for t in trajectories]))
    metrics[MASKED_COUNT] = float(sum(t.masked for t in trajectories))
    valid = sum(t.valid_actions for t in trajectories)
    actions = valid + sum(t.tool_errors + t.invalid_actions for t in trajectories)
    metrics[VALID_ACTION_RATE] = float(valid / actions) if actions else 1.0
    for reason in StopReason:
        metrics[stop_metric(reason)] = sum(t.stop_reason == reason.value for t in trajectories) / len(trajectories)
    metrics.update(_per_tool_metrics([t.per_tool for t in trajectories]))
    prompt_tokens = sum(t.later_prompt_tokens for t in trajectories)
    if prompt_tokens:
        metrics[PREFIX_CACHE_HIT_RATE] = sum(t.later_cached_tokens for t in trajectories) / prompt_tokens
    metrics.update(_version_metrics(trajectories))
    metrics.update(_image_metrics(trajectories, samples))
    metrics[SAMPLES_PER_TRAJECTORY] = len(samples) / len(trajectories)
    metrics[GENERATE_S_MAX] = float(max(t.generate_s for t in trajectories))
    return metrics


def _image_metrics(trajectories: Sequence[SampleFields], samples: Sequence[SampleFields]) -> dict[str, float]:
    """Image-processor runs per image, the float share and the bytes over the distinct raw bytes (none without
    images)."""
    images = sum(t.images for t in trajectories)
    if not images:
        return {}
    metrics = {
        PROCESSOR_RUNS_PER_IMAGE: sum(t.processor_runs for t in trajectories) / images,
        FLOAT_IMAGE_SHARE: sum(t.float_images for t in trajectories) / images,
    }
    distinct: dict[str, int] = {}
    for trajectory in trajectories:  # an image several trajectories show (a GRPO group's prompt image) counts once
        distinct.update(trajectory.distinct_images)
    raw = sum(distinct.values())
    if raw:
        metrics[IMAGE_BYTES_OVER_RAW] = sum(fields.image_bytes for fields in samples) / raw
    return metrics


def _version_metrics(trajectories: Sequence[SampleFields]) -> dict[str, float]:
    """Resumed and aborted generations, weight-version spans and what resumes cost."""
    spans = [int(last) - int(first) for first, last in (t.weight_versions for t in trajectories if t.weight_versions)]
    return {
        RESUMED_COUNT: float(sum(t.resumed_generations for t in trajectories)),
        MULTI_VERSION_COUNT: float(sum(span > 0 for span in spans)),
        VERSION_SPAN_MAX: float(max(spans, default=0)),
        ABORTED_COUNT: float(sum(t.aborted_generations for t in trajectories)),
        RESUMES_COUNT: float(sum(t.resumes for t in trajectories)),
        RESUME_PREFILL_SUM: float(sum(t.resume_prefill_tokens for t in trajectories)),
        RESUME_IMAGES_SUM: float(sum(t.resume_images for t in trajectories)),
    }


def _per_tool_metrics(per_tool_rows: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    totals: dict[str, ToolStats] = defaultdict(ToolStats)
    callers: Counter[str] = Counter()  # trajectories that called the tool
    for row in per_tool_rows:
        for name, stats in row.items():
            callers[name] += stats["calls"] > 0
            total = totals[name]
            total.calls += int(stats["calls"])
            total.errors += int(stats["errors"])
            total.time_s += stats["time_s"]
            total.remote_calls += int(stats["remote_calls"])
    metrics = {}
    rows = len(per_tool_rows)
    for name, total in totals.items():
        metrics[tool_metric(name, "calls_per_trajectory")] = total.calls / rows
        metrics[tool_metric(name, "call_rate")] = callers[name] / rows
        metrics[tool_metric(name, "error_rate")] = total.errors / total.calls if total.calls else 0.0
        metrics[tool_metric(name, "time_s_per_call")] = total.time_s / total.calls if total.calls else 0.0
        if total.remote_calls:
            metrics[tool_metric(name, "remote_calls_per_trajectory")] = total.remote_calls / rows
    return metrics
