"""Qwen2.5-VL's prompt videos keep their metadata in vLLM (``adaptations/vllm_plugin/video_metadata.py``): vLLM's
processor computes the video's seconds per grid step from the frames' sampling, as the trainer's processor does.
The engine itself: ``tests/tiny/test_vllm_engine_on_cpu.py``."""

from __future__ import annotations

import numpy as np
import pytest

from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.video import write_video

PROMPT = "<|vision_start|><|video_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    """A 4 s clip at 10 fps as verl loads it: qwen-vl-utils' frames (1 fps: 4) and metadata."""
    import verl  # noqa: F401 (qwen-vl-utils' reader: adaptations/fixes/qwen_video_reader.py)
    from qwen_vl_utils import process_vision_info

    clip = write_video(
        tmp_path_factory.mktemp("clip") / "clip.mp4", [np.full((56, 56, 3), i * 6, np.uint8) for i in range(40)], 10
    )
    messages = [{"role": "user", "content": [{"type": "video", "video": str(clip), "fps": 1.0}]}]
    _, videos = process_vision_info(messages, image_patch_size=14, return_video_metadata=True)
    return videos


def vllm_processor(family: str):
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(tiny_model_path(family=family)), dtype="float32"))


def seconds_per_grid_step(processor, video) -> list[float]:
    """What vLLM's processor computes for a prompt with ``video`` (as verl's server sends it)."""
    items = processor.data_parser.parse_mm_data({"video": video})
    hf_data, _ = processor._get_hf_mm_data(items)
    return processor._call_hf_processor(PROMPT, hf_data, {}, {})["second_per_grid_ts"].tolist()


def test_vllms_own_qwen2_5_vl_processor_drops_the_metadata(video, monkeypatch):
    from vllm.model_executor.models import qwen2_5_vl, qwen2_vl

    from verl_mm_tools.adaptations.vllm_plugin import video_metadata

    for target in video_metadata.ADAPTATION.targets:  # vLLM's own, where another test applied the plugin already
        owner_name, name = target.name.split(".")
        owner = getattr(qwen2_5_vl if target.module.endswith("qwen2_5_vl") else qwen2_vl, owner_name)
        monkeypatch.setattr(owner, name, getattr(vars(owner)[name], "__wrapped__", vars(owner)[name]))
    # the frames alone: the HF processor's default metadata (24 fps), 2 frames a grid step: 1/12 s
    assert seconds_per_grid_step(vllm_processor("qwen2_5_vl"), video) == pytest.approx([2 / 24])


def test_with_the_plugin_vllm_computes_the_trainers_timing(video):
    from verl_mm_tools.adaptations.vllm_plugin import adapt_vllm

    adapt_vllm()
    assert seconds_per_grid_step(vllm_processor("qwen2_5_vl"), video) == [2.0]  # as the trainer's processor
    frames, _ = video[0]
    # a video without metadata (vLLM's dummy inputs, a bare array) as before
    assert seconds_per_grid_step(vllm_processor("qwen2_5_vl"), [frames.numpy()]) == pytest.approx([2 / 24])
    # Qwen2-VL's parser keeps dropping it (its positions do not use time)
    assert not getattr(vllm_processor("qwen2_vl").data_parser, "_verl_mm_tools_keeps_video_metadata", False)
