"""The demo's before-and-after trajectories, read from a real dump (tiny VLM, rotate tool, two steps of scripted
trajectories through verl's worker and reward worker)."""

from __future__ import annotations

import json
import shutil

import pytest

from verl_mm_tools.demo.examples import MESSAGE_CHARS, before_and_after
from verl_mm_tools.testkit.sample_dump import write_sample_dump

ROTATE_TWICE = [
    '  assistant: <tool_call> {"name": "rotate", "arguments": {"degrees": 90}} </tool_call>',
    "       tool: [image 2, 84x56] Image 2: Image 1 rotated by 90 degrees counter-clockwise, 84x56 px.",
    '  assistant: <tool_call> {"name": "rotate", "arguments": {"degrees": 90, "image_id": 1}} </tool_call>',
    "       tool: [image 3, 84x56] Image 3: Image 1 rotated by 90 degrees counter-clockwise, 84x56 px.",
    "  assistant: <answer>90</answer>",
]


@pytest.fixture(scope="module")
def dump(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("examples")
    write_sample_dump(workdir / "dump", workdir / "work", model_dir=tiny_model_dir, steps=(1, 2))
    return workdir / "dump"


def test_the_first_trajectory_of_the_first_and_the_last_step_in_text(dump):
    assert before_and_after(dump) == [
        "before (step 1, reward 1.00, answer 90):",
        *ROTATE_TWICE,
        "after (step 2, reward 1.00, answer 90):",
        *ROTATE_TWICE,
    ]


def test_one_step_shows_before_only_and_long_messages_are_cut(dump, tmp_path):
    shutil.copytree(dump / "step_000001", tmp_path / "step_000001")
    for path in (tmp_path / "step_000001").glob("*/trajectory.json"):
        record = json.loads(path.read_text())
        record["messages"][1]["text"] = "x " * 200
        path.write_text(json.dumps(record))
    lines = before_and_after(tmp_path)
    assert lines[0] == "before (step 1, reward 1.00, answer 90):"
    assert lines[1] == "  assistant: " + ("x " * 200)[: MESSAGE_CHARS - 3] + "..."
    assert lines[2:] == ROTATE_TWICE[1:] and not any(line.startswith("after") for line in lines)


def test_no_dumps_no_lines(tmp_path):
    assert before_and_after(tmp_path / "absent") == []
    assert before_and_after(tmp_path) == []
