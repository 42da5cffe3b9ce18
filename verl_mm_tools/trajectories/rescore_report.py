"""The report of a rescore: ``report.json``, ``report.txt`` and ``rows.jsonl`` in ``verl-mm-tools eval``'s format (its
own ``evaluate.report`` functions), each group of records (an eval output's mode; everything else together) as two
modes side by side, the scores as recorded (``before``) and rescored, each row naming its record's copy
(``rescore_copies``)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.judging import JUDGE_COLUMNS, JUDGE_SCORE
from verl_mm_tools.runtime.batch import object_array
from verl_mm_tools.trajectories.read import BadRecord, RecordSet
from verl_mm_tools.trajectories.rescore_copies import write_copy
from verl_mm_tools.trajectories.rescore_options import REPORT_FILE, REPORT_TEXT, ROWS_FILE, TRAJECTORIES, RescoreOptions
from verl_mm_tools.trajectories.rescore_records import described
from verl_mm_tools.trajectories.rescore_scoring import Rescored

if TYPE_CHECKING:
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

EVAL_ROWS_FILE = "rows.jsonl"  # what marks OUT/<mode>/ of a verl-mm-tools eval output (evaluate.run writes it)
BEFORE, RESCORED = "before", "rescored"


def write_outputs(scored: list[Rescored], loaded: RecordSet, options: RescoreOptions) -> dict:
    """The record copies, ``rows.jsonl``, ``report.json`` and ``report.txt``; returns the report."""
    from verl_mm_tools.evaluate.report import table

    for result in scored:
        result.mode = eval_mode(result.item.path)
    scored = sorted(scored, key=_order)
    for result in scored:
        result.copy = write_copy(result, options)
    modes: dict[str, dict] = {}
    rows: list[dict] = []
    for mode, results in _by_mode(scored).items():
        figures, mode_rows = _mode_report(results, options.out)
        modes.update({_mode_name(mode, name): value for name, value in figures.items()})
        rows += mode_rows
    bad = [{"path": str(bad.path), "reason": bad.reason} for bad in loaded.bad]
    report = {
        "records": [str(path) for path in options.records],
        "rescore": options.describe(),
        "modes": modes,
        "table": table(modes),
        "bad_records": bad,
    }
    _write_lines(options.out / ROWS_FILE, rows)
    (options.out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    (options.out / REPORT_TEXT).write_text(report_text(report) + "\n")
    return report


def _order(result: Rescored) -> tuple:
    """Rows by mode, then as the viewer lists trajectories: validation last, by step, sample index and rollout."""
    record = result.item.record
    index = (record.get("sample") or {}).get("index")
    return (
        result.mode or "",
        bool(record.get("validate")),
        record.get("step") if isinstance(record.get("step"), int) else -1,
        index if isinstance(index, int) else -1,
        record.get("rollout_n") or 0,
        str(record.get("id")),
    )


def eval_mode(path: Path) -> str | None:
    """The mode of a record in a ``verl-mm-tools eval`` output (``OUT/<mode>/trajectories/<step>/<id>/``, with
    ``OUT/report.json`` and ``OUT/<mode>/rows.jsonl``); None elsewhere."""
    parents = path.parents
    if len(parents) < 5 or parents[2].name != TRAJECTORIES:
        return None
    mode_dir = parents[3]
    return mode_dir.name if (mode_dir / EVAL_ROWS_FILE).is_file() and (parents[4] / REPORT_FILE).is_file() else None


def _by_mode(scored: list[Rescored]) -> dict[str | None, list[Rescored]]:
    groups: dict[str | None, list[Rescored]] = {}
    for result in scored:
        groups.setdefault(result.mode, []).append(result)
    return groups


def _mode_name(mode: str | None, name: str) -> str:
    return name if mode is None else f"{mode} {name}"


def _mode_report(results: list[Rescored], out: Path) -> tuple[dict, list[dict]]:
    """Eval's figures (``evaluate.report.build_report``) of the rescored scores and, when every record has one, of
    the recorded ones; the rows with both scores."""
    from verl_mm_tools.evaluate.report import build_report

    new = [result.score for result in results]
    recorded = [result.item.record.get("reward") or {} for result in results]
    old = [reward.get("score") for reward in recorded]
    samples = max(Counter(result.item.prompt_key() for result in results).values())
    try:
        figures, rows = build_report(_report_columns(results, new, [result.extra for result in results]), {}, samples)
        before_columns = _report_columns(results, old, [reward.get("extra") or {} for reward in recorded])
        before = build_report(before_columns, {}, samples)[0] if None not in old else None
    except KeyError as error:
        raise ConfigError(
            f"the records' statistics lack {error}, which this verl-mm-tools' report reads: they were written by "
            "an older verl-mm-tools; rescore them with that version"
        ) from error
    if before is None:
        logger.warning("rescore: some records have no recorded score; the report shows no 'before' figures")
    for row, result, score in zip(rows, results, old, strict=True):
        row.update(
            mode=result.mode,
            reward_before=score,
            tokens_as_recorded=result.tokens_as_recorded,
            record=str(result.copy.relative_to(out)) if result.copy else None,
            source=str(result.item.path),
        )
    return ({BEFORE: before} if before is not None else {}) | {RESCORED: figures}, rows


def _report_columns(results: list[Rescored], scores: Sequence[float | None], extras: Sequence[dict]) -> DataProto:
    """What eval's report reads of a generated batch: the loop's extra fields per row, the dataset row's columns
    (data source, extra_info, index, uid), its sample number (the record's rollout number), ``rm_scores`` (float64:
    the scores exactly as computed) and, when a judge scored some, the judge's fields of the reward extra info
    (``extras``)."""
    import torch
    from verl.protocol import DataProto

    from verl_mm_tools.evaluate.report import SAMPLE_KEY

    # the keys every record has: one missing from some is missing from the columns (a KeyError the caller explains)
    keys = sorted(set.intersection(*(set(result.fields) for result in results)))
    columns = {key: object_array([result.fields[key] for result in results]) for key in keys}
    records = [result.item.record for result in results]
    samples = [record.get("sample") or {} for record in records]
    columns["data_source"] = object_array([sample.get("data_source") for sample in samples])
    columns["extra_info"] = object_array([sample.get("extra_info") for sample in samples])
    columns["index"] = object_array([sample.get("index") for sample in samples])
    columns["uid"] = object_array([result.item.prompt_key() for result in results])
    columns[SAMPLE_KEY] = object_array([record.get("rollout_n") or 0 for record in records])
    if any(JUDGE_SCORE in extra for extra in extras):
        for key in JUDGE_COLUMNS:
            columns[key] = object_array([extra.get(key) for extra in extras])
    rm_scores = torch.tensor([[score] for score in scores], dtype=torch.float64)
    return DataProto.from_dict(tensors={"rm_scores": rm_scores}, non_tensors=columns)


def report_text(report: dict) -> str:
    """The table, how the records were rescored, and the records that could not be."""
    settings = report["rescore"]
    function = settings["reward_fn"] or "(the manager default)"
    judge = settings.get("judge")
    if judge is not None:
        rule = f" plus {settings['reward_fn']}" if settings["reward_fn"] else ""
        function = f"judge_reward{rule} (judge {judge['model']} at {judge['endpoint']}, images {judge['images']})"
    lines = [report["table"], f"rescored with reward manager {settings['reward_manager']}, reward function {function}"]
    if report["bad_records"]:
        lines.append(f"left out {len(report['bad_records'])}:")
        lines += [f"  {described(BadRecord(Path(bad['path']), bad['reason']))}" for bad in report["bad_records"]]
    return "\n".join(lines)


def _write_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
