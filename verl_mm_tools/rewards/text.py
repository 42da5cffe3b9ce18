"""Text helpers shared by the reward functions: template-leftover stripping, answer spans, numbers.

Responses reach reward functions as decoded text. Depending on how they were decoded (``skip_special_tokens``,
tokens a chat template adds that are not registered as special) they may still carry template leftovers such as
``<|im_end|>``, ``<|endoftext|>``, ``<|im_start|>assistant`` or vision placeholders. Every reward function strips
them first, so a trailing ``<|im_end|>`` never turns a right answer into a wrong one.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "extract_last_boxed",
    "extract_last_tagged",
    "find_tag_blocks",
    "last_number",
    "parse_number",
    "strip_template_leftovers",
]

# `<|...|>` covers ChatML/Qwen (`<|im_end|>`, `<|endoftext|>`, `<|image_pad|>`, ...) and Llama 3 (`<|eot_id|>`);
# a ChatML turn opener also drops the role name that follows it. The rest are Llama 2 / Mistral / Gemma markers.
_LEFTOVER = re.compile(
    r"<\|im_start\|>(?:system|user|assistant|tool)?\n?"
    r"|<\|[A-Za-z0-9_./-]{1,48}\|>"
    r"|</?s>|<eos>|<bos>|<pad>|<unk>"
    r"|<start_of_turn>(?:user|model)?\n?|<end_of_turn>"
    r"|\[/?INST\]"
)
# Unicode minus signs models sometimes emit in front of numbers.
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)")


def strip_template_leftovers(text: str) -> str:
    """Remove chat-template special tokens left in decoded text and trim surrounding whitespace."""
    return _LEFTOVER.sub("", text).strip()


def _tag_pattern(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<(/?){re.escape(tag)}\s*>", re.IGNORECASE)


def find_tag_blocks(text: str, tag: str) -> list[str] | None:
    """Contents of the ``<tag>...</tag>`` blocks in ``text``, in order.

    Returns:
        The block contents (possibly empty list when the tag never occurs), or ``None`` when the tags are not
        well-formed: an opening tag inside an open block, a closing tag without an opening one, or an unclosed block.
    """
    blocks: list[str] = []
    open_at: int | None = None
    for match in _tag_pattern(tag).finditer(text):
        is_closing = match.group(1) == "/"
        if is_closing == (open_at is None):
            return None  # a closing tag with nothing open, or a nested opening tag
        if is_closing:
            blocks.append(text[open_at : match.start()])
            open_at = None
        else:
            open_at = match.end()
    return None if open_at is not None else blocks


def extract_last_tagged(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` block (case-insensitive tag), or ``None`` if there is none.

    Unlike :func:`find_tag_blocks` this is lenient: a stray unclosed tag elsewhere does not hide a complete block.
    """
    pattern = re.compile(rf"<{re.escape(tag)}\s*>(.*?)</{re.escape(tag)}\s*>", re.IGNORECASE | re.DOTALL)
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def extract_last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` in ``text`` with nested braces balanced, or ``None``."""
    start = text.rfind(r"\boxed{")
    if start < 0:
        return None
    depth = 0
    content_start = start + len(r"\boxed{")
    for index in range(content_start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return text[content_start:index].strip()
            depth -= 1
    return None


def parse_number(text: str) -> float | None:
    """The single finite number ``text`` consists of (units such as ``°`` or ``degrees`` allowed), else ``None``."""
    numbers = _NUMBER.findall(text.translate(_MINUS_SIGNS))
    if len(numbers) != 1:
        return None
    return last_number(text)


def last_number(text: str) -> float | None:
    """The last finite decimal number written in ``text`` (``-12``, ``+3.5``, ``.5``), or ``None``."""
    numbers = _NUMBER.findall(text.translate(_MINUS_SIGNS))
    if not numbers:
        return None
    value = float(numbers[-1])
    # A digit run longer than float's range parses as inf: not an answer anyone meant.
    return value if math.isfinite(value) else None
