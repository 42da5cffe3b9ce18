"""verl's step metrics as the demo reads them: the new lines of verl's file logger (``metrics.jsonl``), the step
hook's metrics under their v1 names on either trainer, and the one line per step the demo prints."""

from __future__ import annotations

import json
from pathlib import Path

from verl_mm_tools.demo.tasks import TRAINING_REWARD
from verl_mm_tools.step_metrics import (
    IMAGE_BYTES_OVER_RAW,
    MASKED_COUNT,
    REWARD_WITH_TOOLS,
    REWARD_WITHOUT_TOOLS,
    mean_metric,
)

TOOL_CALLS_METRIC = mean_metric("tool_calls")  # the step hook's, on both trainers (``metric`` reads either name)


# The step line: (label, verl metric key, format).
STEP_FIELDS = (
    ("reward", TRAINING_REWARD, "{:.3f}"),
    ("turns", mean_metric("turns"), "{:.2f}"),  # assistant turns, as the viewer counts (verl's num_turns: messages)
    ("tool calls", TOOL_CALLS_METRIC, "{:.2f}"),
    ("reward with tools", REWARD_WITH_TOOLS, "{:.3f}"),  # whether calling pays
    ("reward without tools", REWARD_WITHOUT_TOOLS, "{:.3f}"),
    ("images", mean_metric("images"), "{:.2f}"),
    ("image bytes/raw", IMAGE_BYTES_OVER_RAW, "{:.2f}"),  # what the images cost on the way to the trainer
    ("masked", MASKED_COUNT, "{:.0f}"),
    ("logprob diff", "training/rollout_probs_diff_max", "{:.1e}"),
    ("step", "timing_s/step", "{:.1f}s"),
)


def metric(metrics: dict, key: str) -> float | None:
    """A step metric by its v1 name; the classic trainer logs the mm_tool ones as ``timing_s/mm_tool/...``."""
    return metrics.get(key, metrics.get(f"timing_s/{key}"))


def format_step(step: int, total: int, metrics: dict, validation_metric: str) -> str:
    parts = [f"step {step}/{total}"]
    for label, key, fmt in (*STEP_FIELDS, ("validation", validation_metric, "{:.3f}")):
        if metric(metrics, key) is not None:
            parts.append(f"{label} {fmt.format(metric(metrics, key))}")
    return "  ".join(parts)


def step_metrics(data: dict) -> dict:
    """verl's step metrics, the step hook's under their v1 names on either trainer (the classic one logs them as
    ``timing_s/mm_tool/...``)."""
    hooked = {
        key.removeprefix("timing_s/"): value for key, value in data.items() if key.startswith("timing_s/mm_tool/")
    }
    return {**data, **hooked}


def read_new_steps(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete JSON lines of verl's file logger after byte ``offset``; returns them and the new offset."""
    text, offset = read_new_lines(path, offset)
    return [json.loads(line) for line in text.splitlines() if line.strip()], offset


def read_new_lines(path: Path, offset: int) -> tuple[str, int]:
    """The complete lines written to ``path`` after byte ``offset`` (none while it does not exist), and the offset
    after them."""
    if not path.exists():
        return "", offset
    with path.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return complete.decode("utf-8", errors="replace"), offset + len(complete)
