"""A judged batch (``rewards.judge``) in the step hook: the images handed to the judge leave the batch, trajectories
the judge could not score are masked where ``on_failure: mask`` asked, and the verdicts become ``mm_tool/judge/*``."""

from __future__ import annotations

from verl_mm_tools.handoff import PREFIX, SampleFields
from verl_mm_tools.rewards.judge import JUDGE_MASK_KEY
from verl_mm_tools.step_hook.batch import StepBatch

JUDGE = PREFIX + "judge/"


def judge_step(batch: StepBatch) -> dict[str, float]:
    """Release the judge contexts (once scored), apply the masks, and the judge's metrics (``{}`` when no row was
    judged)."""
    if batch.rm_scores is not None:  # scored in the rollout: the contexts' PNG bytes are not needed any more
        column = batch.columns.get(SampleFields.key("judge_context"))
        for row in range(len(column) if column is not None else 0):
            column[row] = None  # type: ignore[index]  # the batch's own column (a numpy object array)
    masked = _mask_unjudged(batch)
    final = batch.trajectories()
    extras = [extra for extra in final.reward_extra if "judge_score" in extra]
    if not extras:
        return {}
    judged = [float(extra["judge_score"]) for extra in extras if extra["judge_judged"]]
    sent = [float(extra["judge_latency_s"]) for extra in extras if not extra["judge_cached"]]
    counts = {name: sum(float(extra[f"judge_{name}"]) for extra in extras) for name in ("unparseable", "failed")}
    return {
        JUDGE + "score/mean": sum(judged) / len(judged) if judged else 0.0,
        JUDGE + "judged/count": float(len(judged)),
        JUDGE + "parse_failures/count": counts["unparseable"],
        JUDGE + "failed/count": counts["failed"],
        JUDGE + "fallbacks/count": counts["unparseable"] + counts["failed"],
        JUDGE + "cache_hits/count": sum(float(extra["judge_cached"]) for extra in extras),
        JUDGE + "latency_s/mean": sum(sent) / len(sent) if sent else 0.0,
        JUDGE + "latency_s/max": max(sent, default=0.0),
        JUDGE + "masked/count": float(masked),
    }


def judge_masked_rows(batch: StepBatch) -> list[int]:
    """The samples whose trajectory the judge could not score under ``on_failure: mask`` (every sample of a
    trajectory carries its reward's fields)."""
    return [row for row, extra in enumerate(batch.reward_extra) if float(extra.get(JUDGE_MASK_KEY, 0.0)) == 1.0]


def _mask_unjudged(batch: StepBatch) -> int:
    """Zero the response mask of ``judge_masked_rows`` (the v1 trainer's hook writes it back to TransferQueue); the
    masked trajectories, counted once."""
    rows = judge_masked_rows(batch)
    for row in rows:
        batch.response_mask[row] = 0
    return sum(1 for row in rows if (fields := batch.fields[row]) is None or fields.is_final)
