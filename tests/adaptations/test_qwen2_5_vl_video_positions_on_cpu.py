"""Qwen2.5-VL's video positions in the trainer (``adaptations/fixes/qwen2_5_vl_video_positions.py`` and
``video_timing_positions.py``): transformers 5.9 resumes the text after a video too early and truncates its timing;
verl drops the timing. The tiny Qwen2.5-VL's ``tokens_per_second`` is 4, its spatial merge 2."""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import numpy as np
import pytest
import torch

from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.video import write_video

TEXT, VIDEO = 0, 2


def video_prompt_types() -> torch.Tensor:
    """3 text tokens, a video of 2 grid steps of 2 x 2 merged patches (8 tokens), 2 text tokens."""
    return torch.tensor([[TEXT] * 3 + [VIDEO] * 8 + [TEXT] * 2])


@pytest.fixture(scope="module")
def model_class():
    import verl  # noqa: F401 (the plugin applies the fixes when transformers' module is imported)
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    return Qwen2_5_VLModel


def rope_index(get_rope_index, seconds: float) -> torch.Tensor:
    """The positions of ``video_prompt_types``' 13 tokens, owned as verl binds them: to the processor."""
    from transformers import AutoConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    owner = SimpleNamespace(config=AutoConfig.from_pretrained(tiny_model_path(family="qwen2_5_vl")))
    owner.get_vision_position_ids = MethodType(Qwen2_5_VLModel.get_vision_position_ids, owner)
    types = video_prompt_types()
    positions, _ = get_rope_index(
        owner,
        torch.zeros_like(types),
        types,
        video_grid_thw=torch.tensor([[2, 4, 4]]),
        second_per_grid_ts=torch.tensor([seconds]),
    )
    return positions[:, 0]


def test_transformers_own_positions_overlap_a_videos_and_truncate_its_timing(model_class):
    original = model_class.get_rope_index.__wrapped__
    # 2 s a grid step (1 fps): temporal 3 and 3 + 8; the text after the video resumes at 3 + 2, inside the video
    assert rope_index(original, 2.0)[0].tolist() == [0, 1, 2, 3, 3, 3, 3, 11, 11, 11, 11, 5, 6]
    # 0.5 s a grid step (4 fps): truncated to 0 s, both grid steps at the same time
    assert rope_index(original, 0.5)[0].tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 5, 6]

    fixed = model_class.get_rope_index
    assert rope_index(fixed, 2.0).tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 11, 11, 11, 11, 12, 13],
        [0, 1, 2, 3, 3, 4, 4, 3, 3, 4, 4, 12, 13],
        [0, 1, 2, 3, 4, 3, 4, 3, 4, 3, 4, 12, 13],
    ]
    assert rope_index(fixed, 0.5)[0].tolist() == [0, 1, 2, 3, 3, 3, 3, 5, 5, 5, 5, 6, 7]


def test_a_run_of_placeholders_its_grid_does_not_fill_is_refused(model_class):
    types = torch.tensor([[TEXT] * 3 + [VIDEO] * 7 + [TEXT] * 2])
    owner = SimpleNamespace(
        config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2, tokens_per_second=4))
    )
    with pytest.raises(ValueError, match=r"a run of 7 vision placeholders in the prompt, but its grid \[2, 4, 4\]"):
        model_class.get_rope_index(owner, torch.zeros_like(types), types, video_grid_thw=torch.tensor([[2, 4, 4]]))


def test_verls_position_ids_ignore_the_videos_timing(tmp_path, model_class, monkeypatch):
    """A 4 s clip sampled at 1 fps (the processor: 2 s a grid step), through verl's own processor and position ids."""
    from qwen_vl_utils import process_vision_info
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils import hf_processor
    from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs

    clip = write_video(tmp_path / "clip.mp4", [np.full((56, 56, 3), i * 6, np.uint8) for i in range(40)], 10)
    messages = [
        {"role": "user", "content": [{"type": "video", "video": str(clip), "fps": 1.0}, {"type": "text", "text": "?"}]}
    ]
    processor = hf_processor(str(tiny_model_path(family="qwen2_5_vl")))
    _, videos = process_vision_info(messages, image_patch_size=14, return_video_metadata=True)
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = dict(build_multimodal_processor_inputs(processor, text=[text], videos=videos))
    # qwen-vl-utils' resize to its minimum, 224 x 224: 2 grid steps of 8 x 8 merged patches, 128 tokens
    assert inputs["second_per_grid_ts"].tolist() == [2.0] and inputs["video_grid_thw"].tolist() == [[2, 16, 16]]
    ids = inputs["input_ids"]
    start = ids[0].tolist().index(processor.video_token_id)

    def temporal_positions() -> list[int]:
        """The temporal positions of the video's first grid step, its second, and the token after the video."""
        mm_inputs = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
        worker = SimpleNamespace(processor=processor)
        positions = AgentLoopWorker._compute_position_ids(worker, ids, torch.ones_like(ids), mm_inputs)
        return positions[0, 1, [start, start + 63, start + 64, start + 127, start + 128]].tolist()

    assert temporal_positions() == [start, start, start + 8, start + 8, start + 9]  # 2 s a grid step, as vLLM's
    monkeypatch.delattr(processor, "get_rope_index_kwargs")  # verl's own processor
    assert temporal_positions() == [start, start, start + 4, start + 4, start + 8]  # 1 s a grid step
