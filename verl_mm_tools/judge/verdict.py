"""A judge's verdict on one answer, and the strict reading of its reply."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

__all__ = ["JudgeReplyError", "Verdict", "VerdictStatus", "parse_score"]

_SCORE_TAG = re.compile(r"<score>(.*?)</score>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeReplyError(ValueError):
    """The judge's reply holds no single readable score."""


class VerdictStatus(str, Enum):
    JUDGED = "judged"  # a score was read from the reply
    UNPARSEABLE = "unparseable"  # the judge answered, but with no single score in range
    FAILED = "failed"  # no answer: timeouts, connection errors or HTTP errors after every retry


@dataclass(frozen=True)
class Verdict:
    status: VerdictStatus
    score: float | None = None  # the judge's score (JUDGED), on the rubric's scale
    reply: str = ""
    error: str = ""
    latency_s: float = 0.0  # the request's seconds (0 for a cached verdict)
    cached: bool = False


def parse_score(reply: str, low: float, high: float) -> float:
    """The score of a reply that holds exactly one ``<score>N</score>`` as its last line, N in [low, high]. Several
    tags (a judge echoing an answer's fake tag), text after the tag, or a number out of range is a JudgeReplyError."""
    tags = _SCORE_TAG.findall(reply)
    if len(tags) != 1:
        raise JudgeReplyError(f"the reply must hold exactly one <score>N</score>, found {len(tags)}: {reply[-200:]!r}")
    last_line = reply.strip().splitlines()[-1].strip() if reply.strip() else ""
    if not _SCORE_TAG.fullmatch(last_line):
        raise JudgeReplyError(f"the reply's last line must be the score tag alone, got {last_line[:200]!r}")
    text = tags[0].strip()
    if not _NUMBER.fullmatch(text):
        raise JudgeReplyError(f"the score tag must hold a plain number, got {text[:50]!r}")
    score = float(text)
    if not math.isfinite(score) or not low <= score <= high:
        raise JudgeReplyError(f"the score {text} is outside the rubric's range [{low:g}, {high:g}]")
    return score
