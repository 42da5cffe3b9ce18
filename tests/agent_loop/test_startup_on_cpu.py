"""What the mm_tool loop derives once per worker rather than per trajectory (verl builds a loop per trajectory): the
loops verl's worker builds share one ``WorkerConstants``, equal to what each would derive anew, and a worker on
another config gets its own."""

from __future__ import annotations

from verl_mm_tools.agent_loop import startup
from verl_mm_tools.agent_loop.budget import ImageGeometry
from verl_mm_tools.bench.loop import loop_factory
from verl_mm_tools.testkit.scripted import ScriptedServer

IMAGE_PAD, VIDEO_PAD = 12, 13  # the tiny Qwen2.5-VL's <|image_pad|> and <|video_pad|>


def test_loops_of_one_worker_share_its_constants_and_another_config_gets_its_own(tiny_model_dir, tmp_path):
    make, tokenizer, worker = loop_factory(str(tiny_model_dir), tmp_path / "56", side=56, turns=2)
    first, second = (make("mm_tool", ScriptedServer(tokenizer, [])) for _ in range(2))
    constants = startup.worker_constants(
        first.config, first.processor, first.tokenizer, first.mm_processor_kwargs, first.apply_chat_template_kwargs
    )

    assert first.context.geometry is second.context.geometry is constants.geometry
    assert first.context.traits is second.context.traits is constants.traits
    assert constants.processor is worker.processor and constants.tokenizer is worker.tokenizer
    assert constants.model_path == str(tiny_model_dir) == first.context.model_path
    assert constants.geometry == ImageGeometry(patch_size=14, merge_size=2, min_pixels=784, max_pixels=56 * 56)
    assert constants.geometry == ImageGeometry.from_processor(worker.processor, first.mm_processor_kwargs)
    assert constants.placeholder_ids == (IMAGE_PAD, VIDEO_PAD)
    assert tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"]) == [IMAGE_PAD, VIDEO_PAD]
    assert first.context.image_token_id == IMAGE_PAD
    assert IMAGE_PAD in constants.forbidden_generated
    assert first.context.calculate_log_probs is constants.calculate_log_probs

    other_make, other_tokenizer, _ = loop_factory(str(tiny_model_dir), tmp_path / "448", side=448, turns=2)
    other = other_make("mm_tool", ScriptedServer(other_tokenizer, []))
    assert other.context.geometry is not constants.geometry
    assert other.context.geometry == ImageGeometry(patch_size=14, merge_size=2, min_pixels=784, max_pixels=448 * 448)
