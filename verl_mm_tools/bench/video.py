"""Figure 12: what a prompt video costs, on a clip at the size users bring (1280x720 H.264 at 30 fps, 10 s; 2 s with
``--repeats``): decoding every frame, in ms a frame; decoding the frames qwen-vl-utils samples by default (2 fps),
in ms a sampled frame; qwen-vl-utils' ``fetch_video`` (decode, sample, resize), in s a video, as verl loads a
prompt's video; then counted: the tokens per second of video Qwen2.5-VL gets from those frames (patch 14, 2x2 merge,
2 frames a temporal step), and the bytes verl's agent-loop output carries for them (Qwen2.5-VL's video processor:
float32 ``pixel_values_videos``) against the frames fetch_video resized (uint8: what a compact form would carry) and
against the sampled frames at the clip's own size. CPU time of this process: decoding and resizing happen here."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from verl_mm_tools.bench.figures import Figure, figure

WIDTH, HEIGHT, FPS = 1280, 720, 30
SAMPLE_FPS = 2.0  # qwen-vl-utils' default
PATCH, MERGE, TEMPORAL = 14, 2, 2  # Qwen2.5-VL's video patches


def video_figures(repeats: int, seconds: int = 10, say: Callable[[str], object] = lambda line: None) -> list[Figure]:
    """``video/720p/...``: decode and fetch timings (``repeats`` samples each), tokens per second and carried bytes."""
    import verl  # noqa: F401  (qwen-vl-utils' PyAV reader: adaptations/fixes/qwen_video_reader.py)
    from qwen_vl_utils import fetch_video

    from verl_mm_tools.video import decode_frames, read_video_sampled

    with tempfile.TemporaryDirectory(prefix="vmt-bench-video-") as folder:
        path = str(write_clip(Path(folder) / "clip.mp4", seconds))
        entry = {"video": path, "fps": SAMPLE_FPS}
        frames = FPS * seconds
        say(f"bench: video: a {seconds} s {WIDTH}x{HEIGHT} clip at {FPS} fps")
        sampled_count = len(read_video_sampled(entry)[0])
        every, sampled, fetched = [], [], []
        for _ in range(repeats):
            every.append(_cpu_ms(lambda: decode_frames(path, list(range(frames)))) / frames)
            sampled.append(_cpu_ms(lambda: read_video_sampled(entry)) / sampled_count)
            fetched.append(_cpu_ms(lambda: fetch_video(entry)) / 1000)
        resized = fetch_video(entry)
    carried = carried_bytes(resized)
    count, _, height, width = resized.shape
    tokens = count // TEMPORAL * (height // (PATCH * MERGE)) * (width // (PATCH * MERGE))
    return [
        figure("video/720p/decode_ms_per_frame", every),
        figure("video/720p/sampled_decode_ms_per_frame", sampled),
        figure("video/720p/fetch_video_s", fetched),
        figure("video/720p/qwen2_5_vl_tokens_per_second", [tokens / seconds]),
        figure("video/720p/carried_MB", [carried / 1e6]),
        figure("video/720p/carried_over_resized_frames", [carried / resized.numel()]),
        figure("video/720p/carried_over_sampled_frames", [carried / (sampled_count * HEIGHT * WIDTH * 3)]),
    ]


def write_clip(path: Path, seconds: int) -> Path:
    """A clip that compresses like footage, not like noise: a gradient that moves, with a bright square crossing it."""
    from verl_mm_tools.video import write_video

    rows, columns = np.mgrid[0:HEIGHT, 0:WIDTH]

    def frame(index: int) -> np.ndarray:
        image = np.empty((HEIGHT, WIDTH, 3), np.uint8)
        image[..., 0] = (columns + 4 * index) % 256
        image[..., 1] = (rows + 2 * index) % 256
        image[..., 2] = 128
        left = 8 * index % (WIDTH - 96)
        image[300:396, left : left + 96] = 255
        return image

    return write_video(path, (frame(index) for index in range(FPS * seconds)), FPS, crf=23)


def carried_bytes(frames: object) -> int:
    """The bytes of Qwen2.5-VL's video processor output for ``frames`` (T x C x H x W uint8, already resized)."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    processor = Qwen2VLVideoProcessor()  # transformers' defaults: Qwen2-VL's and Qwen2.5-VL's
    output = processor(videos=[frames], do_resize=False, do_sample_frames=False, return_tensors="pt")
    return int(output["pixel_values_videos"].numel() * output["pixel_values_videos"].element_size())


def _cpu_ms(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1000
