"""``verl-mm-tools rescore``: recorded trajectories (a training dump and an eval output of the tiny Qwen2.5-VL, its
turns scripted) scored again through verl's own reward worker and manager classes, with no model and no server:
exact scores, eval's report of both scores, the record copies and the viewer, bad records listed with their file."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE, hook_overrides
from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.run import TOOLS, EvalOptions, evaluate
from verl_mm_tools.record import RECORD_FILE, RECORD_VERSION, chat_image_ids
from verl_mm_tools.runtime.rollout import REWARD_OVERRIDES, LocalRollout
from verl_mm_tools.testkit.sample_dump import SAMPLE_SCRIPTS, sample_image, sample_rows, scripted_by_word
from verl_mm_tools.testkit.scripted import ScriptedServer
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML
from verl_mm_tools.trajectories.rescore import rescore
from verl_mm_tools.trajectories.rescore_command import add_rescore_command
from verl_mm_tools.trajectories.rescore_options import RescoreOptions
from verl_mm_tools.viewer.site import build_site

SOURCE = "verl_mm_tools/rotation"
# the sample scripts by sample index: rotate twice then answer 90; answer 45 at once; call an unknown tool then
# answer 90; generate an image placeholder (masked)
WORDS = list(SAMPLE_SCRIPTS)
# each index's score as recorded (mm_turn_discount, rotation_reward_45: 45 degrees off scores 0) and rescored with
# rotation_reward_180 (45 degrees off scores 1 - 45/180); the masked trajectory's last assistant text is empty
RECORDED = {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}
ROTATION_180 = {0: 1.0, 1: 0.75, 2: 1.0, 3: 0.0}
# each index's response tokens as the loop recorded them (the masked one: the loop's one eos token)
RESPONSE_TOKENS = {0: 176, 1: 9, 2: 93, 3: 1}


def rescore_cli(*argv: str) -> int:
    """The command as cli.py wires it: parsed by add_rescore_command's parser, run by its ``run``."""
    parser = argparse.ArgumentParser(prog="verl-mm-tools")
    add_rescore_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rescore", *argv])
    return args.run(args)


def rows_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def record_of(out, row: dict) -> dict:
    return json.loads((out / row["record"]).read_text())


@pytest.fixture(scope="module")
def rescored_dump(sample_dump, tmp_path_factory):
    """The sample dump (two steps of the four scripts) rescored with rotation_reward_180 by mm_turn_discount."""
    out = tmp_path_factory.mktemp("rescored") / "out"
    report = rescore(RescoreOptions(records=(sample_dump,), out=out, reward_fn="rotation_reward_180"))
    return report, out


class ScriptedEndpoint(ScriptedServer):
    """The scripted turns answered as an endpoint answers eval: without log-probs (eval computes none)."""

    async def generate(self, request_id, **kwargs):
        output = await super().generate(request_id, **kwargs)
        return output.model_copy(update={"log_probs": None})


@pytest.fixture(scope="module")
def eval_out(tiny_model_dir, tmp_path_factory):
    """``verl-mm-tools eval`` of the four scripts as dataset rows (scored with rotation_reward_45), the tiny model's
    turns answered by the scripted server in the place of an endpoint."""
    workdir = tmp_path_factory.mktemp("eval")
    rows = [
        image_row(SOURCE, f"<image>{word}: by how many degrees was this image rotated?", sample_image(), "90",
                  {"index": index}, "mm_tool")
        for index, word in enumerate(WORDS)
    ]  # fmt: skip
    (workdir / "tools.yaml").write_text(ROTATE_TOOLS_YAML)
    options = EvalOptions(
        data=write_parquet(rows, workdir / "rows.parquet"),
        out=workdir / "out",
        model_path=str(tiny_model_dir),
        tools_yaml=workdir / "tools.yaml",
        reward_fn="rotation_reward_45",
        batch_size=4,
        response_length=512,
    )
    report = evaluate(options, lambda tokenizer: ScriptedEndpoint(tokenizer, scripted_by_word(tokenizer)))
    return report, options.out


def test_a_training_dump_is_rescored_through_verls_reward_manager(rescored_dump):
    report, out = rescored_dump
    rows = rows_of(out)
    assert [(row["index"], row["reward_before"], row["reward"], row["tokens_as_recorded"]) for row in rows] == [
        (index, RECORDED[index], ROTATION_180[index], True) for _step in (1, 2) for index in range(4)
    ]
    assert [row["mode"] for row in rows] == [None] * 8
    assert set(report["modes"]) == {"before", "rescored"}
    before, after = report["modes"]["before"][SOURCE], report["modes"]["rescored"][SOURCE]
    assert (before["rows"], before["reward_mean"], after["rows"], after["reward_mean"]) == (8, 0.5, 8, 0.6875)
    # both steps' trajectories of a row answer one prompt (same text and image, no uid): 4 prompts, 2 samples each
    assert (before["best_reward_mean"], after["best_reward_mean"]) == (0.5, 0.6875)
    assert {key: value for key, value in after.items() if "reward" not in key} == {
        key: value for key, value in before.items() if "reward" not in key
    }
    assert (after["masked"], after["stop_reasons"]["answered"], after["tools"]) == (
        2,
        6,
        {"rotate": {"calls_per_trajectory": 0.5, "error_rate": 0.0}},
    )
    assert (out / "report.txt").read_text().startswith(report["table"] + "\n")
    assert json.loads((out / "report.json").read_text()) == report
    assert report["bad_records"] == []


def test_rescoring_with_the_training_runs_own_settings_gives_back_its_rewards(sample_dump, tmp_path):
    # the dump's run: mm_turn_discount, gamma 0.9, rotation_reward_45; every input the manager reads was rebuilt
    out = tmp_path / "out"
    rescore_cli(str(sample_dump), "--reward-fn", "rotation_reward_45", "--override=+reward.reward_kwargs.gamma=0.9",
                "--out", str(out))  # fmt: skip
    records = [record_of(out, row) for row in rows_of(out)]
    assert len(records) == 8
    assert all(record["reward"] == record["reward_before"] for record in records)
    assert [record["reward"]["score"] for record in records] == [
        RECORDED[index] for _step in (1, 2) for index in range(4)
    ]


def test_the_copies_hold_both_scores_how_they_were_rescored_and_every_image(rescored_dump):
    _, out = rescored_dump
    guess = next(row for row in rows_of(out) if row["index"] == 1)
    record = record_of(out, guess)
    source = json.loads(open(guess["source"]).read())
    assert record["reward"]["score"] == 0.75
    assert record["reward_before"] == source["reward"]
    assert record["reward"]["turn_rewards"] == source["reward"]["turn_rewards"] == [0.0]
    extra = record["reward"]["extra"]
    assert (extra["raw_score"], extra["angle_error"], extra["predicted_angle"], extra["attempts"]) == (0.75, 45, 45, 1)
    assert record["rescored"] == {
        "reward_fn": "rotation_reward_180",
        "reward_manager": "mm_turn_discount",
        "overrides": [],
        "model_path": None,
        "source": guess["source"],
        "tokens_as_recorded": True,
    }
    copied = out / guess["record"]
    assert copied.parent.parent.name == "step_000001" and copied.parent.name == record["id"]
    for image in ("1.png", "1.thumb.jpg"):
        original = Path(guess["source"]).parent / "images" / image
        assert (copied.parent / "images" / image).read_bytes() == original.read_bytes()


def test_the_viewer_shows_both_scores_of_a_rescored_trajectory(rescored_dump, tmp_path):
    _, out = rescored_dump
    guess = next(row for row in rows_of(out) if row["index"] == 1)
    site = build_site(out / "trajectories", tmp_path / "site")
    html = site.pages[record_of(out, guess)["id"]].read_text()
    assert '<dd id="score">0.75</dd>' in html
    assert '<dd id="score-before">0</dd>' in html
    assert '<dd id="rescored">mm_turn_discount manager, rotation_reward_180</dd>' in html


def test_verls_naive_manager_scores_the_rebuilt_response_tokens(sample_dump, tmp_path, capsys):
    # naive decodes the whole rebuilt response (tool answers included) with the tokenizer, as in training
    out = tmp_path / "out"
    assert rescore_cli(str(sample_dump), "--reward-manager", "naive", "--reward-fn", "rotation_reward_180", "--out",
                       str(out)) == 0  # fmt: skip
    rows = rows_of(out)
    assert [row["reward"] for row in rows] == [ROTATION_180[index] for _step in (1, 2) for index in range(4)]
    masked = record_of(out, rows[3])["reward"]["extra"]
    assert (masked["score"], masked["reason"]) == (0.0, "no number in the response")
    stdout = capsys.readouterr().out
    assert stdout.endswith(
        f"rescored 8 trajectories; could not rescore 0 (listed in {out / 'report.json'}); trajectories: "
        f"verl-mm-tools view {out / 'trajectories'}\n"
    )
    assert stdout.startswith(json.loads((out / "report.json").read_text())["table"])


def dapo_score(score: float, response_tokens: int, max_resp_len: int = 180, buffer: int = 100) -> float:
    """verl's DAPO overlong penalty on a response of ``response_tokens``, in its own tensor arithmetic."""
    exceed = torch.tensor(response_tokens) - (max_resp_len - buffer)
    return float(score + min(-exceed / buffer * 1.0, 0))


def test_dapos_overlong_penalty_reads_the_rebuilt_response_lengths(sample_dump, tmp_path):
    out = tmp_path / "out"
    settings = [
        "--override=+reward.reward_kwargs.overlong_buffer_cfg={enable:true,len:100,penalty_factor:1.0,log:true}",
        "--override=+reward.reward_kwargs.max_resp_len=180",
    ]
    rescore_cli(str(sample_dump / "step_000001"), "--reward-manager", "dapo", "--reward-fn", "rotation_reward_180",
                *settings, "--out", str(out))  # fmt: skip
    rows = rows_of(out)
    assert [record_of(out, row)["mask"]["response_tokens"] for row in rows] == list(RESPONSE_TOKENS.values())
    assert [row["reward"] for row in rows] == [dapo_score(ROTATION_180[i], RESPONSE_TOKENS[i]) for i in range(4)]
    assert [row["reward"] for row in rows] == [0.040000021457672119, 0.75, 0.8700000047683716, 0.0]


def test_an_eval_output_is_rescored_into_evals_report(eval_out, tmp_path):
    eval_report, eval_dir = eval_out
    out = tmp_path / "out"
    report = rescore(RescoreOptions(records=(eval_dir,), out=out, reward_fn="rotation_reward_180"))
    assert list(report["modes"]) == ["tools before", "tools rescored"]
    # the recorded scores give back eval's own report, figure for figure
    assert report["modes"]["tools before"] == eval_report["modes"][TOOLS]
    after = report["modes"]["tools rescored"][SOURCE]
    rewards = list(ROTATION_180.values())
    mean = sum(rewards) / 4
    half = 1.96 * math.sqrt(sum((reward - mean) ** 2 for reward in rewards) / 3 / 4)
    assert (after["reward_mean"], after["reward_ci95"]) == (0.6875, [mean - half, mean + half])
    unchanged = {key: value for key, value in after.items() if not key.startswith("reward")}
    assert unchanged == {
        key: value for key, value in eval_report["modes"][TOOLS][SOURCE].items() if not key.startswith("reward")
    }
    eval_rows = [json.loads(line) for line in (eval_dir / TOOLS / "rows.jsonl").read_text().splitlines()]
    rows = rows_of(out)
    assert [row["reward_before"] for row in rows] == [row["reward"] for row in eval_rows] == list(RECORDED.values())
    assert [row["reward"] for row in rows] == rewards
    assert [(row["mode"], row["tokens_as_recorded"]) for row in rows] == [(TOOLS, True)] * 4
    assert [{key: row[key] for key in eval_rows[0] if key != "reward"} for row in rows] == [
        {key: row[key] for key in eval_rows[0] if key != "reward"} for row in eval_rows
    ]
    assert all(record_of(out, row)["step"] == 0 and record_of(out, row)["validate"] for row in rows)


def multi_sample_dump(model_dir, tokenizer, workdir: Path, loop_options: dict, **run_kwargs) -> Path:
    """A dump of one step of the four scripts exported as several samples per trajectory (``loop_options``), scored
    on the last as verl's v1 manager does."""
    from verl_mm_tools.step_hook.manager import step_batch
    from verl_mm_tools.step_hook.step import process_step

    (workdir / "tools.yaml").write_text(ROTATE_TOOLS_YAML)
    prompts, columns = sample_rows(WORDS)
    output, _, _ = LocalRollout(model_dir, workdir / "tools.yaml", workdir).run(
        scripted_by_word(tokenizer),
        prompts,
        columns=columns,
        per_sample=True,
        score=True,
        loop_options={**loop_options, "dump_dir": str(workdir / "dump")},
        extra=("trainer.use_v1=true", MANAGER_TQ_OVERRIDE, *hook_overrides(v1=True), *REWARD_OVERRIDES),
        **run_kwargs,
    )
    process_step(step_batch(output, {"global_steps": 1}))
    return workdir / "dump"


@pytest.fixture(scope="module")
def per_turn_dump(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    """The four scripts exported per turn (one sample per assistant turn) with a 100-token response budget, which
    cuts the double rotation's second call."""
    workdir = tmp_path_factory.mktemp("per_turn")
    return multi_sample_dump(tiny_model_dir, tiny_tokenizer, workdir, {"export": "per_turn"}, response_length=100)


def test_a_per_turn_dump_with_a_length_cut_turn_rescores_as_training_scored_it(per_turn_dump, tmp_path):
    rescore_cli(str(per_turn_dump), "--reward-fn", "rotation_reward_45", "--override=+reward.reward_kwargs.gamma=0.9",
                "--out", str(tmp_path / "own"))  # fmt: skip
    rows = rows_of(tmp_path / "own")
    records = [record_of(tmp_path / "own", row) for row in rows]
    assert [(record["stop_reason"], [sample["turns"] for sample in record["samples"]]) for record in records] == [
        ("length_limit", [[1], [2]]),
        ("answered", [[1]]),
        ("answered", [[1], [2]]),
        ("error", [[]]),
    ]
    assert [(row["reward_before"], row["reward"], row["tokens_as_recorded"]) for row in rows] == [
        (1.0, 1.0, True), (0.0, 0.0, True), (1.0, 1.0, True), (0.0, 0.0, True)
    ]  # fmt: skip
    # DAPO's overlong penalty reads the last sample's response, the one training scores
    last_sample_tokens = [record["samples"][-1]["response_tokens"] for record in records]
    assert last_sample_tokens == [20, 9, 9, 1]
    rescore_cli(str(per_turn_dump), "--reward-manager", "dapo", "--reward-fn", "rotation_reward_180",
                "--override=+reward.reward_kwargs.overlong_buffer_cfg={enable:true,len:100,penalty_factor:1.0,log:true}",
                "--override=+reward.reward_kwargs.max_resp_len=105", "--out", str(tmp_path / "dapo"))  # fmt: skip
    assert [row["reward"] for row in rows_of(tmp_path / "dapo")] == [
        dapo_score(score, tokens, max_resp_len=105) for score, tokens in zip([1.0, 0.75, 1.0, 0.0], last_sample_tokens)
    ]


@pytest.fixture(scope="module")
def windowed_dump(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    """The four scripts with keep_last_images=1 (export auto): the double rotation's turns 2 and 3 each see only the
    latest image, each a sample of its own."""
    workdir = tmp_path_factory.mktemp("windowed")
    return multi_sample_dump(tiny_model_dir, tiny_tokenizer, workdir, {"keep_last_images": 1})


def test_a_windowed_dump_rescores_with_each_samples_own_context(windowed_dump, tmp_path):
    rescore_cli(str(windowed_dump), "--reward-fn", "rotation_reward_45", "--out", str(tmp_path / "out"))
    rows = rows_of(tmp_path / "out")
    records = {row["index"]: record_of(tmp_path / "out", row) for row in rows}
    rotated = records[0]
    assert [(sample["turns"], sample["images"], sample["images_left_out"]) for sample in rotated["samples"]] == [
        ([1], 1, 0),
        ([2], 1, 1),
        ([3], 1, 2),
    ]
    assert len(rotated["images"]) == 3 and chat_image_ids(rotated["chat"]) == [1, 2, 3]  # the chat keeps them all
    # every sample rebuilt from the record (the window's notes in place of the earlier images) has its own counts
    assert [(row["index"], row["reward"], row["tokens_as_recorded"]) for row in rows] == [
        (0, 1.0, True), (1, 0.0, True), (2, 1.0, True), (3, 0.0, True)
    ]  # fmt: skip


def test_a_windowed_record_exports_to_sft_per_turn_only(windowed_dump, tmp_path):
    from verl_mm_tools.trajectories.sft import export_sft

    summary = export_sft([windowed_dump], tmp_path / "whole")
    reasons = [bad["reason"] for bad in summary["bad_records"]]
    assert len(reasons) == 1 and "export it with --per-turn" in reasons[0]
    summary = export_sft([windowed_dump], tmp_path / "turns", per_turn=True)
    assert summary["bad_records"] == []
    rows = pd.read_parquet(tmp_path / "turns" / "train.parquet")
    texts = [" ".join(message["content"] for message in row["messages"]) for _, row in rows.iterrows()]
    windowed = [text for text in texts if "(Image 1 is no longer shown.)" in text]
    assert len(windowed) == 2  # the double rotation's turns 2 and 3
    assert all(text.count("<image>") == 1 for text in windowed)
    assert "(Image 2 is no longer shown.)" in windowed[-1]


def broken_dump_copy(sample_dump, destination):
    """The dump with three of its step-1 records broken: truncated JSON, a newer version, no images folder."""
    shutil.copytree(sample_dump, destination, ignore=shutil.ignore_patterns("_site"))
    paths = {}
    for path in sorted((destination / "step_000001").glob(f"*/{RECORD_FILE}")):
        paths[json.loads(path.read_text())["sample"]["index"]] = path
    paths[0].write_text(paths[0].read_text()[:200])
    paths[1].write_text(json.dumps({**json.loads(paths[1].read_text()), "version": 99}))
    shutil.rmtree(paths[2].parent / "images")
    return paths


def test_bad_records_are_listed_with_their_file_and_the_good_ones_rescored(sample_dump, tmp_path, caplog):
    paths = broken_dump_copy(sample_dump, tmp_path / "dump")
    out = tmp_path / "out"
    report = rescore(RescoreOptions(records=(tmp_path / "dump",), out=out, reward_fn="rotation_reward_180"))
    assert [(row["index"], row["reward"]) for row in rows_of(out)] == [(3, 0.0), *ROTATION_180.items()]
    bad = {entry["path"]: entry["reason"] for entry in report["bad_records"]}
    assert sorted(bad) == sorted(str(paths[index]) for index in (0, 1, 2))
    assert bad[str(paths[0])].startswith(f"{paths[0]}: not a readable JSON record (")
    assert bad[str(paths[1])] == (
        f"{paths[1]}: record version 99; this verl-mm-tools reads versions 1 to {RECORD_VERSION}: upgrade "
        "verl-mm-tools to read newer records"
    )
    assert bad[str(paths[2])] == f"{paths[2]}: image 1's file {paths[2].parent / 'images' / '1.png'} is missing"
    assert (
        (out / "report.txt").read_text().endswith("left out 3:\n" + "".join(f"  {reason}\n" for reason in bad.values()))
    )
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert [f"rescore: left out {reason}" for reason in bad.values()] == [
        message for message in warnings if message.startswith("rescore: left out")
    ]


def test_with_no_record_left_the_error_names_each_reason(sample_dump, tmp_path):
    broken = [path for index, path in broken_dump_copy(sample_dump, tmp_path / "dump").items() if index < 3]
    reasons = r"^no record could be rescored: (?=.*record version 99; )(?=.*is missing)"  # in any order
    with pytest.raises(ConfigError, match=reasons) as info:
        rescore(RescoreOptions(records=tuple(broken), out=tmp_path / "out", reward_fn="rotation_reward_180"))
    assert all(str(path) in str(info.value) for path in broken)


def test_what_cannot_be_rescored_is_refused_with_what_to_do(sample_dump, tmp_path):
    with pytest.raises(ConfigError, match=r"registered: \[.*'naive'.*\]\. Did you mean 'naive'\?"):
        rescore_cli(str(sample_dump), "--reward-manager", "naiv", "--out", str(tmp_path / "a"))
    with pytest.raises(ConfigError, match=r"unknown reward function 'rotation_reward_9'; built-in ones are"):
        rescore_cli(str(sample_dump), "--reward-fn", "rotation_reward_9", "--out", str(tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"rescore needs something to score with: --reward-fn NAME"):
        rescore_cli(str(sample_dump), "--out", str(tmp_path / "c"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"is not empty and not a rescore output; pass an empty or new folder"):
        rescore_cli(str(sample_dump), "--reward-fn", "rotation_reward_180", "--out", str(tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match=r"holds the record .* being rescored; write to another folder"):
        rescore_cli(str(sample_dump), "--reward-fn", "rotation_reward_180", "--out", str(sample_dump.parent))


def test_parsing_the_command_imports_nothing_heavy():
    code = (
        "import argparse, json, sys\n"
        "from verl_mm_tools.trajectories.rescore_command import add_rescore_command\n"
        "parser = argparse.ArgumentParser()\n"
        "add_rescore_command(parser.add_subparsers())\n"
        "parser.parse_args(['rescore', 'dump', '--reward-fn', 'exact_answer_reward', '--out', 'out'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('verl', 'torch', 'transformers'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_video_record_rescores_with_its_videos_placeholders_rebuilt(family, tmp_path):
    """A prompt video (4 s at 10 fps, sampled at 1 fps) and get_frames: the record's chat says where the video was
    (version 8), and rescore rebuilds its placeholders from the recorded frames' count, size and times, reading no
    video file: Qwen2.5-VL's grid, Qwen3-VL's timestamps too ("<0.6 seconds>" for the frames at 0 and 1.3 s)."""
    import numpy as np

    from verl_mm_tools.record import chat_video_ids
    from verl_mm_tools.runtime.scripted_client import tool_call_text
    from verl_mm_tools.step_hook.manager import step_batch
    from verl_mm_tools.step_hook.step import process_step
    from verl_mm_tools.tiny import tiny_model_path
    from verl_mm_tools.tools.video_tools import GetFramesTool
    from verl_mm_tools.video import write_video

    root = tmp_path / "videos"
    write_video(root / "clip.mp4", [np.full((56, 84, 3), 90, np.uint8)] * 40, 10)
    video = {"type": "video", "video": "clip.mp4", "fps": 1.0}
    prompt = [{"role": "user", "content": [video, {"type": "text", "text": "Which colour?"}]}]
    turns = [tool_call_text("get_frames", video_id=1, start_s=2.0, end_s=2.1, n=2), "<answer>red</answer>"]
    columns = {
        "data_source": ["verl_mm_tools/video_flash"],
        "reward_model": [{"style": "rule", "ground_truth": "red"}],
        "extra_info": [{"index": 0}],
        "index": [0],
    }
    reward = ("reward.reward_manager.name=mm_turn_discount", "+reward.reward_kwargs.reward_fn=exact_answer_reward")
    output, _, _ = LocalRollout(tiny_model_path(family=family), None, tmp_path).run(
        turns,
        [prompt],
        columns=columns,
        tools=[GetFramesTool()],
        score=True,
        per_sample=True,
        loop_options={"file_roots": [str(root)], "dump_dir": str(tmp_path / "dump")},
        prompt_length=1024,
        response_length=1024,
        extra=("trainer.use_v1=true", MANAGER_TQ_OVERRIDE, *hook_overrides(v1=True), *reward),
    )
    process_step(step_batch(output, {"global_steps": 1}))
    (root / "clip.mp4").unlink()  # rescore reads no video file
    rescore_cli(str(tmp_path / "dump"), "--reward-fn", "exact_answer_reward", "--out", str(tmp_path / "out"))
    [row] = rows_of(tmp_path / "out")
    record = record_of(tmp_path / "out", row)
    assert (record["version"], chat_video_ids(record["chat"]), record["videos"][0]["times_s"]) == (
        RECORD_VERSION,
        [1],
        [0.0, 1.3, 2.6, 3.9],
    )
    assert (row["reward_before"], row["reward"], row["tokens_as_recorded"]) == (1.0, 1.0, True)
