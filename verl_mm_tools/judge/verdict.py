"""A judge's verdict on one answer, and the strict reading of its reply."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["JudgeReplyError", "PromptCount", "Verdict", "VerdictStatus", "parse_score", "token_digest"]

_SCORE_TAG = re.compile(r"<score>(.*?)</score>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeReplyError(ValueError):
    """The judge's reply holds no single readable score."""


class VerdictStatus(str, Enum):
    JUDGED = "judged"  # a score was read from the reply
    UNPARSEABLE = "unparseable"  # the judge answered, but with no single score in range
    FAILED = "failed"  # no answer: timeouts, connection errors or HTTP errors after every retry


def token_digest(token_ids: Sequence[int]) -> int:
    """A CRC-32 of token ids (a whole number below 2**32, exact as a float in reward_extra_info)."""
    return zlib.crc32(",".join(str(token) for token in token_ids).encode())


@dataclass(frozen=True)
class PromptCount:
    """What a judge's answer says of the prompt it read (0s where it says nothing)."""

    tokens: int = 0  # usage.prompt_tokens
    digest: int = 0  # token_digest of vLLM's prompt_token_ids (``return_token_ids``)

    @classmethod
    def of(cls, completion: dict[str, Any]) -> PromptCount:
        usage = completion.get("usage")
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        ids = completion.get("prompt_token_ids")
        whole = isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        return cls(
            tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0,
            digest=token_digest(ids) if whole and ids else 0,
        )


@dataclass(frozen=True)
class Verdict:
    status: VerdictStatus
    score: float | None = None  # the judge's score (JUDGED), on the rubric's scale
    reply: str = ""
    error: str = ""
    latency_s: float = 0.0  # the request's seconds (0 for a cached verdict)
    cached: bool = False
    prompt: PromptCount = field(default_factory=PromptCount)  # the prompt the judge read, images included


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
