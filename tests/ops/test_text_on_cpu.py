"""``valid_text``: what a tool's or environment's text becomes before the template and the tokenizer see it."""

from __future__ import annotations

import pytest

from verl_mm_tools.ops.text import valid_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain, ümlaut, 漢字, 😀", "plain, ümlaut, 漢字, 😀"),
        ("tab\tline\ncarriage\r", "tab\tline\ncarriage\r"),
        ("lone \ud800 and \udfff", "lone \ufffd and \ufffd"),
        ("nul \x00 bell \x07 escape \x1b[31m del \x7f", "nul \ufffd bell \ufffd escape \ufffd[31m del \ufffd"),
        ("c1 \x80 \x85 \x9f, after \xa0", "c1 \ufffd \ufffd \ufffd, after \xa0"),
        ("", ""),
    ],
    ids=["text", "tab-lf-cr", "surrogates", "c0-del", "c1", "empty"],
)
def test_invalid_characters_become_the_replacement_character_one_for_one(text, expected):
    assert valid_text(text) == expected
    assert len(valid_text(text)) == len(text)
    valid_text(text).encode("utf-8")  # never raises
