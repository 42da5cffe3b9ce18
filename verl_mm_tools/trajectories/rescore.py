"""Recorded trajectories scored again (``verl-mm-tools rescore``) with another reward function or reward manager,
through verl's own reward worker (``RewardLoopWorker``, which builds the configured manager class exactly as a
training run does), with no policy model and no inference server: only the model's tokenizer and processor.

The parts, by job: the options and the output's layout (``rescore_options``), reading the records
(``rescore_records``), the manager's batch rebuilt from a record (``rescore_input``), scoring through verl's reward
worker (``rescore_scoring``), the report (``rescore_report``) and the record copies (``rescore_copies``).

Output (``OUT``): ``report.json``, ``report.txt`` and ``rows.jsonl`` in ``verl-mm-tools eval``'s format (its own
``evaluate.report`` functions), each group of records (an eval output's mode; everything else together) as two
modes side by side, the scores as recorded (``before``) and rescored; and ``trajectories/<step>/<id>/``, copies of
the records whose ``reward`` is the new one, the recorded one kept under ``reward_before``, with ``rescored``
saying how (``verl-mm-tools view OUT/trajectories`` shows both).
"""

from __future__ import annotations

import logging

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.trajectories.rescore_copies import prepare_out
from verl_mm_tools.trajectories.rescore_options import RescoreOptions
from verl_mm_tools.trajectories.rescore_records import by_model, described, usable_records
from verl_mm_tools.trajectories.rescore_report import write_outputs
from verl_mm_tools.trajectories.rescore_scoring import check_choices, score_with_model

logger = logging.getLogger(__name__)


def rescore(options: RescoreOptions) -> dict:
    """Score the records under ``options.records`` again and write ``options.out``; returns the report
    (``{"records", "rescore", "modes", "table", "bad_records"}``). A ConfigError when no record could be scored."""
    check_choices(options)
    loaded = usable_records(options.records, options.out)
    prepare_out(options, loaded.records)
    scored = []
    for model_path, items in by_model(loaded, options.model_path).items():
        scored += score_with_model(model_path, items, loaded, options)
    if not scored:
        reasons = "; ".join(described(bad) for bad in loaded.bad) or "no record found"
        raise ConfigError(f"no record could be rescored: {reasons}")
    for bad in loaded.bad:
        logger.warning("rescore: left out %s", described(bad))
    return write_outputs(scored, loaded, options)
