"""``get_frames`` (``tools.video_tools``) through the mm_tool loop: verl's AgentLoopWorker, the tiny Qwen2.5-VL, a real
MP4 file in the prompt, the frames shown to the model as images."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tools.video_tools import GetFramesTool
from verl_mm_tools.video import write_video

GREY, RED = (120, 120, 120), (220, 20, 20)
ANSWER = "<answer>red</answer>"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """4 s at 10 fps, 84 x 56 px; frames 23 and 24 (2.3-2.5 s) red, the others grey."""
    root = tmp_path_factory.mktemp("videos")
    frames = [np.full((56, 84, 3), RED if index in (23, 24) else GREY, np.uint8) for index in range(40)]
    write_video(root / "flash.mp4", frames, 10)
    return root


def _rollout(model_dir, workdir, root, calls: list[dict], video: dict | None = None, **tool_config):
    video = video or {"video": "flash.mp4", "fps": 1.0}
    prompt = [{"role": "user", "content": [{"type": "video", **video}, {"type": "text", "text": "Which colour?"}]}]
    turns = [tool_call_text("get_frames", **arguments) for arguments in calls] + [ANSWER]
    output, client, worker = LocalRollout(model_dir, None, workdir).run(
        turns,
        [prompt],
        columns={"extra_info": [{"index": 0}]},
        tools=[GetFramesTool(tool_config)],
        loop_options={"file_roots": [str(root)]},
        prompt_length=1024,
        response_length=1024,
    )
    return output, client, worker


def _tool_texts(output, worker) -> list[str]:
    text = worker.tokenizer.decode(output.batch["responses"][0], skip_special_tokens=False)
    return [part.split("<|im_end|>")[0].strip() for part in text.split("<|im_start|>user\n")[1:]]


def _colour(image: Image.Image) -> str:
    red, green, _ = image.getpixel((image.width // 2, image.height // 2))
    return "red" if red - green > 100 else "grey"


def test_frames_of_a_window_come_back_as_images_the_model_sees(tiny_model_dir, root, tmp_path):
    calls = [
        {"video_id": 1, "start_s": 2.2, "end_s": 2.5, "n": 4},
        {"video_id": 2, "start_s": 0, "end_s": 1},
        {"video_id": 1, "start_s": 5, "end_s": 6},
    ]
    output, client, worker = _rollout(tiny_model_dir, tmp_path, root, calls)
    pads = "<|vision_start|>" + "<|image_pad|>" * 6 + "<|vision_end|>"  # 84 x 56 px: 3 x 2 tokens
    assert _tool_texts(output, worker) == [
        "<tool_response>\n"
        + pads * 4
        + "Image 1: Video 1 at 2.20 s. Image 2: Video 1 at 2.30 s. Image 3: Video 1 at 2.40 s. Image 4: Video 1 at "
        "2.50 s. (84x56 px)" + "\n</tool_response>",
        "<tool_response>\nError from get_frames: video_id must be between 1 and 1, got 2\n</tool_response>",
        "<tool_response>\nError from get_frames: start_s must be at least 0 and less than the video's 4 s, got 5"
        "\n</tool_response>",
    ]
    frames = client.requests[1]["images"]  # the second turn's request: the four frames (the video goes apart)
    assert [(image.size, _colour(image)) for image in frames] == [
        ((84, 56), "grey"),
        ((84, 56), "red"),
        ((84, 56), "red"),
        ((84, 56), "grey"),
    ]
    assert output.non_tensor_batch["mm_tool/images"][0] == 4
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0
    # the training sample carries the video's frames and its four images' pixels (compact, expanded by the trainer):
    # before, a video's pixel_values_videos key hid that the images' pixels were missing, and they were dropped
    sample = expanded_inputs(output.non_tensor_batch["multi_modal_inputs"][0])
    assert sample["image_grid_thw"].tolist() == [[1, 4, 6]] * 4
    assert tuple(sample["pixel_values"].shape) == (4 * 24, 1176)
    assert sample["video_grid_thw"].tolist() == [[2, 12, 18]]
    assert tuple(sample["pixel_values_videos"].shape) == (432, 1176)
    verls = worker.processor(
        images=frames, text=["<|vision_start|><|image_pad|><|vision_end|>" * 4], return_tensors="pt"
    )
    assert torch.equal(sample["pixel_values"], verls["pixel_values"])


def test_frames_given_as_images_are_timed_by_their_sample_fps(tiny_model_dir, root, tmp_path):
    frames = [Image.new("RGB", (56, 56), RED if index == 3 else GREY) for index in range(4)]
    video = {"video": frames, "sample_fps": 2.0}  # 2 s: frame 3 at 1.5 s
    output, client, _ = _rollout(
        tiny_model_dir, tmp_path, root, [{"video_id": 1, "start_s": 1.0, "end_s": 1.5, "n": 2}], video=video
    )
    assert [_colour(image) for image in client.requests[1]["images"]] == ["grey", "red"]


def test_n_is_bounded_by_the_config():
    tool = GetFramesTool({"max_frames": 2})
    assert tool.settings.max_frames == 2
    with pytest.raises(ConfigError, match="max_frames must be between 1 and 32, got 64"):
        GetFramesTool({"max_frames": 64})


def test_check_tool_passes_get_frames_on_its_probe_video():
    from verl_mm_tools.tools import check_tool

    lines = str(check_tool(GetFramesTool())).splitlines()  # a ToolCheckError would list every check that failed
    assert lines[0] == "tool 'get_frames': 50 checks passed"
    assert "  ok  bad input answered as text: no video in the conversation" in lines
    assert "  ok  bad input answered as text: video_id 99 of 1 video" in lines


def test_the_dump_keeps_the_prompts_video_and_the_viewer_shows_it(tiny_model_dir, root, tmp_path):
    """Record version 8: the prompt's video as the model saw it (its file, the times of the frames sampled, their
    size after the resize), named by the message that holds it and placed in the rendered conversation; read back as
    checked, and shown by the viewer."""
    from verl_mm_tools.record import STAGED_RECORD_FILE, STAGING_DIR
    from verl_mm_tools.runtime.config import CLASSIC_HOOK
    from verl_mm_tools.trajectories.read import read_checked
    from verl_mm_tools.viewer.html import trajectory_page

    prompt = [
        {
            "role": "user",
            "content": [{"type": "video", "video": "flash.mp4", "fps": 1.0}, {"type": "text", "text": "?"}],
        }
    ]
    turns = [tool_call_text("get_frames", video_id=1, start_s=2.3, end_s=2.4, n=2), ANSWER]
    dump_dir = tmp_path / "dump"
    LocalRollout(tiny_model_dir, None, tmp_path).run(
        turns,
        [prompt],
        columns={"extra_info": [{"index": 0}]},
        tools=[GetFramesTool()],
        loop_options={"file_roots": [str(root)], "dump_dir": str(dump_dir)},
        prompt_length=1024,
        response_length=1024,
        extra=CLASSIC_HOOK,
    )
    [staged] = (dump_dir / STAGING_DIR).glob(f"*/{STAGED_RECORD_FILE}")
    record = read_checked(staged).record
    assert record["version"] == 9
    chat_parts = [part for message in record["chat"]["messages"] if isinstance(message["content"], list)
                  for part in message["content"]]  # fmt: skip
    assert [part for part in chat_parts if part["type"] != "text"][:2] == [
        {"type": "video", "video_id": 1},
        {"type": "image", "image_id": 1},
    ]
    times = [0.0, 1.3, 2.6, 3.9]  # frames 0, 13, 26 and 39 at 10 fps
    strip = [{"time_s": time, "thumb": f"videos/1_{position + 1}.thumb.jpg"} for position, time in enumerate(times)]
    assert record["videos"] == [
        {
            "id": 1,
            "source": "prompt",
            "turn": 0,
            "path": str(root / "flash.mp4"),
            "times_s": times,
            "width": 252,
            "height": 168,
            "strip": strip,
        }
    ]
    with Image.open(staged.parent / "videos/1_3.thumb.jpg") as frame:  # 2.6 s: grey (the flash is at 2.3-2.5 s)
        assert (frame.format, _colour(frame.convert("RGB"))) == ("JPEG", "grey")
    assert [(message["role"], message.get("video_ids")) for message in record["messages"][:1]] == [("user", [1])]
    assert [image["source"] for image in record["images"]] == ["tool", "tool"]
    html = trajectory_page(record, "files", "index.html", (None, None))
    assert f"Video 1: 4 frames at 0, 1.3, 2.6, 3.9 s (252x168 px), from {root / 'flash.mp4'}" in html
    assert '<img src="files/videos/1_2.thumb.jpg" alt="Video 1 at 1.3 s" title="1.3 s">' in html


def test_a_record_whose_videos_do_not_add_up_is_refused(tmp_path):
    from verl_mm_tools.record import RecordError
    from verl_mm_tools.trajectories.read import read_checked

    base = {"format": "verl-mm-tools/trajectory", "version": 8, "id": "a1", "images": []}
    video = {"id": 1, "source": "prompt", "turn": 0, "path": None, "times_s": [0.0], "width": 4, "height": 4}
    cases = {
        "a video id past the videos": (
            {"videos": [video], "messages": [{"role": "user", "turn": 0, "text": "", "video_ids": [2]}]},
            "field messages[0].video_ids[0] must be a video id from 1 to 1, found 2",
        ),
        "times that are no numbers": (
            {"videos": [{**video, "times_s": ["soon"]}], "messages": []},
            "field videos[0].times_s[0] must be",
        ),
        "a chat video past the videos": (
            {
                "videos": [video],
                "messages": [],
                "chat": {"messages": [{"role": "user", "content": [{"type": "video", "video_id": 2}]}]},
            },
            "field chat.messages[0].content[0].video_id must be a video id from 1 to 1, found 2",
        ),
        "videos out of order": ({"videos": [{**video, "id": 2}], "messages": []}, "field videos[0].id must be 1"),
        "a strip frame outside the folder": (
            {"videos": [{**video, "strip": [{"time_s": 0.0, "thumb": "../../secret.jpg"}]}], "messages": []},
            "names the file '../../secret.jpg', outside its folder; not read",
        ),
    }
    for name, (fields, message) in cases.items():
        path = tmp_path / name / "trajectory.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**base, **fields}))
        with pytest.raises(RecordError, match=re.escape(message)):
            read_checked(path)


def test_rescore_refuses_a_recorded_video_frame_larger_than_any_shown(tmp_path):
    """A record's video size is untrusted: rescore builds frames of it, so a size no frame the loop shows can have
    (over 2560 x 1440 px) is refused before anything is allocated."""
    from verl_mm_tools.record import RecordError
    from verl_mm_tools.trajectories.read import LoadedRecord
    from verl_mm_tools.trajectories.rescore_input import RecordedVideo, recorded_videos

    video = {"id": 1, "times_s": [0.0, 1.0], "width": 252, "height": 168}
    chat = {"messages": [{"role": "user", "content": [{"type": "video", "video_id": 1}]}]}
    record = {"videos": [video], "chat": chat}
    assert recorded_videos(LoadedRecord(record, tmp_path / "t.json")) == [RecordedVideo((0.0, 1.0), 252, 168)]
    huge = {**record, "videos": [{**video, "width": 100_000, "height": 100_000}]}
    with pytest.raises(RecordError, match="frames are 100000x100000 px, more than the 3686400 px"):
        recorded_videos(LoadedRecord(huge, tmp_path / "t.json"))
