r"""Geometry3K answer check: verl's ``geo3k`` reward, robust to template leftovers.

Definition (identical to ``verl.utils.reward_score.geo3k.compute_score``):
    ``score = (1 - format_weight) * acc + format_weight * format_ok`` where ``acc`` is 1 when the last
    ``\boxed{...}`` (or, with ``use_boxed=False``, the whole response) grades equal to the ground truth, and
    ``format_ok`` is 1 when the response is ``<think>...</think> ... \boxed{...} ...``.

The response is stripped of template leftovers (``<|im_end|>`` ...) and surrounding whitespace first; verl's own
format check is a full match, so a leading newline would otherwise fail it.

Grading uses verl's ``geo3k`` module (``mathruler``'s ``grade_answer``) when ``mathruler`` is installed. verl imports
it without declaring it, so without it this falls back to verl's ``math_reward.is_equiv`` (the Hendrycks MATH
normalization), which agrees on plain numbers, fractions and roots but is stricter on some LaTeX spellings.
"""

from __future__ import annotations

import functools
import logging
import re
from types import ModuleType
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards.common import check_tunables
from verl_mm_tools.rewards.text import extract_last_boxed, strip_template_leftovers

logger = logging.getLogger(__name__)

__all__ = ["geo3k_accuracy", "geo3k_format_ok", "geo3k_reward"]

_TUNABLES = ("format_weight", "use_boxed")
# The same pattern as verl's geo3k.format_reward.
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


@functools.lru_cache(maxsize=1)
def _verl_geo3k() -> ModuleType | None:
    try:
        from verl.utils.reward_score import geo3k
    except ImportError:
        logger.warning("mathruler is not installed: geo3k answers are graded with verl's math_reward.is_equiv")
        return None
    return geo3k


def geo3k_format_ok(text: str) -> bool:
    r"""Whether ``text`` (already stripped) reads ``<think>...</think> ... \boxed{...} ...``."""
    return _FORMAT.fullmatch(text) is not None


def geo3k_accuracy(text: str, ground_truth: str, *, use_boxed: bool = True) -> float:
    r"""1.0 when the answer in ``text`` (the last ``\boxed{}``, or all of it) grades equal to ``ground_truth``."""
    verl_geo3k = _verl_geo3k()
    if verl_geo3k is not None:
        return float(verl_geo3k.acc_reward(text, ground_truth, use_boxed=use_boxed))
    from verl.utils.reward_score.math_reward import is_equiv

    answer = extract_last_boxed(text) if use_boxed else text
    return 1.0 if answer is not None and is_equiv(answer, ground_truth) else 0.0


def geo3k_reward(
    data_source: str,
    solution_str: str,
    ground_truth: object,
    extra_info: dict | None = None,
    *,
    format_weight: float = 0.1,
    use_boxed: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    r"""Score a Geometry3K answer like verl's ``geo3k.compute_score``, after stripping template leftovers.

    Args:
        data_source: Unused; part of verl's signature.
        solution_str: The decoded response.
        ground_truth: The answer (LaTeX or plain), e.g. ``"2\sqrt{3}"``.
        extra_info: Unused; part of verl's signature.
        format_weight: Weight of the format term, in [0, 1]; verl's default 0.1.
        use_boxed: Grade the last ``\boxed{}`` (True) or the whole response (False).
        **kwargs: Only the arguments verl passes to every reward function; anything else is a ConfigError.

    Returns:
        ``{"score", "acc", "format_ok"}`` with ``acc`` and ``format_ok`` in {0.0, 1.0}.
    """
    check_tunables("geo3k_reward()", kwargs, _TUNABLES)
    if isinstance(format_weight, bool) or not isinstance(format_weight, (int, float)) or not 0 <= format_weight <= 1:
        raise ConfigError(f"geo3k_reward format_weight must be a number in [0, 1], got {format_weight!r}")
    text = strip_template_leftovers(solution_str)
    acc = geo3k_accuracy(text, str(ground_truth), use_boxed=use_boxed)
    format_ok = 1.0 if geo3k_format_ok(text) else 0.0
    score = (1.0 - format_weight) * acc + format_weight * format_ok
    return {"score": score, "acc": acc, "format_ok": format_ok}
