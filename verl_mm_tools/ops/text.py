"""Text a model will read, made valid for a chat template and a tokenizer. No verl import.

Tools, environments and sandboxed code answer with any Python ``str``, and not every ``str`` can be encoded: a lone
surrogate (``'\\ud800'``, printed by a program or decoded with ``surrogateescape``) makes the tokenizer raise. Control
characters are encodable but are not text: NUL ends C strings in some tokenizers' and servers' paths, escape sequences
and C1 controls render as nothing. Both are replaced, one for one, by U+FFFD (the replacement character), so the model
sees that something was there and lengths are kept; tab, line feed and carriage return are text and stay.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
# lone surrogates; C0 controls but tab, line feed and carriage return; DEL; the C1 controls
_NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate and control character (but tab, line feed, carriage return) replaced by
    U+FFFD: valid UTF-8, the same length."""
    return _NOT_TEXT.sub(REPLACEMENT, text)
