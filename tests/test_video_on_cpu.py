"""Untrusted video files read with PyAV (``verl_mm_tools.video``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from verl_mm_tools import video
from verl_mm_tools.errors import VideoInputError
from verl_mm_tools.video import decode_frames, probe_video, read_video_sampled, write_video


def _clip(path, count, fps, size=(48, 64)):
    """Frame i is filled with (i % 256, 255 - i % 256, 128)."""
    frames = (np.full((*size, 3), (i % 256, 255 - i % 256, 128), np.uint8) for i in range(count))
    return write_video(path, frames, fps)


def test_the_header_of_a_clip(tmp_path):
    info = probe_video(_clip(tmp_path / "a.mp4", 40, 10))
    assert (info.width, info.height, info.fps, info.frames, info.duration_s, info.codec) == (
        64,
        48,
        10.0,
        40,
        4.0,
        "h264",
    )


def test_the_frames_asked_for_in_any_order_with_repeats(tmp_path):
    frames = decode_frames(_clip(tmp_path / "a.mp4", 40, 10), [39, 0, 7, 7])
    assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
    assert frames[:, 20, 30, 0].tolist() == pytest.approx([39, 0, 7, 7], abs=3)


def test_a_sparse_sample_of_an_hour_seeks_and_finds_each_frame(tmp_path):
    """3,600 frames at 1 fps; eight frames 450 apart, each reached by a seek (its red is its index mod 256)."""
    hour = _clip(tmp_path / "hour.mp4", 3600, 1, size=(32, 32))
    assert probe_video(hour).duration_s == 3600.0
    indices = list(range(0, 3600, 450))
    assert decode_frames(hour, indices)[:, 16, 16, 0].tolist() == pytest.approx([i % 256 for i in indices], abs=3)


def test_qwen_vl_utils_sampling_and_metadata(tmp_path):
    clip = _clip(tmp_path / "a.mp4", 40, 10)
    frames, metadata, sample_fps = read_video_sampled({"video": f"file://{clip}", "video_start": 1.0, "nframes": 4})
    assert metadata == {
        "fps": 10.0,
        "frames_indices": [10, 20, 29, 39],
        "total_num_frames": 30,
        "video_backend": "pyav",
    }
    assert (tuple(frames.shape), sample_fps) == ((4, 3, 48, 64), pytest.approx(4 / 3))
    assert frames[:, 0, 20, 30].tolist() == pytest.approx([10, 20, 29, 39], abs=3)


def test_frames_above_1440p_are_scaled_down_while_decoded(tmp_path):
    clip = _clip(tmp_path / "uhd.mp4", 2, 1, size=(2160, 3840))
    assert probe_video(clip).width == 3840
    assert decode_frames(clip, [1]).shape == (1, 1440, 2560, 3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "cannot be opened as a video"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "0x0 px frames are outside 1..67108864 px"),  # FFmpeg's image2
        (b"not a video at all", "cannot be opened as a video"),
    ],
    ids=["empty", "broken png", "text"],
)
def test_files_that_are_no_video_are_refused_by_name(tmp_path, content, message):
    path = tmp_path / "bad.mp4"
    path.write_bytes(content)
    with pytest.raises(VideoInputError, match=f"bad.mp4: {message}"):
        probe_video(path)


def test_a_truncated_clip_fails_at_the_first_frame_it_lacks(tmp_path):
    data = _clip(tmp_path / "a.mp4", 40, 10).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoInputError, match="cut.mp4"):
        decode_frames(cut, [0, 39])


def test_an_audio_only_file_holds_no_video_stream(tmp_path):
    import av

    path = tmp_path / "tone.m4a"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    with pytest.raises(VideoInputError, match=r"tone.m4a: holds no video stream \(streams: \['audio'\]\)"):
        probe_video(path)


def test_frames_out_of_range_and_videos_too_long_are_refused(tmp_path, monkeypatch):
    clip = _clip(tmp_path / "a.mp4", 40, 10)
    with pytest.raises(VideoInputError, match=r"frames 0..40 asked for, but the video has 40 \(0..39\)"):
        decode_frames(clip, [0, 40])
    with pytest.raises(VideoInputError, match="no frames asked for"):
        decode_frames(clip, [])
    slow = _clip(tmp_path / "slow.mp4", 4, Fraction(1, 5))  # 20 s
    monkeypatch.setattr(video, "MAX_DURATION_S", 10.0)
    with pytest.raises(VideoInputError, match="slow.mp4: 20 s long, more than the 10 s accepted"):
        probe_video(slow)


def test_urls_are_never_fetched():
    with pytest.raises(VideoInputError, match="refused to fetch 'http://192.0.2.1/a.mp4'"):
        read_video_sampled({"video": "http://192.0.2.1/a.mp4"})
