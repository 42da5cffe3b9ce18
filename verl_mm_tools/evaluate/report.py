"""The evaluation report: per data source, from the rows the agent-loop worker returned. The statistics are the
training step's own (``stats.aggregate_metrics`` on the rows of a data source), plus the reward with a 95 %
confidence interval and the endpoint's faults; with several samples per prompt, best-of figures too; scored by a
judge (``--judge``), the judge's counts (``judging.judge_figures``) and each row's verdict."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.judging import judge_figures, judge_row
from verl_mm_tools.handoff import SampleFields, StopReason
from verl_mm_tools.record import jsonable
from verl_mm_tools.step_metrics import MASKED_COUNT, aggregate_metrics, mean_metric, tool_metric

if TYPE_CHECKING:
    from verl.protocol import DataProto

    from verl_mm_tools.evaluate.endpoint import RequestFaults

Z95 = 1.96
SAMPLE_KEY = "eval/sample"  # the column of each row's sample number, 0 .. samples - 1 (run.py sets it)
# a reward at or above it is a solved prompt: the built-in answer rewards give a right answer 1.0 (the shaping's and
# the environments' default thresholds too)
SUCCESS_REWARD = 1.0


def row_records(output: DataProto, faults: Mapping[str, RequestFaults]) -> list[dict]:
    """One record per row (one sample of a prompt): where it came from, its reward, how it ended, and its endpoint
    faults."""
    columns = output.non_tensor_batch
    rows = [fields for fields in SampleFields.rows(columns, len(output)) if fields is not None]
    if len(rows) != len(output):
        names = sorted({str(name) for name in columns.get("agent_name", ["?"])})
        raise ConfigError(
            f"eval reads what the mm_tool loop records; rows ran the agent loops {names}: set the "
            "dataset's agent_name to mm_tool (or a loop built on it)"
        )
    scores = output.batch["rm_scores"].sum(dim=-1).tolist()
    records = []
    for row, (score, fields) in enumerate(zip(scores, rows, strict=True)):
        request_faults = faults.get(fields.request_id)
        records.append(
            {
                "data_source": str(columns["data_source"][row]) if "data_source" in columns else "unknown",
                "index": jsonable(columns["index"][row]),  # extra_info.index, else the dataset position
                "uid": str(columns["uid"][row]),  # the prompt's, shared by its samples
                "sample": int(columns[SAMPLE_KEY][row]),
                "reward": float(score),
                "stop_reason": fields.stop_reason,
                "turns": int(fields.turns),
                "tool_calls": int(fields.tool_calls),
                "tool_errors": int(fields.tool_errors),
                "invalid_actions": int(fields.invalid_actions),
                "images": int(fields.images),
                "masked": bool(fields.masked),
                "error": str(fields.error),
                "endpoint": request_faults.as_dict() if request_faults is not None else {},
            }
        )
        verdict = judge_row(columns, row)
        if verdict is not None:  # scored by the judge (``--judge``)
            records[-1]["judge"] = verdict
    return records


def source_report(output: DataProto, rows: list[int], records: list[dict], samples: int = 1) -> dict:
    """The figures of one data source's rows (all samples of its prompts)."""
    every = SampleFields.rows(output.non_tensor_batch, len(output))
    metrics = aggregate_metrics([fields for row in rows if (fields := every[row]) is not None])
    prompts = _prompt_rewards(rows, records)
    faults: Counter[str] = Counter()
    for row in rows:
        faults.update(records[row]["endpoint"])
    tools = sorted({name for row in rows if (fields := every[row]) is not None for name in fields.per_tool})
    figures = {
        "rows": len(rows),
        "reward_mean": _mean([records[row]["reward"] for row in rows]),
        # rows whose reward reaches SUCCESS_REWARD: a task solved (a MiniWoB++ task's success per data source)
        "success_rate": _mean([float(records[row]["reward"] >= SUCCESS_REWARD) for row in rows]),
        # over the prompts' mean rewards: the samples of one prompt are not independent draws
        "reward_ci95": _ci95([_mean(rewards) for rewards in prompts]),
        "tool_calls_per_trajectory": metrics[mean_metric("tool_calls")],
        "turns_per_trajectory": metrics[mean_metric("turns")],
        "images_per_trajectory": metrics[mean_metric("images")],
        "invalid_actions_per_trajectory": metrics[mean_metric("invalid_actions")],
        "masked": int(metrics[MASKED_COUNT]),
        "stop_reasons": {
            reason.value: sum(records[row]["stop_reason"] == reason.value for row in rows) for reason in StopReason
        },
        "tools": {
            name: {
                "calls_per_trajectory": metrics[tool_metric(name, "calls_per_trajectory")],
                "error_rate": metrics[tool_metric(name, "error_rate")],
            }
            for name in tools
        },
        "endpoint": dict(sorted(faults.items())),
    }
    judge = judge_figures(output.non_tensor_batch, rows)
    if judge is not None:
        figures["judge"] = judge
    return {**figures, "samples_per_prompt": samples, **best_of(prompts)} if samples > 1 else figures


def _prompt_rewards(rows: list[int], records: list[dict]) -> list[list[float]]:
    """The rewards of each prompt's samples (rows sharing a uid), prompts in order of appearance."""
    by_prompt: dict[str, list[float]] = {}
    for row in rows:
        by_prompt.setdefault(records[row]["uid"], []).append(records[row]["reward"])
    return list(by_prompt.values())


def best_of(prompts: list[list[float]]) -> dict:
    """Best-of-N figures: the share of prompts whose best sample reaches SUCCESS_REWARD (pass@N) and the mean of
    each prompt's best reward."""
    best = [max(rewards) for rewards in prompts]
    return {
        "prompts": len(prompts),
        "success_reward": SUCCESS_REWARD,
        "pass_at_n": _mean([float(reward >= SUCCESS_REWARD) for reward in best]),
        "best_reward_mean": _mean(best),
    }


def build_report(output: DataProto, faults: Mapping[str, RequestFaults], samples: int = 1) -> tuple[dict, list[dict]]:
    """``({data_source: figures}, row records)`` of one evaluation of ``samples`` answers per prompt."""
    records = row_records(output, faults)
    by_source: dict[str, list[int]] = {}
    for row, record in enumerate(records):
        by_source.setdefault(record["data_source"], []).append(row)
    report = {source: source_report(output, rows, records, samples) for source, rows in sorted(by_source.items())}
    return report, records


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _ci95(values: list[float]) -> list[float] | None:
    """The normal-approximation 95 % interval of the mean; None for a single row."""
    if len(values) < 2:
        return None
    mean = _mean(values)
    half = Z95 * math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1) / len(values))
    return [mean - half, mean + half]


# the table's rows: a figure and its format (None: an interval)
COLUMNS = (
    ("rows", "{:d}"),
    ("reward_mean", "{:.3f}"),
    ("reward_ci95", None),
    ("success_rate", "{:.3f}"),
    ("tool_calls_per_trajectory", "{:.2f}"),
    ("turns_per_trajectory", "{:.2f}"),
    ("images_per_trajectory", "{:.2f}"),
    ("invalid_actions_per_trajectory", "{:.2f}"),
    ("masked", "{:d}"),
)
BEST_OF_COLUMNS = (("prompts", "{:d}"), ("pass_at_n", "{:.3f}"), ("best_reward_mean", "{:.3f}"))  # samples > 1


def table(reports: dict[str, dict]) -> str:
    """``{mode: {data_source: figures}}`` as a readable table, the modes side by side per data source."""
    lines = []
    sources = sorted({source for report in reports.values() for source in report})
    for source in sources:
        modes = [mode for mode in reports if source in reports[mode]]
        lines.append(f"{source}")
        lines.append(f"  {'':32}" + "".join(f"{mode:>22}" for mode in modes))
        for key, form in (*COLUMNS, *BEST_OF_COLUMNS):
            if any(key not in reports[mode][source] for mode in modes):
                continue
            cells = [_cell(reports[mode][source][key], form) for mode in modes]
            lines.append(f"  {key:32}" + "".join(f"{cell:>22}" for cell in cells))
        for mode in modes:
            figures = reports[mode][source]
            stops = ", ".join(f"{reason} {count}" for reason, count in figures["stop_reasons"].items() if count)
            tools = (
                ", ".join(
                    f"{name} {tool['calls_per_trajectory']:.2f} calls per row, {tool['error_rate']:.0%} failed"
                    for name, tool in figures["tools"].items()
                )
                or "no calls"
            )
            faults = ", ".join(f"{kind} {count}" for kind, count in figures["endpoint"].items() if count) or "none"
            lines.append(f"  [{mode}] stop: {stops}; tools: {tools}; endpoint: {faults}")
            if "judge" in figures:
                lines.append(f"  [{mode}] judge: {_judge_line(figures['judge'])}")
    return "\n".join(lines)


def _judge_line(judge: dict) -> str:
    mean = "n/a" if judge["score_mean"] is None else f"{judge['score_mean']:.3f}"
    return (
        f"judged {judge['judged']}, parse failures {judge['parse_failures']}, failed {judge['failed']}, "
        f"cache hits {judge['cache_hits']}, mean judge score {mean}"
    )


def _cell(value: Any, form: str | None) -> str:  # a figure: a number, an interval or None (JSON)
    if form is None:
        return "n/a" if value is None else f"[{value[0]:.3f}, {value[1]:.3f}]"
    return form.format(value)
