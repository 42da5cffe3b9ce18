"""Figure 4's single trajectory, part by part (``bench/memory.py``): counted, so the ratios follow from the image
sizes and the processor's format, and the store keeps nothing once verl has made the sample."""

from __future__ import annotations

import pytest

from verl_mm_tools.bench.loop import loop_factory
from verl_mm_tools.bench.memory import resident_memory
from verl_mm_tools.tiny import tiny_model_path


def test_a_trajectory_holds_its_images_once_each_processor_output_once_and_the_sample(tmp_path):
    from verl.utils.ray_utils import get_event_loop

    make, tokenizer, worker = loop_factory(str(tiny_model_path(template="tool_aware")), tmp_path, 112, 4)
    figures = {each.name: each for each in resident_memory(make, tokenizer, worker, 4, 112, get_event_loop())}
    name = "memory/4x112px"
    assert figures[f"{name}/raw_image_MB"].value == pytest.approx(4 * 112 * 112 * 3 / 2**20)
    # Pillow: 4 bytes per RGB pixel over 3 raw ones, plus each image object (~100 bytes of 37,632 raw)
    assert 4 / 3 < figures[f"{name}/workspace_over_raw"].value < 4 / 3 + 0.01
    # one output per image, no copy per turn: Qwen-VL's pixel values are float32, two frames of 3 channels (24
    # bytes a pixel, 8 per raw byte), plus a grid per image
    assert 8 < figures[f"{name}/processor_outputs_over_raw"].value < 8.05
    # the sample: the images' pixel values joined once (8), its padded ids, masks, position ids (976 tokens)
    assert 8 < figures[f"{name}/trainer_output_over_raw"].value < 9
    assert all(figures[f"{name}/{part}_over_raw"].target == "<= 2" for part in ("workspace", "processor_outputs"))
    # the compact forms of the same images: 1 byte per resized byte (112 px is a whole number of 28 px patches)
    compact = figures[f"{name}/compact_forms_over_raw"]
    assert (compact.value, compact.target, compact.missed) == (1.0, "<= 1.25", False)
    kept = figures[f"{name}/processor_outputs_kept_after_the_sample_MB"]
    assert (kept.value, kept.missed) == (0, False)
