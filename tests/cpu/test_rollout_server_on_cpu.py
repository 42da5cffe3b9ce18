"""The hf rollout server (in-process, the class Ray wraps): batched generation with images, log-probs equal to a
teacher-forced forward, and weight updates."""

from __future__ import annotations

import asyncio

import pytest
import torch
from PIL import Image

from verl_mm_tools.cpu.hf_engine import nucleus
from verl_mm_tools.cpu.server import HFRolloutServer
from verl_mm_tools.errors import ConfigError

# Batching pads prompts on the left; a padded row's log-probs differ from an unpadded forward by float32 rounding.
LOGPROB_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    return HFRolloutServer(str(tiny_model_dir), response_length=24, seed=0)


def picture(angle: int, side: int = 56) -> Image.Image:
    image = Image.new("RGB", (side, side), (20, 40, 200))
    image.paste((250, 250, 0), (side // 4, side // 8, side // 2, side // 2))
    return image.rotate(angle, expand=True)


def prompt(engine, text: str, images: list[Image.Image]) -> list[int]:
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    rendered = engine.processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return engine.processor(text=[rendered], images=images or None, return_tensors="pt")["input_ids"][0].tolist()


def requests(engine) -> list[tuple[list[int], list[Image.Image]]]:
    """Different prompt lengths and image counts, so a batch needs padding and concatenated images."""
    specs = [
        ("How far is it turned?", [picture(0)]),
        ("No image here, just a longer question to pad.", []),
        ("Two pictures.", [picture(90), picture(180, side=84)]),
        ("Again?", [picture(270)]),
    ]
    return [(prompt(engine, text, images), images) for text, images in specs]


def generate_all(server, batch, sampling_params) -> list:
    async def run():
        return await asyncio.gather(
            *[
                server.generate(f"request-{index}", prompt_ids=ids, sampling_params=sampling_params, image_data=images)
                for index, (ids, images) in enumerate(batch)
            ]
        )

    return asyncio.run(run())


def test_concurrent_requests_are_batched_and_log_probs_equal_a_teacher_forced_forward(server):
    batch = requests(server.engine)
    before = server.get_stats()
    outputs = generate_all(server, batch, {"temperature": 1.0, "max_tokens": 16})
    stats = server.get_stats()
    assert stats["requests"] - before["requests"] == 4
    assert stats["batches"] - before["batches"] == 1  # all four arrived within the batch window
    for (ids, images), output in zip(batch, outputs, strict=True):
        assert 1 <= len(output.token_ids) <= 16
        assert len(output.log_probs) == len(output.token_ids)
        assert output.stop_reason == "completed"
        forced = server.engine.score(ids, output.token_ids, images)
        assert max(abs(a - b) for a, b in zip(output.log_probs, forced)) < LOGPROB_TOLERANCE


NUCLEUS = {"temperature": 0.7, "top_p": 0.6, "top_k": 20, "max_tokens": 12}


@pytest.mark.parametrize("top_p, top_k", [(0.5, -1), (0.9, -1), (0.98, 5), (1.0, 3), (0.3, 40)])
def test_the_nucleus_is_the_one_vllms_sampler_keeps(top_p, top_k):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    logits = torch.randn(6, 9, 50, generator=torch.Generator().manual_seed(0)) * 3
    rows = logits.reshape(-1, 50)
    expected = apply_top_k_top_p_pytorch(
        rows.clone(),
        torch.full((len(rows),), top_k) if top_k > 0 else None,
        torch.full((len(rows),), top_p) if top_p < 1 else None,
    )
    kept = torch.isfinite(nucleus(logits, top_p, top_k)).reshape(-1, 50)
    assert torch.equal(kept, torch.isfinite(expected))
    assert kept.sum(dim=-1).min() >= 1


def teacher_forced_logits(engine, ids, images, token_ids, temperature):
    with torch.no_grad():
        logits = engine.model(**engine.model_inputs([*ids, *token_ids], images)).logits[0]
    return logits[len(ids) - 1 : -1].float() / temperature


def test_log_probs_are_those_of_the_sampled_distribution_as_vllm_reports_them(server):
    """verl's default logprobs_mode (processed_logprobs): the log-prob of each sampled token after temperature,
    top-k and top-p, renormalized over the nucleus, computed here with vLLM's own masking function."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    assert server.logprobs_mode == "processed_logprobs"
    ids, images = requests(server.engine)[0]
    (output,) = generate_all(server, [(ids, images)], dict(NUCLEUS))
    logits = teacher_forced_logits(server.engine, ids, images, output.token_ids, NUCLEUS["temperature"])
    count = len(output.token_ids)
    masked = apply_top_k_top_p_pytorch(
        logits, torch.full((count,), NUCLEUS["top_k"]), torch.full((count,), NUCLEUS["top_p"])
    )
    expected = masked.log_softmax(dim=-1).gather(-1, torch.tensor(output.token_ids).unsqueeze(-1)).squeeze(-1)
    assert max(abs(a - b) for a, b in zip(output.log_probs, expected.tolist())) < LOGPROB_TOLERANCE
    raw = server.engine.score(ids, output.token_ids, images, temperature=NUCLEUS["temperature"])
    assert all(p >= r for p, r in zip(output.log_probs, raw)) and output.log_probs != raw


def test_raw_logprobs_mode_reports_the_full_softmax_and_other_modes_are_refused(tiny_model_dir):
    raw_server = HFRolloutServer(str(tiny_model_dir), response_length=24, seed=0, logprobs_mode="raw_logprobs")
    ids, images = requests(raw_server.engine)[0]
    (output,) = generate_all(raw_server, [(ids, images)], dict(NUCLEUS))
    raw = raw_server.engine.score(ids, output.token_ids, images, temperature=NUCLEUS["temperature"])
    assert max(abs(a - b) for a, b in zip(output.log_probs, raw)) < LOGPROB_TOLERANCE
    with pytest.raises(ConfigError, match=r"logprobs_mode must be one of .* got 'processed_logits'"):
        HFRolloutServer(str(tiny_model_dir), response_length=24, logprobs_mode="processed_logits")


def test_a_batch_generates_what_each_request_generates_alone(server):
    batch = requests(server.engine)
    greedy = {"temperature": 0.0, "max_tokens": 12}
    together = generate_all(server, batch, greedy)
    alone = [generate_all(server, [request], greedy)[0] for request in batch]
    assert [output.token_ids for output in together] == [output.token_ids for output in alone]


def test_each_request_stops_at_its_own_max_tokens(server):
    ids, images = requests(server.engine)[0]

    async def run():
        return await asyncio.gather(
            *[
                server.generate(
                    f"limit-{limit}",
                    prompt_ids=ids,
                    sampling_params={"temperature": 0.0, "max_tokens": limit},
                    image_data=images,
                )
                for limit in (1, 3, 24)
            ]
        )

    short, middle, full = asyncio.run(run())
    assert (len(short.token_ids), len(middle.token_ids)) == (1, 3)
    assert full.token_ids[:3] == middle.token_ids and middle.token_ids[:1] == short.token_ids


def test_generated_tokens_never_include_vision_placeholders(server):
    batch = requests(server.engine)
    outputs = generate_all(server, batch, {"temperature": 1.0, "max_tokens": 24})
    forbidden = set(server.engine.forbidden_token_ids)
    assert forbidden and not any(forbidden & set(output.token_ids) for output in outputs)


def test_a_weight_update_changes_the_outputs_and_loads_exactly_the_sent_tensors(tiny_model_dir):
    server = HFRolloutServer(str(tiny_model_dir), response_length=16, seed=0)
    batch = requests(server.engine)[:1]
    greedy = {"temperature": 0.0, "max_tokens": 8}
    before = generate_all(server, batch, greedy)[0]
    generator = torch.Generator().manual_seed(1)
    state = server.engine.model.state_dict()
    update = [
        (name, tensor + 0.05 * torch.randn(tensor.shape, generator=generator))
        for name, tensor in state.items()
        if tensor.is_floating_point()
    ]
    loaded = asyncio.run(server.update_weights(update, global_steps=7))
    assert loaded == len(update)
    assert all(torch.equal(server.engine.model.state_dict()[name], tensor) for name, tensor in update)
    after = generate_all(server, batch, greedy)[0]
    assert after.log_probs != before.log_probs
    assert after.extra_fields["global_steps"] == 7
    forced = server.engine.score(batch[0][0], after.token_ids, batch[0][1])
    assert max(abs(a - b) for a, b in zip(after.log_probs, forced)) < LOGPROB_TOLERANCE


def test_a_weight_update_for_another_model_is_refused_by_name(server):
    with pytest.raises(ValueError, match=r"match no parameter of the rollout model.*not\.a\.weight"):
        asyncio.run(server.update_weights([("not.a.weight", torch.zeros(2))]))


def test_video_requests_are_refused_with_what_to_do_instead(server):
    ids, _ = requests(server.engine)[1]
    with pytest.raises(ValueError, match="images only.*rollout.name=vllm or sglang"):
        asyncio.run(server.generate("video", prompt_ids=ids, sampling_params={}, video_data=[object()]))


def test_a_cancelled_request_does_not_break_its_batch(server):
    batch = requests(server.engine)

    async def run():
        tasks = [
            asyncio.create_task(
                server.generate(
                    f"cancel-{index}",
                    prompt_ids=ids,
                    image_data=images,
                    sampling_params={"temperature": 0.0, "max_tokens": 6},
                )
            )
            for index, (ids, images) in enumerate(batch)
        ]
        await asyncio.sleep(0)  # all four queued
        tasks[0].cancel()
        return await asyncio.wait_for(asyncio.gather(*tasks[1:]), timeout=60)  # a broken batch would hang

    outputs = asyncio.run(run())
    assert [len(output.token_ids) >= 1 for output in outputs] == [True, True, True]


def test_per_expert_weights_fill_a_fused_expert_model():
    """verl sends Qwen3-VL-MoE's experts one by one (as vLLM loads them); the hf server's transformers model holds
    them fused: each expert's gate, up and down weights land in their slices, and nothing else changes."""
    from verl_mm_tools.cpu.hf_engine import HFVisionLM
    from verl_mm_tools.tiny import tiny_model_path

    engine = HFVisionLM(str(tiny_model_path(family="qwen3_vl_moe")))
    experts = engine.model.model.language_model.layers[1].mlp.experts
    before = experts.gate_up_proj.detach().clone()
    width, hidden = experts.down_proj.shape[2], experts.down_proj.shape[1]
    gate, up, down = (
        torch.full((width, hidden), 2.0),
        torch.full((width, hidden), -3.0),
        torch.full((hidden, width), 5.0),
    )
    prefix = "model.language_model.layers.1.mlp.experts.2"
    loaded = engine.load_weights(
        [(f"{prefix}.gate_proj.weight", gate), (f"{prefix}.up_proj.weight", up), (f"{prefix}.down_proj.weight", down)]
    )
    assert loaded == 3
    assert torch.equal(experts.gate_up_proj[2, :width], gate) and torch.equal(experts.gate_up_proj[2, width:], up)
    assert torch.equal(experts.down_proj[2], down)
    assert torch.equal(experts.gate_up_proj[:2], before[:2]) and torch.equal(experts.gate_up_proj[3], before[3])
    with pytest.raises(ValueError, match="match no parameter"):
        engine.load_weights([("model.language_model.layers.1.mlp.experts.9.gate_proj.weight", gate)])
