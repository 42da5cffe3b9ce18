"""Format reward: is the answer where the answer belongs?

Definition: after stripping template leftovers, the response is well-formed when
    * its ``<tag>``/``</tag>`` pairs are balanced and not nested, with at least one block;
    * exactly one block, unless ``allow_multiple`` (multi-turn responses keep every earlier answer);
    * the last block is not blank and, with ``numeric``, holds exactly one number (units allowed);
    * with ``answer_last``, nothing but whitespace follows the last ``</tag>``;
    * with ``require_think``, a non-blank ``<think>...</think>`` block comes before the last answer block.
The score is 1.0 when well-formed, else 0.0, with the first failed rule as the reason.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards.common import check_tunables
from verl_mm_tools.rewards.text import find_tag_blocks, parse_number, strip_template_leftovers

logger = logging.getLogger(__name__)

__all__ = ["check_answer_format", "format_reward"]

_TUNABLES = ("tag", "allow_multiple", "numeric", "answer_last", "require_think")
_TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def check_answer_format(
    text: str,
    *,
    tag: str = "answer",
    allow_multiple: bool = False,
    numeric: bool = False,
    answer_last: bool = True,
    require_think: bool = False,
) -> str:
    """The first format rule ``text`` breaks (see the module docstring), or "ok"."""
    blocks = find_tag_blocks(text, tag)
    if blocks is None:
        return f"unbalanced or nested <{tag}> tags"
    if not blocks:
        return f"no <{tag}>...</{tag}> block"
    if len(blocks) > 1 and not allow_multiple:
        return f"{len(blocks)} <{tag}> blocks, expected one"
    if not blocks[-1].strip():
        return f"empty <{tag}> block"
    if numeric and parse_number(blocks[-1]) is None:
        return f"<{tag}> block does not hold exactly one number"
    last_close = list(re.finditer(rf"</{re.escape(tag)}\s*>", text, re.IGNORECASE))[-1]
    if answer_last and text[last_close.end() :].strip():
        return f"text after </{tag}>"
    if require_think and not _has_think_before(text[: last_close.start()]):
        return f"no <think>...</think> block before <{tag}>"
    return "ok"


def _has_think_before(prefix: str) -> bool:
    thoughts = find_tag_blocks(prefix, "think")
    return bool(thoughts and thoughts[-1].strip())


def format_reward(
    data_source: str,
    solution_str: str,
    ground_truth: object = None,
    extra_info: dict | None = None,
    *,
    tag: str = "answer",
    allow_multiple: bool = False,
    numeric: bool = False,
    answer_last: bool = True,
    require_think: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """1.0 when the response is well-formed (see the module docstring), else 0.0; the ground truth is not read.

    Args:
        data_source: Unused; part of verl's signature.
        solution_str: The decoded response.
        ground_truth: Unused; part of verl's signature.
        extra_info: Unused; part of verl's signature.
        tag: The answer tag name, e.g. "answer" for ``<answer>...</answer>``.
        allow_multiple: Accept several answer blocks (the last one is checked).
        numeric: The last block must hold exactly one number.
        answer_last: Nothing but whitespace may follow the last closing tag.
        require_think: A non-blank ``<think>...</think>`` block must precede the last answer block.
        **kwargs: Only the arguments verl passes to every reward function; anything else is a ConfigError.

    Returns:
        ``{"score", "format_ok", "reason"}``; ``reason`` is "ok" or the first rule broken.
    """
    check_tunables("format_reward()", kwargs, _TUNABLES)
    if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
        raise ConfigError(f"format_reward tag must be a tag name like 'answer' (no angle brackets), got {tag!r}")
    reason = check_answer_format(
        strip_template_leftovers(solution_str),
        tag=tag,
        allow_multiple=allow_multiple,
        numeric=numeric,
        answer_last=answer_last,
        require_think=require_think,
    )
    score = 1.0 if reason == "ok" else 0.0
    return {"score": score, "format_ok": score, "reason": reason}
