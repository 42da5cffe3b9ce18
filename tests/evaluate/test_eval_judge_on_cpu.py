"""``verl-mm-tools eval --judge`` and ``rescore --judge``: the rows of a scripted chat endpoint (the policy) scored by
a scripted judge (``testkit.judge.ScriptedJudge``, a real chat-completions server on 127.0.0.1) through verl's
reward worker and ``judge_reward``: exact rewards, the images and question the judge got, the report's counts; then
the eval's records rescored by another scripted judge, which gets exactly what the first one got."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from chat_servers import ScriptedChatServer, answer, api_call
from PIL import Image

from verl_mm_tools.cli import main
from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.evaluate.run import TOOLS
from verl_mm_tools.testkit.judge import ScriptedJudge
from verl_mm_tools.testkit.sample_dump import sample_image
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

SOURCE = "eval_judge_test"
RIGHT, WRONG = "<answer>90</answer>", "<answer>45</answer>"
# row: the answers to each try of each turn (chat_servers.ScriptedChatServer); row 3 is row 2's prompt again
SCRIPTS = {
    0: [[api_call("rotate", '{"degrees": 90}')], [answer(RIGHT)]],  # a tool image, then the right answer
    1: [[answer(WRONG)]],
    2: [[answer(RIGHT)]],
}
ROW_PROMPTS = [0, 1, 2, 2]
QUESTION = "By how many degrees was this picture turned? You may call the rotate tool."
RUBRIC = "Grade the answer to {{ question }} (reference {{ ground_truth }}) from {{ min_score }} to {{ max_score }}."
RULE_WEIGHT = 0.5
# judge 9 (0.9) for the right answer, 2 (0.2) otherwise; plus 0.5 x exact_answer_reward (1 when right, else 0)
REWARDS = {0: 0.9 + RULE_WEIGHT, 1: 0.2, 2: 0.9 + RULE_WEIGHT, 3: 0.9 + RULE_WEIGHT}


def grade(body: dict) -> str:
    """9 for the right answer, 2 otherwise (the answer is the last content part, JSON-quoted)."""
    given = json.loads(body["messages"][1]["content"][-1]["text"])
    return f"Checked.\n<score>{9 if given == RIGHT else 2}</score>"


def decoded(part: dict) -> Image.Image:
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


def judge_view(body: dict) -> tuple[str, list[str], list[Image.Image], str]:
    """What the judge read: the question, the image labels, the images and the answer."""
    parts = body["messages"][1]["content"]
    question = json.loads(parts[0]["text"].removeprefix("QUESTION: "))
    labels = [part["text"] for part in parts if part["type"] == "text" and part["text"].startswith("Image ")]
    images = [decoded(part) for part in parts if part["type"] == "image_url"]
    return question, labels, images, json.loads(parts[-1]["text"])


def judge_flags(judge: ScriptedJudge, rubric: Path) -> list[str]:
    base_url = judge.url.removesuffix("/chat/completions")
    return ["--judge", base_url, "--judge-model", "judge", "--judge-rubric", str(rubric),
            "--judge-option", f"rule_weight={RULE_WEIGHT}", "--judge-option", "timeout_s=30"]  # fmt: skip


@pytest.fixture(scope="module")
def judged_eval(tiny_model_dir, tmp_path_factory):
    """eval --judge of four rows (row 1 names its own reward function, which the judge sets aside)."""
    workdir = tmp_path_factory.mktemp("judged_eval")
    rows = [
        image_row(SOURCE, f"row {prompt}: <image>{QUESTION}", sample_image(), "90",
                  {"index": index, **({"reward_fn": "rotation_reward_180"} if index == 1 else {})}, "mm_tool")
        for index, prompt in enumerate(ROW_PROMPTS)
    ]  # fmt: skip
    data = write_parquet(rows, workdir / "rows.parquet")
    (workdir / "tools.yaml").write_text(ROTATE_TOOLS_YAML)
    (workdir / "rubric.j2").write_text(RUBRIC)
    out = workdir / "out"
    with ScriptedChatServer(SCRIPTS).running() as policy, ScriptedJudge(grade) as judge:
        status = main(
            ["eval", "--data", str(data), "--endpoint", policy, "--model", "tiny", "--model-path", str(tiny_model_dir),
             "--tools", str(workdir / "tools.yaml"), "--reward-fn", "exact_answer_reward", "--max-turns", "2",
             "--response-length", "256", "--batch-size", "4", "--out", str(out),
             *judge_flags(judge, workdir / "rubric.j2")]
        )  # fmt: skip
    assert status == 0
    return out, judge, workdir


def rows_of(path: Path) -> dict[int, dict]:
    return {row["index"]: row for row in map(json.loads, path.read_text().splitlines())}


def records_of(out: Path) -> dict[int, tuple[dict, Path]]:
    records = {}
    for path in (out / TOOLS / "trajectories").glob("*/*/trajectory.json"):
        record = json.loads(path.read_text())
        records[record["sample"]["index"]] = (record, path.parent)
    return records


def test_eval_scores_every_row_with_the_judge_plus_the_rule(judged_eval):
    out, judge, _ = judged_eval
    rows = rows_of(out / TOOLS / "rows.jsonl")
    assert {index: row["reward"] for index, row in rows.items()} == pytest.approx(REWARDS)
    assert {index: (row["judge"]["score"], row["judge"]["verdict"]) for index, row in rows.items()} == {
        0: (pytest.approx(0.9), "judged"),
        1: (pytest.approx(0.2), "judged"),
        2: (pytest.approx(0.9), "judged"),
        3: (pytest.approx(0.9), "judged"),
    }
    # rows 2 and 3 (one prompt, one answer) were judged once: whichever came second from the cache
    assert sorted(row["judge"]["cached"] for row in rows.values()) == [False, False, False, True]
    assert not rows[0]["judge"]["cached"] and not rows[1]["judge"]["cached"]
    assert len(judge.requests) == 3
    record = records_of(out)[1][0]
    assert record["sample"]["extra_info"] == {"index": 1}  # its own reward_fn set aside: the judge scored it
    assert (record["reward"]["extra"]["rule_score"], record["reward"]["extra"]["judge_judged"]) == (0.0, 1.0)


def test_the_judge_saw_the_question_the_trajectorys_images_and_the_answer(judged_eval):
    out, judge, _ = judged_eval
    views = {int(view[0].split(":")[0].removeprefix("row ")): view for view in map(judge_view, judge.requests)}
    assert sorted(views) == [0, 1, 2]
    records = records_of(out)
    for prompt, (question, labels, images, given) in views.items():
        record, folder = records[prompt]
        assert question == f"row {prompt}: \n{QUESTION}"
        assert given == (WRONG if prompt == 1 else RIGHT)
        recorded = [Image.open(folder / entry["file"]).convert("RGB") for entry in record["images"]]
        assert labels == [f"Image {entry['id']} ({entry['source']}):" for entry in record["images"]]
        assert [image.size for image in images] == [image.size for image in recorded]
        assert [image.tobytes() for image in images] == [image.tobytes() for image in recorded]
    assert [entry["source"] for entry in records[0][0]["images"]] == ["prompt", "tool"]
    body = judge.requests[0]
    assert body["model"] == "judge"
    assert body["messages"][0]["content"].startswith(
        f"Grade the answer to {json.loads(body['messages'][1]['content'][0]['text'][10:])} (reference 90) from 0 to 10."
    )


def test_the_report_counts_the_judges_verdicts(judged_eval):
    out, _, _ = judged_eval
    report = json.loads((out / "report.json").read_text())
    figures = report["modes"][TOOLS][SOURCE]
    assert figures["judge"] == {
        "judged": 4,
        "parse_failures": 0,
        "failed": 0,
        "cache_hits": 1,
        "score_mean": pytest.approx((0.9 * 3 + 0.2) / 4),
    }
    assert figures["reward_mean"] == pytest.approx(sum(REWARDS.values()) / 4)
    text = (out / "report.txt").read_text()
    assert "[tools] judge: judged 4, parse failures 0, failed 0, cache hits 1, mean judge score 0.725\n" in text


def test_rescore_judges_the_records_as_eval_did(judged_eval, tmp_path):
    out, eval_judge, workdir = judged_eval
    with ScriptedJudge(grade) as judge:
        status = main(["rescore", str(out), "--out", str(tmp_path / "rescored"),
                       "--reward-fn", "exact_answer_reward", *judge_flags(judge, workdir / "rubric.j2")])  # fmt: skip
    assert status == 0
    # the same messages: the question, images (PNG bytes included) and answer rebuilt from each record
    assert sorted(json.dumps(body["messages"]) for body in judge.requests) == sorted(
        json.dumps(body["messages"]) for body in eval_judge.requests
    )
    rows = rows_of(tmp_path / "rescored" / "rows.jsonl")
    assert {index: row["reward"] for index, row in rows.items()} == pytest.approx(REWARDS)
    assert {index: row["reward_before"] for index, row in rows.items()} == pytest.approx(REWARDS)  # float32
    report = json.loads((tmp_path / "rescored" / "report.json").read_text())
    before, after = report["modes"]["tools before"][SOURCE], report["modes"]["tools rescored"][SOURCE]
    evaluated = json.loads((out / "report.json").read_text())["modes"][TOOLS][SOURCE]
    assert before == {**evaluated, "endpoint": {}}  # the records keep no endpoint faults
    assert after["judge"] == before["judge"]
    assert report["rescore"]["judge"] == {
        "endpoint": judge.url.removesuffix("/chat/completions"),
        "model": "judge",
        "rubric_path": str(workdir / "rubric.j2"),
        "images": "all",
        "options": {"rule_weight": RULE_WEIGHT, "timeout_s": 30},
    }
