"""Template-leftover stripping and answer/number extraction."""

from __future__ import annotations

import math

import pytest

from verl_mm_tools.rewards.text import (
    extract_last_boxed,
    extract_last_tagged,
    find_tag_blocks,
    last_number,
    parse_number,
    strip_template_leftovers,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>90</answer><|im_end|>", "<answer>90</answer>"),
        ("  <answer>90</answer>\n<|endoftext|>\n", "<answer>90</answer>"),
        ("<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nagain<|im_end|>", "hi\nagain"),
        ("<|vision_start|><|image_pad|><|image_pad|><|vision_end|>look", "look"),
        ("done<|eot_id|>", "done"),
        ("done</s>", "done"),
        ("<start_of_turn>model\nok<end_of_turn>", "ok"),
        ("[INST] q [/INST] a", "q  a"),
        ("a | b <not special> |x|", "a | b <not special> |x|"),
    ],
)
def test_strip_template_leftovers(text: str, expected: str) -> None:
    assert strip_template_leftovers(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>1</answer> then <answer> 2 </answer>", " 2 "),
        ("<ANSWER>3</Answer>", "3"),
        ("<answer>\nmulti\nline\n</answer>", "\nmulti\nline\n"),
        ("<answer>unclosed", None),
        ("no tags", None),
        ("<answer>4</answer><answer>unclosed", "4"),
    ],
)
def test_extract_last_tagged(text: str, expected: str | None) -> None:
    assert extract_last_tagged(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>1</answer>", ["1"]),
        ("<answer>1</answer> x <answer>2</answer>", ["1", "2"]),
        ("nothing", []),
        ("<answer>1", None),
        ("</answer>1<answer>", None),
        ("<answer><answer>1</answer></answer>", None),
    ],
)
def test_find_tag_blocks(text: str, expected: list[str] | None) -> None:
    assert find_tag_blocks(text, "answer") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{3}", "3"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{ 2\sqrt{3} }", r"2\sqrt{3}"),
        (r"\boxed{unclosed", None),
        ("none", None),
    ],
)
def test_extract_last_boxed(text: str, expected: str | None) -> None:
    assert extract_last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", 90.0),
        ("rotate 45 then 135°", 135.0),
        ("-90 degrees", -90.0),
        ("\u221230", -30.0),
        ("+12.5", 12.5),
        (".5", 0.5),
        ("no digits", None),
        ("9" * 400, None),
    ],
)
def test_last_number(text: str, expected: float | None) -> None:
    assert last_number(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("90°", 90.0), (" 7 degrees ", 7.0), ("1 or 2", None), ("", None)])
def test_parse_number_needs_exactly_one(text: str, expected: float | None) -> None:
    result = parse_number(text)
    assert result == expected and (result is None or math.isfinite(result))
