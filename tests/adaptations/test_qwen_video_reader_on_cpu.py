"""qwen-vl-utils' video readers (``adaptations.fixes.qwen_video_reader``): none reads a file here without the fix."""

from __future__ import annotations

import numpy as np
import pytest

from verl_mm_tools.errors import VideoInputError
from verl_mm_tools.video import write_video


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """40 frames at 10 fps, frame i filled with red i * 6."""
    frames = [np.full((56, 84, 3), (i * 6, 90, 160), np.uint8) for i in range(40)]
    return write_video(tmp_path_factory.mktemp("clip") / "clip.mp4", frames, 10)


def test_qwen_vl_utils_reads_no_video_without_the_fix_and_the_pyav_reader_with_it(clip):
    import torchvision.io
    from qwen_vl_utils import vision_process

    original_choice = vision_process.get_video_reader_backend.__wrapped__
    assert original_choice() == "torchvision"  # no torchcodec, no decord
    assert not hasattr(torchvision.io, "read_video")  # torchvision 0.26: the reader it falls back to cannot read
    with pytest.raises(AttributeError, match="read_video"):
        vision_process._read_video_torchvision({"video": str(clip)})

    assert vision_process.get_video_reader_backend() == "pyav"
    (video, metadata), sample_fps = vision_process.fetch_video(
        {"video": f"file://{clip}", "fps": 1.0}, return_video_sample_fps=True, return_video_metadata=True
    )
    # qwen-vl-utils' sampling: 4 s at 1 fps, 4 frames spread over 0..39; then its own resize (to 128 tokens' worth)
    assert metadata == {"fps": 10.0, "frames_indices": [0, 13, 26, 39], "total_num_frames": 40, "video_backend": "pyav"}
    assert sample_fps == 1.0
    assert video.shape[:2] == (4, 3)
    red = video[:, 0, video.shape[2] // 2, video.shape[3] // 2]
    assert red.round().tolist() == pytest.approx([0, 78, 156, 234], abs=4)  # H.264's loss, a few levels


def test_a_damaged_video_fails_with_its_name_not_torchvisions_attribute_error(tmp_path, clip):
    from qwen_vl_utils import vision_process

    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(clip.read_bytes()[:600])
    with pytest.raises(VideoInputError, match="damaged.mp4"):
        vision_process.fetch_video({"video": str(damaged), "nframes": 4})
