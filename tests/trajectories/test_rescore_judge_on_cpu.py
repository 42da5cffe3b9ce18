"""``verl-mm-tools rescore --judge``: the sample dump's records (the tiny Qwen2.5-VL, its turns scripted) judged by a
scripted judge (``testkit.judge.ScriptedJudge``): the question and the images each record holds, chosen by
``--judge-images``, exact rewards, the report's counts, and a record the judge cannot see refused with its reason."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from verl_mm_tools.cli import main
from verl_mm_tools.judge.context import ImageChoice
from verl_mm_tools.record import RECORD_FILE, RecordError
from verl_mm_tools.testkit.judge import ScriptedJudge
from verl_mm_tools.trajectories.read import load_records
from verl_mm_tools.trajectories.rescore_judge import record_judge_context
from verl_mm_tools.viewer.site import build_site

SOURCE = "verl_mm_tools/rotation"
WORDS = ("rotated", "guess", "typo", "broken")  # sample_dump.SAMPLE_SCRIPTS by index
RIGHT = "<answer>90</answer>"
# judge 9 for the right answer, 2 otherwise: rotated and typo answer 90, guess 45, broken (masked) nothing
REWARDS = {0: 0.9, 1: 0.2, 2: 0.9, 3: 0.2}
ANSWERS = {0: RIGHT, 1: "<answer>45</answer>", 2: RIGHT, 3: ""}


def grade(body: dict) -> str:
    given = json.loads(body["messages"][1]["content"][-1]["text"])
    return f"Checked.\n<score>{9 if given == RIGHT else 2}</score>"


def judged(body: dict) -> dict:
    """What the judge read: the question, the answer, and each image's id and pixels."""
    parts = body["messages"][1]["content"]
    labels = [part["text"] for part in parts if part["type"] == "text" and part["text"].startswith("Image ")]
    ids = [int(label.split()[1]) for label in labels]
    pixels = [
        Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])))
        for part in parts
        if part["type"] == "image_url"
    ]
    question = json.loads(parts[0]["text"].removeprefix("QUESTION: "))
    return {"question": question, "answer": json.loads(parts[-1]["text"]), "images": dict(zip(ids, pixels))}


def rescore_judged(records: Path, out: Path, *flags: str) -> list[dict]:
    with ScriptedJudge(grade) as judge:
        base_url = judge.url.removesuffix("/chat/completions")
        status = main(["rescore", str(records), "--out", str(out), "--judge", base_url, "--judge-model", "j", *flags])
    assert status == 0
    return [judged(body) for body in judge.requests]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def record_images(record_path: Path) -> dict[int, Image.Image]:
    record = json.loads(record_path.read_text())
    return {entry["id"]: Image.open(record_path.parent / entry["file"]) for entry in record["images"]}


@pytest.mark.parametrize(
    ("choice", "rotated_images"),
    [("all", [1, 2, 3]), ("last:1", [1, 3]), ("named", [1]), ("none", [1])],
)
def test_the_judge_sees_each_records_question_and_the_chosen_images(choice, rotated_images, sample_dump, tmp_path):
    step = sample_dump / "step_000001"
    seen = rescore_judged(step, tmp_path / "out", "--judge-images", choice)
    rows = rows_of(tmp_path / "out")
    assert {row["index"]: row["reward"] for row in rows} == pytest.approx(REWARDS)
    assert {row["index"]: row["judge"]["verdict"] for row in rows} == dict.fromkeys(REWARDS, "judged")
    by_word = {view["question"].split(":")[0]: view for view in seen}
    assert sorted(by_word) == sorted(WORDS)
    for row in rows:
        view = by_word[WORDS[row["index"]]]
        assert view["question"] == f"{WORDS[row['index']]}: by how many degrees was this image rotated?"
        assert view["answer"] == ANSWERS[row["index"]]
        recorded = record_images(Path(row["source"]))
        expected = rotated_images if row["index"] == 0 else [1]  # the others hold their prompt image only
        assert list(view["images"]) == expected
        for image_id, image in view["images"].items():
            assert (image.size, image.mode) == (recorded[image_id].size, recorded[image_id].mode)
            assert image.tobytes() == recorded[image_id].tobytes()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["modes"]["rescored"][SOURCE]["judge"] == {
        "judged": 4,
        "parse_failures": 0,
        "failed": 0,
        "cache_hits": 0,
        "score_mean": pytest.approx(0.55),
    }
    assert "before" in report["modes"] and "judge" not in report["modes"]["before"][SOURCE]  # scored by rules
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "  [rescored] judge: judged 4, parse failures 0, failed 0, cache hits 0, mean judge score 0.550\n" in text
    assert "rescored with reward manager mm_turn_discount, reward function judge_reward (judge j at " in text
    assert text.endswith(f", images {choice})\n")
    if choice == "all":
        page = build_site(tmp_path / "out" / "trajectories", tmp_path / "site").pages[rows[0]["record"].split("/")[-2]]
        assert '<dd id="rescored">mm_turn_discount manager, judge_reward by j</dd>' in page.read_text()


def test_a_record_the_judge_cannot_see_is_refused_and_the_others_judged(sample_dump, tmp_path):
    step = tmp_path / "dump" / "step_000001"
    shutil.copytree(sample_dump / "step_000001", step)
    paths = {json.loads(path.read_text())["sample"]["index"]: path for path in step.glob(f"*/{RECORD_FILE}")}
    rotated = json.loads(paths[0].read_text())
    rotated["images"][0]["source"], rotated["images"][1]["source"] = "tool", "prompt"  # a tampered record
    paths[0].write_text(json.dumps(rotated))
    shutil.rmtree(paths[1].parent / "images")  # the reader refuses it: its image file is missing
    seen = rescore_judged(step, tmp_path / "out")
    assert len(seen) == 2
    assert {row["index"]: row["reward"] for row in rows_of(tmp_path / "out")} == pytest.approx({2: 0.9, 3: 0.2})
    bad = {entry["path"]: entry["reason"] for entry in json.loads((tmp_path / "out" / "report.json").read_text())[
        "bad_records"]}  # fmt: skip
    assert bad == {
        str(paths[0]): f"{paths[0]}: its prompt images are not its first ones: the judge's images are unknown",
        str(paths[1]): f"{paths[1]}: image 1's file {paths[1].parent / 'images' / '1.png'} is missing",
    }


def test_an_image_that_no_longer_decodes_is_a_record_error(sample_dump, tmp_path):
    shutil.copytree(sample_dump / "step_000001", tmp_path / "step")
    item = next(item for item in load_records([tmp_path / "step"]).records if item.record["sample"]["index"] == 0)
    context = record_judge_context(item, ImageChoice.parse("all"), RIGHT)
    assert [image.image_id for image in context.images] == [1, 2, 3]
    assert context.question == "rotated: by how many degrees was this image rotated?"
    item.image_file(2).write_bytes(b"\x89PNG not really")
    with pytest.raises(RecordError, match=r"image 2's file .*2\.png cannot be read for the judge \(UnidentifiedImage"):
        record_judge_context(item, ImageChoice.parse("all"), RIGHT)
    assert [image.image_id for image in record_judge_context(item, ImageChoice.parse("none"), RIGHT).images] == [1]
