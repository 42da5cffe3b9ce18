"""What the mm_tool loop derives once per worker rather than per trajectory (verl builds a loop per trajectory): the
loops verl's worker builds share one ``WorkerSetup``, equal to what each would derive anew, a loop on another config
derives its own, and the checks that read a loop's options run once per worker and option value."""

from __future__ import annotations

import logging

import pytest

from verl_mm_tools.agent_loop import startup
from verl_mm_tools.agent_loop.budget import ImageGeometry
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.options import Export
from verl_mm_tools.bench.loop import loop_factory
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.testkit.scripted import ScriptedServer
from verl_mm_tools.tokens import vision_token_ids

IMAGE_PAD, VIDEO_PAD = 12, 13  # the tiny Qwen2.5-VL's <|image_pad|> and <|video_pad|>
IM_END = 2  # its <|im_end|>: the tokenizer's eos and the generation config's only eos id
VISION_IDS = frozenset({9, 10, 11, 12, 13})  # its <|vision_start|>, <|vision_end|>, <|vision_pad|> and the two pads
NO_STEP_HOOK = (
    "mm_tool runs without verl-mm-tools' step hook: no mm_tool/* step metrics and no masked-batch guard: set "
    "trainer.v1.sampler.custom_sampler.path=pkg://verl_mm_tools.step_hook.replay_buffer "
    "trainer.v1.sampler.custom_sampler.name=MMToolReplayBuffer"
)


def setup_of(loop):
    """The setup a loop was built with (the worker's current one, for a loop of the worker that built last)."""
    return startup.worker_setup(
        loop.config, loop.processor, loop.tokenizer, loop.mm_processor_kwargs, loop.apply_chat_template_kwargs
    )


def test_the_setup_holds_what_each_loop_would_derive_anew(tiny_model_dir, tmp_path):
    make, tokenizer, worker = loop_factory(str(tiny_model_dir), tmp_path / "56", side=56, turns=2)
    first, second = (make("mm_tool", ScriptedServer(tokenizer, [])) for _ in range(2))
    constants = setup_of(first)

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
    assert constants.trainer_config is first.config is second.config
    assert constants.forbidden_generated == VISION_IDS == vision_token_ids(tokenizer)
    assert tokenizer.convert_ids_to_tokens(sorted(VISION_IDS)) == [
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    assert first.end_of_turn is second.end_of_turn is constants.end_of_turn
    assert constants.end_of_turn == frozenset({IM_END}) == startup.end_of_turn_ids(first.config, tokenizer)
    assert (constants.turn_credit, constants.turn_gamma) == (False, 1.0)
    assert (first.context.turn_credit, first.context.turn_gamma) == (False, 1.0)

    other_make, other_tokenizer, _ = loop_factory(str(tiny_model_dir), tmp_path / "448", side=448, turns=2)
    other = other_make("mm_tool", ScriptedServer(other_tokenizer, []))
    assert other.context.geometry is not constants.geometry
    assert other.context.geometry == ImageGeometry(patch_size=14, merge_size=2, min_pixels=784, max_pixels=448 * 448)


def test_loops_of_one_worker_share_one_setup_and_a_loop_on_another_config_derives_anew(
    tiny_model_dir, tmp_path, monkeypatch
):
    derived = []
    derive = startup._derive_setup

    def recorded(*args):
        derived.append(derive(*args))
        return derived[-1]

    monkeypatch.setattr(startup, "_derive_setup", recorded)
    monkeypatch.setattr(startup, "_recent", [])
    make, tokenizer, _ = loop_factory(str(tiny_model_dir), tmp_path / "56", side=56, turns=2)
    first, second = (make("mm_tool", ScriptedServer(tokenizer, [])) for _ in range(2))
    assert len(derived) == 1
    assert setup_of(first) is setup_of(second) is derived[0]
    assert derived[0].trainer_config is first.config

    other_make, other_tokenizer, _ = loop_factory(str(tiny_model_dir), tmp_path / "448", side=448, turns=2)
    other = other_make("mm_tool", ScriptedServer(other_tokenizer, []))
    assert len(derived) == 2
    assert derived[1] is not derived[0] and derived[1].trainer_config is other.config
    assert derived[1].geometry == ImageGeometry(patch_size=14, merge_size=2, min_pixels=784, max_pixels=448 * 448)

    # back on the first config, a loop finds its setup among the recent ones
    assert setup_of(make("mm_tool", ScriptedServer(tokenizer, []))) is derived[0]
    assert len(derived) == 2
    # a fifth config pushes the oldest out: the first config, used last, stays; the 448 px one goes
    makers = [loop_factory(str(tiny_model_dir), tmp_path / f"{side}", side=side, turns=2) for side in (112, 168, 224)]
    for maker, maker_tokenizer, _ in makers:
        maker("mm_tool", ScriptedServer(maker_tokenizer, []))
    make("mm_tool", ScriptedServer(tokenizer, []))
    assert len(derived) == 5 and startup._recent[0] is derived[0]
    assert all(setup is not derived[1] for setup in startup._recent)
    other_make("mm_tool", ScriptedServer(other_tokenizer, []))
    assert len(derived) == 6 and derived[5].trainer_config is other.config


def test_the_option_checks_run_once_per_worker_and_option_value(tiny_model_dir, tmp_path, caplog):
    make, tokenizer, _ = loop_factory(str(tiny_model_dir), tmp_path / "one", side=56, turns=2)
    with caplog.at_level(logging.WARNING, logger=startup.__name__):
        first, _ = (make("mm_tool", ScriptedServer(tokenizer, [])) for _ in range(2))
    assert [record.getMessage() for record in caplog.records if record.name == startup.__name__] == [NO_STEP_HOOK]
    setup = setup_of(first)
    assert setup._passed == {("step hook", False), ("export", Export.PER_TRAJECTORY)}

    # a check that raised is not passed: the next loop with those options runs it, and fails, again
    dumping = MMToolLoopConfig.from_options({"dump_dir": str(tmp_path / "dumps")}, limit_images=None)
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"^mm_tool dump_dir needs verl-mm-tools' step hook"):
            setup.check_step_hook(dumping)
        with pytest.raises(ConfigError, match=r"^mm_tool export='per_turn' returns several samples per trajectory"):
            setup.check_export(MMToolLoopConfig(export="per_turn"))
    windowed = MMToolLoopConfig.from_options({"keep_last_images": 2}, limit_images=None)
    with pytest.raises(ConfigError, match=r"^mm_tool export='auto' \(chosen by keep_last_images=2\) returns several"):
        setup.check_export(windowed)
    assert setup._passed == {("step hook", False), ("export", Export.PER_TRAJECTORY)}

    # another worker's config: its loops check (and warn) again, once
    other_make, other_tokenizer, _ = loop_factory(str(tiny_model_dir), tmp_path / "other", side=56, turns=2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=startup.__name__):
        for _ in range(2):
            other_make("mm_tool", ScriptedServer(other_tokenizer, []))
    assert [record.getMessage() for record in caplog.records if record.name == startup.__name__] == [NO_STEP_HOOK]
