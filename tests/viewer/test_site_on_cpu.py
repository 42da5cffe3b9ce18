"""``verl-mm-tools view`` without a browser: the CLI, what the site is made of, verl's own rollout JSONL, refusals
with what to do, escaping, serving on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from verl_mm_tools.cli import main
from verl_mm_tools.record import RECORD_FILE, STAGED_RECORD_FILE, STAGING_DIR
from verl_mm_tools.viewer.chromium import ENV_EXECUTABLE, ChromiumError, find_chromium
from verl_mm_tools.viewer.loading import ViewerError, load_trajectories
from verl_mm_tools.viewer.site import build_site

REMOTE_REFERENCE = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:[a-z]+:)?//""", re.IGNORECASE)


@pytest.fixture
def dump_copy(sample_dump, tmp_path):
    """A private copy of the sample dump (without its site), for tests that change it."""
    copy = tmp_path / "dump"
    shutil.copytree(sample_dump, copy, ignore=shutil.ignore_patterns("_site"))
    return copy


def first_record_path(dump_dir):
    return sorted(dump_dir.glob(f"step_000001/*/{RECORD_FILE}"))[0]


def test_view_writes_the_site_and_says_where(dump_copy, tmp_path, capsys):
    assert main(["view", str(dump_copy), "--out", str(tmp_path / "site")]) == 0
    assert capsys.readouterr().out == f"8 trajectories: {tmp_path / 'site' / 'index.html'}\n"
    pages = sorted(path.stem for path in (tmp_path / "site" / "t").glob("*.html"))
    assert pages == sorted(trajectory.id for trajectory in load_trajectories(dump_copy))
    assert main(["view", str(dump_copy), "--out", str(tmp_path / "site")]) == 0  # a rebuild replaces its own site


def test_the_site_references_nothing_outside_itself(sample_site):
    for path in [sample_site.index, *sample_site.pages.values()]:
        html = path.read_text(encoding="utf-8")
        assert not REMOTE_REFERENCE.search(html), path
        assert "<link" not in html and "<script src" not in html and "@import" not in html
        for reference in re.findall(r'(?:src|href)="([^"#]+)"', html):
            assert (path.parent / reference).resolve().is_file(), (path, reference)


def test_images_are_linked_not_copied_when_the_file_system_allows(sample_site, sample_dump):
    record_path = first_record_path(sample_dump)
    image = json.loads(record_path.read_text())["images"][0]["file"]
    site_image = sample_site.index.parent / "img" / record_path.parent.name / image
    assert os.path.samefile(site_image, record_path.parent / image)


def test_text_from_the_model_is_escaped(dump_copy, tmp_path):
    path = first_record_path(dump_copy)
    record = json.loads(path.read_text())
    record["messages"][1]["text"] = '<img src=x onerror="alert(1)"></pre><script>alert(2)</script>'
    path.write_text(json.dumps(record))
    site = build_site(dump_copy, tmp_path / "site")
    html = site.pages[record["id"]].read_text()
    assert "<script>alert(2)" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&lt;/pre&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in html


def test_a_trajectory_exported_per_turn_shows_which_turns_each_sample_trains_on(dump_copy, tmp_path):
    path = first_record_path(dump_copy)
    record = json.loads(path.read_text())
    record["samples"] = [
        {"sample": 0, "turns": [1], "prompt_tokens": 420, "response_tokens": 30, "trained_tokens": 30, "images": 1},
        {"sample": 1, "turns": [2, 3], "prompt_tokens": 510, "response_tokens": 90, "trained_tokens": 50, "images": 2},
    ]
    path.write_text(json.dumps(record))
    html = build_site(dump_copy, tmp_path / "site").pages[record["id"]].read_text()
    table = html[html.index('<table id="samples">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert cells == [["1", "1", "420", "30", "0", "1"], ["2", "2, 3", "510", "50", "40", "2"]]


def test_a_one_sample_trajectory_has_no_samples_table(sample_site):
    assert all('id="samples"' not in page.read_text() for page in sample_site.pages.values())


def test_a_rescored_trajectory_shows_its_new_score_the_recorded_one_and_how_it_was_rescored(dump_copy, tmp_path):
    path = first_record_path(dump_copy)
    record = json.loads(path.read_text())
    record["reward_before"] = {**record["reward"], "score": 1.0}
    record["reward"] = {**record["reward"], "score": 0.25}
    record["rescored"] = {"reward_manager": "naive", "reward_fn": "format_reward"}  # what verl-mm-tools rescore adds
    path.write_text(json.dumps(record))
    site = build_site(dump_copy, tmp_path / "site")
    html = site.pages[record["id"]].read_text()
    assert (
        '<dt title="the reward manager score when rescored">Score (rescored)</dt><dd id="score">0.25</dd>'
        '<dt title="the score as recorded (sum of rm_scores)">Score before rescoring</dt><dd id="score-before">1</dd>'
        '<dt>Rescored with</dt><dd id="rescored">naive manager, format_reward</dd>'
    ) in html
    others = [page.read_text() for name, page in site.pages.items() if name != record["id"]]
    assert all('id="score-before"' not in other and "Score (rm_scores)</dt>" in other for other in others)


def test_verl_rollout_data_dir_jsonl_is_shown_as_text_only_trajectories(tmp_path):
    rollout_dir = tmp_path / "rollouts"
    rollout_dir.mkdir()
    rows = [  # what verl's trainer writes to trainer.rollout_data_dir/<step>.jsonl
        {
            "input": "user\nHow far is it rotated?",
            "output": '<tool_call>\n{"name": "rotate", "arguments": {"degrees": 90}}\n</tool_call>\n<answer>90</answer>',  # noqa: E501
            "gts": "90",
            "score": 1.0,
            "step": 3,
            "acc": True,
        },
        {
            "input": "user\nAnd this one?",
            "output": "<answer>0</answer>",
            "gts": "90",
            "score": 0.0,
            "step": 3,
            "acc": False,
        },
    ]
    (rollout_dir / "3.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    site = build_site(rollout_dir, tmp_path / "site")
    index = site.index.read_text()
    assert 'data-id="3-1" data-step="3" data-reward="1.0" data-tools="rotate"' in index
    assert 'data-id="3-2" data-step="3" data-reward="0.0" data-tools=""' in index
    page = site.pages["3-1"].read_text()
    assert "&lt;answer&gt;90&lt;/answer&gt;" in page and "<dt>acc</dt><dd>true</dd>" in page


def test_unpublished_staged_trajectories_are_shown_and_reported(dump_copy, tmp_path, caplog):
    record_path = first_record_path(dump_copy)
    staged = dump_copy / STAGING_DIR / "unpublished"
    shutil.copytree(record_path.parent, staged)
    record = json.loads((staged / RECORD_FILE).read_text())
    for key in ("step", "validate", "rollout_n", "reward"):
        record.pop(key)
    record["id"] = "unpublished"
    (staged / RECORD_FILE).unlink()
    (staged / STAGED_RECORD_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        site = build_site(dump_copy, tmp_path / "site")
    assert "unpublished" in site.pages
    assert "1 trajectories under" in caplog.text and "never published by the manager" in caplog.text
    assert 'data-id="unpublished" data-step="" data-reward=""' in site.index.read_text()


@pytest.mark.parametrize(
    "prepare, message",
    [
        (
            lambda path: None,
            r"no trajectories under .*: expected step_\*/<id>/trajectory.json \(the mm_tool loop's "
            r"dump_dir option\) or <step>.jsonl files",
        ),
        (lambda path: (path / "3.jsonl").write_text("not json\n"), r"3.jsonl:1 is not a JSON line"),
        (
            lambda path: (
                (path / "step_000001" / "x").mkdir(parents=True)
                or (path / "step_000001" / "x" / RECORD_FILE).write_text('{"format": "something-else"}')
            ),
            r"format 'something-else', not a trajectory record.*delete the trajectory folder",
        ),
    ],
)
def test_what_cannot_be_shown_is_refused_with_what_to_do(tmp_path, prepare, message):
    source = tmp_path / "source"
    source.mkdir()
    prepare(source)
    with pytest.raises(ViewerError, match=message):
        build_site(source, tmp_path / "site")


def test_a_missing_image_file_is_listed_on_the_index_and_a_foreign_out_dir_refused(dump_copy, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ViewerError, match=r"is not a site written by verl-mm-tools view; pass an empty or new"):
        build_site(dump_copy, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"

    broken = first_record_path(dump_copy)
    (broken.parent / "images" / "1.png").unlink()
    site = build_site(dump_copy, tmp_path / "site")  # the others shown, the broken one listed on the index page
    assert len(site.pages) == 7 and [bad.path for bad in site.bad] == [broken]
    assert "images/1.png is missing" in site.index.read_text() and "Left out: 1 records" in site.index.read_text()


def test_view_reports_errors_on_stderr_with_exit_code_2(tmp_path, capsys):
    assert main(["view", str(tmp_path / "absent")]) == 2
    assert "is not a directory; pass the mm_tool dump_dir or verl's rollout_data_dir" in capsys.readouterr().err


def test_a_missing_chromium_is_an_error_that_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_EXECUTABLE, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ChromiumError, match=r"no Chromium found on PATH.*apt-get install -y chromium"):
        find_chromium()
    monkeypatch.setenv(ENV_EXECUTABLE, str(tmp_path / "nothing"))
    with pytest.raises(ChromiumError, match=r"is not an executable file"):
        find_chromium()


def test_serve_answers_on_127_0_0_1_until_interrupted(sample_dump, tmp_path):
    command = [
        sys.executable,
        "-m",
        "verl_mm_tools.cli",
        "view",
        str(sample_dump),
        "--out",
        str(tmp_path / "site"),
        "--serve",
        "0",
    ]
    # A shell that starts jobs in the background (CI under nohup ... &) ignores SIGINT, and its children inherit that:
    # give the server the disposition an interactive Ctrl-C meets.
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=120) == f"8 trajectories: {tmp_path / 'site' / 'index.html'}\n"
        serving = lines.get(timeout=30)
        url = re.fullmatch(r"serving (http://127\.0\.0\.1:\d+/) \(Ctrl-C to stop\)\n", serving).group(1)
        with urllib.request.urlopen(url + "index.html", timeout=10) as response:
            assert response.status == 200 and b'id="trajectories"' in response.read()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, process.stderr.read()
        process.stderr.close()


def test_a_browser_that_dies_or_hangs_is_an_error_not_a_hang(tmp_path):
    from verl_mm_tools.viewer.chromium import Chromium

    with Chromium("/bin/false") as dead:
        with pytest.raises(ChromiumError, match=r"Chromium exited (before|while waiting for)"):
            dead.open("about:blank")
    hanging = tmp_path / "hanging-browser"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    with Chromium(str(hanging), timeout_s=1) as silent:
        with pytest.raises(ChromiumError, match=r"timed out after 1 s waiting for the answer to Target.createTarget"):
            silent.open("about:blank")


def test_the_index_shows_the_demos_learning_curve_above_the_trajectories(dump_copy, tmp_path):
    """The demo writes learning_curve.svg next to learning_curve.json, in the folder above its trajectory dumps."""
    from verl_mm_tools.viewer.curve import curve_svg

    curve = {
        "task": "learn_zoom",
        "target": 0.9,
        "chance": 0.5,
        "learned": True,
        "steps": [1, 2, 3],
        "reward": [0.5, 0.75, 1.0],
        "call_rate": [0.5, 0.8, 1.0],
        "validation": {"0": 0.5, "3": 1.0},
    }
    (tmp_path / "learning_curve.svg").write_text(curve_svg(curve))
    site = build_site(dump_copy, tmp_path / "site")
    index = site.index.read_text()
    assert '<figure class="curve"><img src="learning_curve.svg"' in index
    assert (tmp_path / "site" / "learning_curve.svg").read_text() == curve_svg(curve)
    (tmp_path / "learning_curve.svg").unlink()
    assert "curve" not in build_site(dump_copy, tmp_path / "site").index.read_text()  # a dump without a curve
