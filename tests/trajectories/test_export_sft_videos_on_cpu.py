"""export-sft of trajectories whose prompt holds a video (issue #61): real MP4 clips through the mm_tool loop (verl's
AgentLoopWorker, the tiny Qwen2.5-VL and Qwen3-VL, scripted turns, one calling get_frames), dumped, exported with
--video-root and read back by verl's own MultiTurnSFTDataset (with this package's fix, sft_video_sampling), which must
rebuild exactly the tokens, positions and video pixels the loop trained on. Untrusted records: a path outside the
root, a missing file, a changed file, a forged size are each skipped and counted, never read outside the root."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from verl_mm_tools.cli import main
from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RECORD_FILE
from verl_mm_tools.runtime.batch import unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout, run_steps
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.tools.tool_yaml import GET_FRAMES_TOOLS_YAML
from verl_mm_tools.trajectories import sft_videos
from verl_mm_tools.trajectories.sft import TRAIN_FILE, export_sft
from verl_mm_tools.video import write_video

from .test_export_sft_on_cpu import sft_expectation

pytestmark = pytest.mark.integration  # the tiny models

SCRIPTS = {
    "look": [tool_call_text("get_frames", video_id=1, start_s=1.0, end_s=2.0, n=2), "<answer>red</answer><|im_end|>"],
    "plain": ["<answer>red</answer><|im_end|>"],
}
VIDEOS = {"look": {"video": "clip.mp4", "fps": 1.0}, "plain": {"video": "clip.mp4", "nframes": 6, "video_start": 1.0}}


def clip_frames(count: int = 40) -> list[np.ndarray]:
    """84 x 56 px frames whose green channel rises: every frame differs."""
    return [np.full((56, 84, 3), (200, 20 + 5 * index, 20), np.uint8) for index in range(count)]


def _script(tokenizer):
    def script(turn, prompt_ids, images):
        question = tokenizer.decode(prompt_ids).split("<|im_start|>user\n", 1)[1]
        return SCRIPTS[next(word for word in SCRIPTS if f"{word}:" in question)][turn]

    return script


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def video_dump(request, tiny_model_dir, tmp_path_factory):
    """A 4 s clip at 10 fps under a root; two prompts on it ("look" calls get_frames, "plain" samples 6 frames from
    1 s), dumped at step 1: (family, model, root, dump folder, the generated batch)."""
    family = request.param
    model_dir = str(tiny_model_dir if family == "qwen2_5_vl" else tiny_model_path(family="qwen3_vl"))
    workdir = tmp_path_factory.mktemp(family)
    write_video(workdir / "videos" / "clip.mp4", clip_frames(), 10)
    (workdir / "tools.yaml").write_text(GET_FRAMES_TOOLS_YAML)
    prompts = [
        [{"role": "user", "content": [{"type": "video", **video}, {"type": "text", "text": f"{word}: which colour?"}]}]
        for word, video in VIDEOS.items()
    ]
    columns = {
        "data_source": ["verl_mm_tools/rotation"] * 2,
        "reward_model": [{"style": "rule", "ground_truth": "90"}] * 2,
        "extra_info": [{"index": index} for index in range(2)],
        "index": [0, 1],
    }
    options = {"dump_dir": str(workdir / "dump"), "file_roots": [str(workdir / "videos")]}
    rollout = LocalRollout(model_dir, workdir / "tools.yaml", workdir)
    (output,), _ = run_steps(rollout, _script, prompts, columns, steps=(1,), loop_options=options)
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0, 0]
    return family, model_dir, workdir / "videos", workdir / "dump", output


def sft_dataset(parquet, model_dir):
    """verl's dataset as verl's SFT trainer makes it: the processor from verl's hf_processor (the model's
    get_rope_index bound to it)."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from verl.utils.tokenizer.tokenizer import hf_processor

    processor = hf_processor(model_dir)
    return MultiTurnSFTDataset(
        str(parquet), processor.tokenizer, {"pad_mode": "no_padding", "max_length": 4096}, processor
    )


def indices(parquet) -> list[int]:
    return [json.loads(open(path).read())["sample"]["index"] for path in pd.read_parquet(parquet)["source"]]


def loop_positions(output, index: int) -> torch.Tensor:
    kept = output.batch["attention_mask"][index].bool()
    return output.batch["position_ids"][index][..., kept]


# the loop's video inputs: (video_grid_thw of "look", of "plain"), and second_per_grid_ts (Qwen2.5-VL only)
EXPECTED = {
    "qwen2_5_vl": ([[2, 12, 18]], [[3, 12, 18]], [2.0]),
    "qwen3_vl": ([[2, 6, 8]], [[3, 4, 6]], None),
}


def test_verls_sft_dataset_rebuilds_the_loops_video_rows_exactly(video_dump, tmp_path):
    family, model_dir, root, dump_dir, output = video_dump
    summary = export_sft([dump_dir], tmp_path / "sft", video_root=root)
    assert (summary["rows"], summary["records"], summary["videos"], summary["skipped"]) == (2, 2, 2, {})
    assert "data.video_key=videos" in summary["verl_overrides"]
    rows = pd.read_parquet(tmp_path / "sft" / TRAIN_FILE)
    by_index = dict(zip(indices(tmp_path / "sft" / TRAIN_FILE), rows["videos"], strict=True))
    real = str((root / "clip.mp4").resolve())
    # 1 fps over 4 s: frames 0, 13, 26, 39; 6 frames from 1 s: 10 .. 39 (the range a quarter frame wider)
    assert [dict(entry) for entry in by_index[0]] == [
        {"video": real, "nframes": 4, "video_start": 0.0, "video_end": 3.925}
    ]
    assert [dict(entry) for entry in by_index[1]] == [
        {"video": real, "nframes": 6, "video_start": 0.975, "video_end": 3.925}
    ]
    dataset = sft_dataset(tmp_path / "sft" / TRAIN_FILE, model_dir)
    grids = {}
    for position, index in enumerate(indices(tmp_path / "sft" / TRAIN_FILE)):
        item, loop_row = dataset[position], unpadded_row(output, index)
        ids, mask = sft_expectation(loop_row, dataset.tokenizer)
        assert item["input_ids"].tolist() == ids
        assert item["loss_mask"].tolist() == mask
        # M-RoPE (text row and the video's temporal, height, width rows), up to the newline verl adds at the end
        assert torch.equal(item["position_ids"][:, :-1], loop_positions(output, index))
        loop_inputs = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][index])
        ours = item["multi_modal_inputs"]
        assert torch.equal(ours["video_grid_thw"], loop_inputs["video_grid_thw"])
        assert torch.equal(ours["pixel_values_videos"], loop_inputs["pixel_values_videos"])
        for key in ("second_per_grid_ts", "image_grid_thw", "pixel_values"):
            assert (key in ours) == (key in loop_inputs)
            assert key not in ours or torch.equal(ours[key], loop_inputs[key])
        grids[index] = ours["video_grid_thw"].tolist(), ours.get("second_per_grid_ts")
    look, plain, seconds = EXPECTED[family]
    assert (grids[0][0], grids[1][0]) == (look, plain)
    assert grids[0][1] is None if seconds is None else grids[0][1].tolist() == seconds


def test_qwen3_vl_rows_carry_the_loops_timestamps(video_dump, tmp_path):
    family, model_dir, root, dump_dir, _ = video_dump
    if family != "qwen3_vl":
        pytest.skip("Qwen3-VL's template writes each frame's time")
    export_sft([dump_dir], tmp_path / "sft", video_root=root)
    dataset = sft_dataset(tmp_path / "sft" / TRAIN_FILE, model_dir)
    plain = indices(tmp_path / "sft" / TRAIN_FILE).index(1)
    text = dataset.tokenizer.decode(dataset[plain]["input_ids"])
    # frames 10, 16 | 22, 27 | 33, 39 at 10 fps, two a temporal patch: the mean time of each pair
    assert [part.split(" seconds>")[0] for part in text.split("<")[1:] if " seconds>" in part] == ["1.3", "2.5", "3.6"]


def test_verls_own_sft_dataset_renders_the_videos_at_its_default_sampling(video_dump, tmp_path, monkeypatch):
    """The fix's proof: without it verl's dataset renders the video at transformers' default (24 fps without
    metadata): Qwen2.5-VL's second_per_grid_ts and so its temporal positions differ; Qwen3-VL's per-frame runs
    make verl's own get_rope_index fail."""
    import verl.utils.dataset.multiturn_sft_dataset as module

    family, model_dir, root, dump_dir, output = video_dump
    export_sft([dump_dir], tmp_path / "sft", video_root=root)
    for name in ("process_video", "get_rope_index"):
        monkeypatch.setattr(module, name, getattr(module, name).__wrapped__)
    for name in ("_process_single_message", "sanity_check"):
        monkeypatch.setattr(module.MultiTurnSFTDataset, name, getattr(module.MultiTurnSFTDataset, name).__wrapped__)
    dataset = sft_dataset(tmp_path / "sft" / TRAIN_FILE, model_dir)
    look = indices(tmp_path / "sft" / TRAIN_FILE).index(0)
    if family == "qwen3_vl":
        with pytest.raises(IndexError):
            dataset[look]
        return
    item = dataset[look]
    assert item["multi_modal_inputs"]["second_per_grid_ts"].tolist() == pytest.approx([2 / 24])
    assert not torch.equal(item["position_ids"][:, :-1], loop_positions(output, 0))


def video_copy(dump_dir, target, **change):
    """The dump copied, each record's video changed so and its id made the copy's own."""
    shutil.copytree(dump_dir, target)
    for path in sorted(target.rglob(RECORD_FILE)):
        record = json.loads(path.read_text())
        record["videos"][0].update(change)
        record["id"] = f"{record['id']}-{target.name}"
        path.write_text(json.dumps(record))


def test_untrusted_video_records_are_skipped_with_their_reason_never_read_outside_the_root(video_dump, tmp_path):
    family, _, root, dump_dir, _ = video_dump
    if family != "qwen2_5_vl":
        pytest.skip("the checks are the family's processor's only for the size")
    outside = tmp_path / "outside"
    write_video(outside / "clip.mp4", clip_frames(), 10)
    own = tmp_path / "root"
    shutil.copytree(root, own)
    write_video(own / "changed.mp4", clip_frames(30), 10)  # 3 s: other frames at the same keys
    os.symlink(outside / "clip.mp4", own / "link.mp4")
    forged = {
        "outside": {"path": str(outside / "clip.mp4")},
        "link": {"path": str(own / "link.mp4")},
        "missing": {"path": str(own / "gone.mp4")},
        "changed": {"path": str(own / "changed.mp4")},
        "size": {"path": str(own / "clip.mp4"), "width": 4000, "height": 28},
        "frames": {"path": str(own / "clip.mp4"), "times_s": [5.0, 9.0]},  # after the clip's end
        "as_frames": {"path": None},
    }
    for name, change in forged.items():
        video_copy(dump_dir, tmp_path / "dumps" / name, **change)
    with pytest.raises(ConfigError, match="no SFT row to write"):
        export_sft([tmp_path / "dumps"], tmp_path / "none", video_root=own)
    video_copy(dump_dir, tmp_path / "dumps" / "good", path=str(own / "clip.mp4"))
    summary = export_sft([tmp_path / "dumps"], tmp_path / "sft", video_root=own)
    assert summary["rows"] == 2
    assert summary["skipped"] == {
        sft_videos.OUTSIDE: 4,  # the file outside and the link to it, each in both records
        sft_videos.MISSING: 2,
        sft_videos.OTHER_TIMES: 2,
        sft_videos.OTHER_SIZE: 2,
        sft_videos.BAD_SAMPLING: 2,
        sft_videos.AS_FRAMES: 2,
    }


def test_without_video_root_video_records_are_skipped_naming_the_option(video_dump, tmp_path, capsys):
    family, _, root, dump_dir, _ = video_dump
    if family != "qwen2_5_vl":
        pytest.skip("the option is the family's and the command's")
    with pytest.raises(ConfigError, match=r"no SFT row to write from .*: 2 its prompt holds videos: give --video-root"):
        export_sft([dump_dir], tmp_path / "none")
    with pytest.raises(ConfigError, match="--video-root '.*' is not an existing folder"):
        export_sft([dump_dir], tmp_path / "none", video_root=tmp_path / "nowhere")
    assert main(["export-sft", str(dump_dir), "--out", str(tmp_path / "sft"), "--video-root", str(root)]) == 0
    assert "wrote 2 rows from 2 trajectories" in capsys.readouterr().out
