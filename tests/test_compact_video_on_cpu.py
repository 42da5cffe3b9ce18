"""A prompt video's compact form (``compact_video``) on every family whose video processor it rebuilds: the uint8
frames and the call's arguments rebuild the video processor's output tensor for tensor, at 1 byte per frame byte
against the float output's 4; where it would not be exact or smaller, the float output stays; a malformed or forged
form is refused naming the sample."""

from __future__ import annotations

import functools

import pytest
import torch

from verl_mm_tools.compact_form import VIDEO_PIXELS, CompactImageError, NotCompactable
from verl_mm_tools.compact_image import expanded_inputs
from verl_mm_tools.compact_video import (
    FRAMES_KEY,
    VIDEO_HEADER_KEY,
    CompactVideos,
    VideoCallRecorder,
    compacted,
    expanded_videos,
)
from verl_mm_tools.tiny import tiny_model_path

pytestmark = pytest.mark.integration  # the families' tiny processors

# each family's float output for the test's two videos (168 x 252 and 112 x 112 px): Qwen2-VL and Qwen2.5-VL keep the
# frames' size (4 bytes a frame byte); the tiny Qwen3-VL and GLM-4.1V processors shrink them (their pixel bounds count
# every frame), and their float output is still larger than the frames
FLOAT_BYTES = {
    "qwen2_vl": 2_333_184,
    "qwen2_5_vl": 2_333_184,
    "qwen3_vl": 983_040,
    "qwen3_5": 983_040,
    "glm4v": 1_204_224,
}
VIDEO_FAMILIES = tuple(FLOAT_BYTES)


@functools.cache
def video_processor(family: str):
    from verl.utils import hf_processor

    return hf_processor(str(tiny_model_path(family=family))).video_processor


def frames(count: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Frames as qwen-vl-utils hands them on: float32 whole numbers in 0-255, (frames, channels, height, width)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, 3, height, width), generator=generator).float()


def metadata(count: int) -> dict:
    return {"fps": 10.0, "frames_indices": list(range(0, 10 * count, 10)), "total_num_frames": 10 * count}


def recorded_call(family: str, videos: list[torch.Tensor]):
    """The video processor's call as the model's processor makes it (verl's ``build_multimodal_processor_inputs``:
    the sampling metadata, no sampling again), through a recorder; with the carried inputs it gives."""
    recorder = VideoCallRecorder(video_processor(family))
    output = recorder(
        videos=videos,
        video_metadata=[metadata(len(each)) for each in videos],
        do_sample_frames=False,
        return_tensors="pt",
    )
    return recorder, {key: value for key, value in output.items() if key in (VIDEO_PIXELS, "video_grid_thw")}


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_the_frames_rebuild_the_video_processors_output_exactly(family):
    videos = [frames(4, 168, 252), frames(2, 112, 112, seed=1)]
    recorder, carried = recorded_call(family, videos)
    compact = compacted(recorder.calls, recorder.video_processor, carried, "row 7")
    assert [tuple(each.shape) for each in compact.frames] == [(4, 3, 168, 252), (2, 3, 112, 112)]
    assert all(each.dtype == torch.uint8 for each in compact.frames)
    assert compact.nbytes == 4 * 3 * 168 * 252 + 2 * 3 * 112 * 112 == 583_296
    pixels = carried[VIDEO_PIXELS]
    assert pixels.numel() * pixels.element_size() == FLOAT_BYTES[family]
    inputs = {"video_grid_thw": carried["video_grid_thw"], "input_marker": torch.ones(1), **compact.inputs()}
    assert sorted(compact.inputs()) == [f"{FRAMES_KEY}0", f"{FRAMES_KEY}1", VIDEO_HEADER_KEY]
    got = expanded_inputs(inputs)
    assert sorted(got) == ["input_marker", VIDEO_PIXELS, "video_grid_thw"]
    assert got[VIDEO_PIXELS].dtype == pixels.dtype and torch.equal(got[VIDEO_PIXELS], pixels)


def test_samples_showing_the_same_video_expand_it_once():
    recorder, carried = recorded_call("qwen2_5_vl", [frames(2, 112, 112)])
    inputs = {
        "video_grid_thw": carried["video_grid_thw"],
        **compacted(recorder.calls, video_processor("qwen2_5_vl"), carried, "0").inputs(),
    }
    expansions: dict = {}
    first, second = expanded_videos(inputs, expansions), expanded_videos(dict(inputs), expansions)
    assert len(expansions) == 1 and first[VIDEO_PIXELS] is second[VIDEO_PIXELS]


def test_the_float_output_stays_where_the_frames_are_not_exact_or_not_smaller():
    shrunk = [frames(2, 560, 1008)]  # the tiny Qwen2.5-VL's processor shrinks frames to 50,176 px: floats are smaller
    recorder, carried = recorded_call("qwen2_5_vl", shrunk)
    with pytest.raises(NotCompactable, match=r"the frames \(3386880 bytes\) are no smaller than"):
        compacted(recorder.calls, recorder.video_processor, carried, "0")
    recorder, carried = recorded_call("qwen2_5_vl", [frames(2, 112, 112) / 255])  # normalised floats, not bytes
    with pytest.raises(NotCompactable, match="not whole numbers in 0-255"):
        compacted(recorder.calls, recorder.video_processor, carried, "0")
    recorder, carried = recorded_call("qwen2_5_vl", [frames(2, 112, 112)])
    recorder(videos=[frames(2, 112, 112)], return_tensors="pt")  # a pass that called it twice is not rebuilt
    with pytest.raises(NotCompactable, match="Qwen2VLVideoProcessor was called 2 times in one processor pass"):
        compacted(recorder.calls, recorder.video_processor, carried, "0")


def _compact_inputs(**changes) -> dict:
    recorder, carried = recorded_call("qwen2_5_vl", [frames(2, 112, 112)])
    compact = compacted(recorder.calls, recorder.video_processor, carried, "row 3")
    return {"video_grid_thw": carried["video_grid_thw"], **compact.inputs(), **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({VIDEO_HEADER_KEY: torch.zeros(2, 2)}, "vmt_video_header is not a 1-D uint8 tensor: torch.float32"),
        (
            {f"{FRAMES_KEY}0": torch.zeros(2, 3, 4, 4)},
            r"sample row 3: vmt_video_frames_0 is torch.float32 \(2, 3, 4, 4\)",
        ),
        ({f"{FRAMES_KEY}0": torch.zeros(2, 5, 4, 4, dtype=torch.uint8)}, r"of shape \(2, 5, 4, 4\)"),
        ({f"{FRAMES_KEY}2": torch.zeros(2, 3, 4, 4, dtype=torch.uint8)}, "expected vmt_video_header and"),
        ({"video_grid_thw": torch.tensor([[1, 4, 4]])}, "expand to other video_grid_thw than its token ids"),
        ({VIDEO_PIXELS: torch.zeros(1)}, "carries both compact videos and pixel_values_videos"),
    ],
)
def test_a_malformed_compact_video_is_refused_naming_the_sample(changes, message):
    with pytest.raises(CompactImageError, match=message):
        expanded_videos(_compact_inputs(**changes))


def test_a_forged_header_cannot_name_another_class_or_break_the_processor():
    from verl_mm_tools.compact_form import json_tensor

    header = CompactVideos.from_inputs(_compact_inputs()).header
    fields = {"processor": "AutoModel", "config": "{}", "dtype": "torch.float32", "arguments": {}, "sample": "x"}
    with pytest.raises(CompactImageError, match="sample x: compact videos made by the video processor 'AutoModel'"):
        expanded_videos(_compact_inputs(**{VIDEO_HEADER_KEY: json_tensor(fields)}))
    fields = {**fields, "processor": header.processor.class_name, "config": header.processor.config}
    with pytest.raises(CompactImageError, match="refused its compact videos' call"):
        expanded_videos(_compact_inputs(**{VIDEO_HEADER_KEY: json_tensor({**fields, "arguments": {"patch_size": -1}})}))
    with pytest.raises(CompactImageError, match=r"vmt_video_header: the frames' dtype 'torch.int64' is not one of"):
        expanded_videos(_compact_inputs(**{VIDEO_HEADER_KEY: json_tensor({**fields, "dtype": "torch.int64"})}))
