"""The video task's data (``make-data video``): real MP4 clips whose colour flash falls between the frames the prompt
samples, read by verl's RLHFDataset, and found by ``get_frames`` through the mm_tool loop and scored by verl's reward
worker."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from omegaconf import OmegaConf

from verl_mm_tools.cli import main
from verl_mm_tools.data.video import COLORS, FLASH_FRAMES, PROMPT_FPS, prompt_frame_indices
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.runtime.config import CLASSIC_HOOK
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tools.video_tools import GetFramesTool
from verl_mm_tools.video import decode_frames


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("video")
    assert main(["make-data", "video", "--out", str(out), "--train-size", "4", "--val-size", "2"]) == 0
    return out, pd.read_parquet(out / "train.parquet")


def _colour(pixel) -> str:
    for name, value in COLORS.items():
        if all(abs(int(a) - b) < 40 for a, b in zip(pixel, value, strict=True)):
            return name
    return "none"


def test_each_flash_falls_between_the_frames_the_prompt_samples(written):
    out, train = written
    assert [row["ground_truth"] for row in train["reward_model"]] == ["blue", "red", "blue", "red"]
    assert prompt_frame_indices(40) == [0, 13, 26, 39]  # 4 s at 10 fps, sampled at 1 fps
    for row, video, info in zip(train["reward_model"], train["videos"], train["extra_info"], strict=True):
        assert dict(video[0]) == {"video": f"videos/train_{info['index']:04d}.mp4", "fps": PROMPT_FPS}
        first, last = info["flash_frames"]
        assert last - first + 1 == FLASH_FRAMES and info["flash_s"] == first / 10
        frames = decode_frames(out / video[0]["video"], [*prompt_frame_indices(40), first, last])
        assert [_colour(frame[5, 5]) for frame in frames] == ["none"] * 4 + [row["ground_truth"]] * 2


def test_verls_dataset_puts_the_clip_in_the_prompt(written, tiny_tokenizer, tiny_processor):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    out, _ = written
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "video_key": "videos",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "cache_dir": str(out / "cache"),
        }
    )
    item = RLHFDataset(str(out / "train.parquet"), tiny_tokenizer, config, tiny_processor)[0]
    content = item["raw_prompt"][0]["content"]
    assert content[0] == {"type": "video", "video": "videos/train_0000.mp4", "fps": 1.0}
    assert content[1]["type"] == "text" and content[1]["text"].startswith("For a moment, at about")


def test_get_frames_at_the_flash_shows_the_answer_and_scores_it(written, tiny_model_dir, tiny_tokenizer, tmp_path):
    """A script that calls get_frames at the moment the prompt names, then answers the colour it was shown: every
    row scores 1.0 through verl's reward worker (exact_answer_reward); the prompt's own frames show no colour."""
    out, train = written

    def script(turn, prompt_ids, images):
        if turn == 0:
            at = float(re.search(r"at about ([0-9.]+) s", tiny_tokenizer.decode(prompt_ids)).group(1))
            return tool_call_text("get_frames", video_id=1, start_s=at, end_s=at + 0.1, n=2)
        seen = {_colour(image.getpixel((5, 5))) for image in images} - {"none"}
        return f"<answer>{seen.pop() if len(seen) == 1 else 'none'}</answer>"

    rows = [row._asdict() for row in train.itertuples()]
    prompts = [
        [
            {
                "role": "user",
                "content": [
                    {"type": "video", **dict(row["videos"][0])},
                    {"type": "text", "text": row["prompt"][0]["content"].removeprefix("<video>")},
                ],
            }
        ]
        for row in rows
    ]
    output, client, _ = LocalRollout(tiny_model_dir, None, tmp_path).run(
        script,
        prompts,
        columns={key: [row[key] for row in rows] for key in ("data_source", "reward_model", "extra_info")},
        tools=[GetFramesTool()],
        loop_options={"file_roots": [str(out)]},
        prompt_length=1024,
        response_length=1024,
        score=True,
        extra=(*CLASSIC_HOOK, "reward.reward_manager.name=mm_turn_discount"),
    )
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0, 1.0, 1.0]
    # the server sees the trajectories' turns in any order: 4 first turns without images, 4 second with the 2 frames
    assert sorted(len(request["images"]) for request in client.requests) == [0] * 4 + [2] * 4


def test_bad_sizes_are_refused(tmp_path):
    from verl_mm_tools.data.video import write_video_dataset

    with pytest.raises(ConfigError, match="sizes must be >= 1, got train_size=0"):
        write_video_dataset(tmp_path, train_size=0)
    with pytest.raises(ConfigError, match="--seconds must be between 2 and 60, got 90"):
        write_video_dataset(tmp_path, seconds=90)


def test_the_demos_clips_flash_at_its_fixed_moment_and_a_moment_the_prompt_samples_is_refused(tmp_path):
    import random

    from verl_mm_tools.data.video import DEMO_FLASH_FRAME, flash_clip, write_video_dataset

    train, _ = write_video_dataset(tmp_path, train_size=2, val_size=1, first_flash_frame=DEMO_FLASH_FRAME)
    rows = pd.read_parquet(train)
    assert [info["flash_frames"].tolist() for info in rows["extra_info"]] == [[20, 21], [20, 21]]
    assert "at about 2.0 s" in rows["prompt"][0][0]["content"]
    with pytest.raises(ConfigError, match=r"a flash at frame 12 of a 4 s clip would show in a frame the prompt"):
        flash_clip(random.Random(0), "red", first_flash_frame=12)
