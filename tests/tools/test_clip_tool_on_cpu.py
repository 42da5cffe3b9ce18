"""``clip`` (``tools.video_tools.ClipTool``) on its own: the window it samples, the video form it returns, bad calls
answered as text, ``check_tool``. Through the mm_tool loop: ``tests/agent_loop/test_tool_videos_on_cpu.py``."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest
import torch

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.files import STATE_ATTR
from verl_mm_tools.tools.video_tools import ClipTool
from verl_mm_tools.video import VideoSource, write_video

GREY, RED = (120, 120, 120), (220, 20, 20)


@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    """4 s at 10 fps, 84 x 56 px; frames 23 and 24 (2.3-2.5 s) red, the others grey."""
    path = tmp_path_factory.mktemp("videos") / "flash.mp4"
    return write_video(path, [np.full((56, 84, 3), RED if i in (23, 24) else GREY, np.uint8) for i in range(40)], 10)


def _call(tool: ClipTool, videos: list[VideoSource], **arguments):
    agent_data = types.SimpleNamespace(image_data=[])
    setattr(agent_data, STATE_ATTR, types.SimpleNamespace(videos=videos))
    response, _, metrics = asyncio.run(tool.execute("clip-1", arguments, agent_data=agent_data))
    return response, metrics


def test_a_window_comes_back_as_a_video_with_qwen_vl_utils_metadata(flash):
    response, metrics = _call(ClipTool(), [VideoSource(path=str(flash))], video_id=1, start_s=2.0, end_s=2.5, fps=10)
    [(frames, metadata)] = response.video
    assert metrics == {} and response.image is None
    assert response.text == (
        "Video 2: Video 1 from 2.00 to 2.50 s, 6 frames at 2.00, 2.10, 2.20, 2.30, 2.40, 2.50 s (84x56 px)"
    )
    assert metadata == {"fps": 10.0, "frames_indices": [20, 21, 22, 23, 24, 25], "total_num_frames": 6,
                        "video_backend": "pyav"}  # fmt: skip
    assert (tuple(frames.shape), frames.dtype) == ((6, 3, 56, 84), torch.float32)
    assert torch.equal(frames, frames.round()) and 0 <= frames.min() and frames.max() <= 255
    red = [bool(frame[0, 28, 42] - frame[1, 28, 42] > 100) for frame in frames]
    assert red == [False, False, False, True, True, False]


def test_the_sampling_is_an_even_count_spread_over_the_window(flash):
    source = [VideoSource(path=str(flash))]
    _, metadata = _call(ClipTool(), source, video_id=1, start_s=0, end_s=4, fps=2)[0].video[0]
    assert metadata["frames_indices"] == [0, 6, 11, 17, 22, 28, 33, 39] and metadata["total_num_frames"] == 40
    _, metadata = _call(ClipTool(), source, video_id=1, start_s=1, end_s=2, fps=0.5)[0].video[0]
    assert metadata["frames_indices"] == [10, 20]  # at least 2 frames


def test_frames_are_bounded_by_max_pixels_and_frames_given_as_images_work():
    from PIL import Image

    frames = tuple(Image.new("RGB", (320, 240), (60 * i,) * 3) for i in range(4))
    response, _ = _call(ClipTool({"max_pixels": 39200}), [VideoSource(frames=frames, fps=2.0)], video_id=1,
                        start_s=0, end_s=1.5, fps=2)  # fmt: skip
    [(clip, metadata)] = response.video
    assert tuple(clip.shape) == (4, 3, 171, 229) and metadata["frames_indices"] == [0, 1, 2, 3]
    assert response.text.endswith("4 frames at 0.00, 0.50, 1.00, 1.50 s (229x171 px)")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"video_id": 2}, "video_id must be between 1 and 1, got 2"),
        ({"start_s": 5, "end_s": 6}, "start_s must be at least 0 and less than the video's 4 s, got 5"),
        ({"start_s": 2, "end_s": 1}, "end_s must be greater than start_s=2, got 1"),
        ({"fps": 0}, "fps must be greater than 0 and at most 60, got 0"),
        (
            {"end_s": 4, "fps": 10},
            "4 s at fps=10 is 40 frames, more than the 16 a clip may hold: lower fps or shorten the window",
        ),  # fmt: skip
        (
            {"start_s": 2, "end_s": 2.05},
            "the window 2-2.05 s holds 1 frame(s) of the video (10 fps); a clip needs 2 or more: widen the window",
        ),  # fmt: skip
    ],
)
def test_bad_calls_are_answered_as_text(flash, arguments, message):
    call = {"video_id": 1, "start_s": 0.0, "end_s": 1.0, "fps": 2.0, **arguments}
    response, metrics = _call(ClipTool(), [VideoSource(path=str(flash))], **call)
    assert (response.text, response.video, metrics) == (f"Error from clip: {message}", None, {"error": message})


def test_no_video_in_the_conversation_is_answered_as_text():
    response, _ = _call(ClipTool(), [], video_id=1, start_s=0, end_s=1, fps=2)
    assert response.text == "Error from clip: there is no video in this conversation, so there are no frames to get"


def test_max_frames_is_bounded_by_the_config():
    assert ClipTool({"max_frames": 4}).settings.max_frames == 4
    with pytest.raises(ConfigError, match="max_frames must be between 2 and 32, got 1"):
        ClipTool({"max_frames": 1})


def test_check_tool_passes_clip_on_its_probe_video():
    from verl_mm_tools.tools import check_tool

    lines = str(check_tool(ClipTool())).splitlines()  # a ToolCheckError would list every check that failed
    assert lines[0] == "tool 'clip': 50 checks passed"
    assert (
        "  ok  a valid call {'video_id': 1, 'start_s': 0.0, 'end_s': 1.5, 'fps': 2.0} on a 64x48 image returns a "
        "video (frames and metadata) within max_pixels and a text starting 'Video 2:', leaving the workspace to the "
        "loop" in lines
    )
    assert "  ok  bad input answered as text: video_id 99 of 1 video" in lines
    assert "  ok  bad input answered as text: fps=1000000000000000000000000000000" in lines


def test_check_tool_finds_a_video_answer_that_breaks_the_contract():
    from verl.tools.schemas import ToolResponse

    from verl_mm_tools.tools import ToolCheckError, check_tool

    class BytesClip(ClipTool):
        async def execute(self, instance_id, parameters, **kwargs):
            response, reward, metrics = await super().execute(instance_id, parameters, **kwargs)
            if not response.video:
                return response, reward, metrics
            frames, metadata = response.video[0]
            broken = {key: value for key, value in metadata.items() if key != "total_num_frames"}
            return ToolResponse(video=[(frames.byte(), broken)], text="a clip"), reward, metrics

    with pytest.raises(ToolCheckError) as failed:
        check_tool(BytesClip())
    assert str(failed.value).splitlines()[1:] == [
        "- the frames must be float whole numbers in 0..255 (qwen-vl-utils' form), got torch.uint8",
        "- the metadata must hold ['fps', 'frames_indices', 'total_num_frames'] (qwen-vl-utils'), got {'fps': 2.0, "
        "'frames_indices': [0, 1, 2, 3], 'video_backend': 'pyav'}",
        "- the text must start with 'Video 2:' (the new video's id), got 'a clip'",
    ]
