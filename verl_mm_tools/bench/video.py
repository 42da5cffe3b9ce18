"""Figure 12: what a prompt video costs, on a clip at the size users bring (1280x720 H.264 at 30 fps, 10 s; 2 s with
``--repeats``): decoding every frame, in ms a frame; decoding the frames qwen-vl-utils samples by default (2 fps),
in ms a sampled frame; qwen-vl-utils' ``fetch_video`` (decode, sample, resize), in s a video, as verl loads a
prompt's video; then counted: the tokens per second of video Qwen2.5-VL gets from those frames (patch 14, 2x2 merge,
2 frames a temporal step), and the bytes a training sample carries for them (their compact form, ``compact_video``:
the frames as uint8) against the frames fetch_video resized, against the float32 ``pixel_values_videos`` verl's
pass makes (what samples carried before) and against the sampled frames at the clip's own size; and the CPU ms of
expanding the compact form in the trainer's process. CPU time of this process: decoding and resizing happen here."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from verl_mm_tools.bench.figures import Figure, figure

if TYPE_CHECKING:
    import torch

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
    carried, float_bytes, expand_ms = carried_bytes(resized)
    count, _, height, width = resized.shape
    tokens = count // TEMPORAL * (height // (PATCH * MERGE)) * (width // (PATCH * MERGE))
    return [
        figure("video/720p/decode_ms_per_frame", every),
        figure("video/720p/sampled_decode_ms_per_frame", sampled),
        figure("video/720p/fetch_video_s", fetched),
        figure("video/720p/qwen2_5_vl_tokens_per_second", [tokens / seconds]),
        figure("video/720p/carried_MB", [carried / 1e6]),
        figure("video/720p/carried_over_resized_frames", [carried / resized.numel()], "<= 1.25"),
        figure("video/720p/float_output_over_carried", [float_bytes / carried]),
        figure("video/720p/carried_over_sampled_frames", [carried / (sampled_count * HEIGHT * WIDTH * 3)]),
        figure("video/720p/expand_ms", expand_ms),
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


def carried_bytes(frames: torch.Tensor) -> tuple[int, int, list[float]]:
    """What a sample carries for ``frames`` (fetch_video's output) through Qwen2.5-VL's real video processor
    (transformers' defaults: Qwen2-VL's and Qwen2.5-VL's bounds, which keep fetch_video's size): its compact form's
    bytes (``compact_video``: the frames as uint8), the float ``pixel_values_videos`` bytes verl's pass makes, and the
    CPU ms of expanding the compact form in the trainer's process (checked equal to the float output)."""
    import torch
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    from verl_mm_tools.compact_video import VideoCallRecorder, compacted, expanded_videos

    recorder = VideoCallRecorder(Qwen2VLVideoProcessor())
    metadata = {"fps": float(FPS), "frames_indices": list(range(len(frames))), "total_num_frames": len(frames)}
    output = recorder(videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt")
    floats = output["pixel_values_videos"]
    compact = compacted(recorder.calls, recorder.video_processor, output, "bench")
    inputs = {"video_grid_thw": output["video_grid_thw"], **compact.inputs()}
    expand_ms = [_cpu_ms(lambda: expanded_videos(inputs)) for _ in range(3)]
    if not torch.equal(expanded_videos(inputs)["pixel_values_videos"], floats):
        raise AssertionError("the compact video did not expand to the video processor's output")
    return compact.nbytes, int(floats.numel() * floats.element_size()), expand_ms


def _cpu_ms(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1000
