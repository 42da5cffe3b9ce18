"""Figure 4's single trajectory, part by part (``bench/memory.py``): counted, so the ratios follow from the image
sizes and the processor's format, and the store keeps nothing once verl has made the sample."""

from __future__ import annotations

import pytest

from verl_mm_tools.bench.loop import loop_factory
from verl_mm_tools.bench.memory import resident_memory
from verl_mm_tools.tiny import tiny_model_path

pytestmark = pytest.mark.integration  # the memory bench on the tiny processor


def test_a_trajectory_holds_its_images_once_each_processor_output_once_and_the_sample(tmp_path):
    from verl.utils.ray_utils import get_event_loop

    make, tokenizer, worker = loop_factory(str(tiny_model_path(template="tool_aware")), tmp_path, 112, 4)
    figures = {each.name: each for each in resident_memory(make, tokenizer, worker, 4, 112, get_event_loop())}
    name = "memory/4x112px"
    assert figures[f"{name}/raw_image_MB"].value == pytest.approx(4 * 112 * 112 * 3 / 2**20)
    # Pillow: 4 bytes per RGB pixel over 3 raw ones, plus each image object (~100 bytes of 37,632 raw)
    assert 4 / 3 < figures[f"{name}/workspace_over_raw"].value < 4 / 3 + 0.01
    # each image once, as its compact form (uint8, 1 byte per raw byte: a 112 px image is not resized), plus a grid
    # per image and the dicts; Qwen-VL's float pixel values were 8 per raw byte
    assert 1 < figures[f"{name}/processor_outputs_over_raw"].value < 1.03
    # the sample: the same compact images (1), and its padded ids, masks and position ids (976 tokens, ~70 kB)
    assert 1.45 < figures[f"{name}/trainer_output_over_raw"].value < 1.5
    assert figures[f"{name}/workspace_over_raw"].target == "<= 2"
    compact_parts = ("processor_outputs", "trainer_output")
    assert all(figures[f"{name}/{part}_over_raw"].target == "<= 1.25" for part in compact_parts)
    kept = figures[f"{name}/processor_outputs_kept_after_the_sample_MB"]
    assert (kept.value, kept.missed) == (0, False)
