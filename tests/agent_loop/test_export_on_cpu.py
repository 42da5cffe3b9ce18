"""Training samples of the mm_tool loop (``export``): per-turn samples equal the chat template's own render of the
conversation, token for token, on every tiny family and on the thinking template; the per-trajectory stream differs
from that render once a thinking template drops earlier reasoning (verl #6854); ``auto`` starts a new sample exactly
there; each per-turn sample's rollout log-probs are reproduced by a float32 forward with verl's position ids."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.cpu.hf_engine import HFVisionLM
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.image_window import out_of_context_note
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import scripted_logprob, tool_call_text
from verl_mm_tools.testkit.rows import marked_image, trainer_logprobs
from verl_mm_tools.testkit.scripted import ScriptedServer
from verl_mm_tools.tiny import TinyModelSpec, tiny_model_path
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

pytestmark = pytest.mark.integration  # the families' tiny models through verl's worker

V1 = ("trainer.use_v1=true", MANAGER_TQ_OVERRIDE)  # the v1 trainer, with the manager several samples need
QUESTION = "How far is this image rotated?"
CALLS = [tool_call_text("rotate", degrees=90), tool_call_text("rotate", degrees=90, image_id=1)]
ANSWER = "<answer>90</answer><|im_end|>"
REASONING = "Rotate it.\n</think>\n\n"  # a thinking model writes its reasoning after the prompt's opening <think>
MODELS = [("qwen2_vl", "family"), ("qwen2_5_vl", "family"), ("qwen3_vl", "family"), ("qwen3_vl", "thinking")]


def rollout_for(family: str, template: str, tmp_path) -> LocalRollout:
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    return LocalRollout(tiny_model_path(family=family, template=template), tools_yaml, tmp_path)


def reference_template(family: str, template: str) -> str:
    """A template that renders tools itself in the format mm_tool must produce: the model's own for Qwen3-VL; Qwen's
    tool-aware one for Qwen2/2.5-VL, whose templates ignore tools (mm_tool adds the tool block and user turns)."""
    return TinyModelSpec(family=family, template="tool_aware" if family != "qwen3_vl" else template).chat_template


def render(worker, template: str, messages: list[dict], images: list) -> list[int]:
    """The chat template's render of a conversation at inference: one processor call, placeholders expanded."""
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in worker.tools]
    text = worker.processor.apply_chat_template(
        messages, tools=schemas, tokenize=False, add_generation_prompt=True, chat_template=template
    )
    return worker.processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()


def rows(output) -> list[dict]:
    return [unpadded_row(output, index) for index in range(len(output))]


@pytest.mark.parametrize(("family", "template"), MODELS, ids=[f"{f}-{t}" for f, t in MODELS])
def test_per_turn_samples_are_the_templates_own_render(family, template, tmp_path):
    reasoning = REASONING if template == "thinking" else ""
    turns = [reasoning + text for text in [*CALLS, ANSWER]]
    output, server, worker = rollout_for(family, template, tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        per_sample=True,
        loop_options={"export": "per_turn"},
        extra=V1,
    )
    tokenizer, samples = worker.tokenizer, rows(output)
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 3], [1, 3], [2, 3]]

    prompt_image = server.requests[0]["images"][0]
    rotated = prompt_image.rotate(90, expand=True)
    width, height = rotated.size
    conversation, images = image_prompt(QUESTION, [prompt_image]), [prompt_image]
    for k, (sample, turn) in enumerate(zip(samples, turns)):
        # the prompt: the reference template's render of the conversation so far, earlier turns from their text
        expected = render(worker, reference_template(family, template), conversation, images)
        assert sample["prompt_ids"] == expected, k
        assert server.requests[k]["prompt_ids"] == expected  # what the model saw is what it trains on
        # the response: exactly the tokens generated in the turn, all trained, with their rollout log-probs
        generated = tokenizer.encode(turn, add_special_tokens=False)
        assert sample["response_ids"] == generated
        assert sample["response_mask"] == [1] * len(generated)
        assert sample["logprobs"] == pytest.approx([scripted_logprob(i) for i in range(len(generated))], abs=1e-7)
        assert len(output.non_tensor_batch["multi_modal_inputs"][k]["image_grid_thw"]) == k + 1
        assert SampleFields.every_row(output.non_tensor_batch)[k].turn_spans == [[0, len(generated)]]
        conversation = [*conversation, {"role": "assistant", "content": turn.removesuffix("<|im_end|>")}]
        if k < 2:
            text = f"Image {k + 2}: Image 1 rotated by 90 degrees counter-clockwise, {width}x{height} px."
            conversation.append(
                {"role": "tool", "content": [{"type": "image", "image": rotated}, {"type": "text", "text": text}]}
            )
            images = [*images, rotated]
    # the trajectory's statistics, on every sample (verl needs the same keys on each)
    assert list(output.non_tensor_batch["tool_call_counts"]) == [2, 2, 2]
    assert list(output.non_tensor_batch["mm_tool/turns"]) == [3, 3, 3]


@pytest.mark.parametrize(("family", "template"), MODELS, ids=[f"{f}-{t}" for f, t in MODELS])
def test_auto_keeps_one_sample_on_a_tool_loop_and_it_equals_per_trajectory(family, template, tmp_path):
    """Tool results are no new user query: even the thinking template keeps the reasoning, history stays a prefix."""
    reasoning = REASONING if template == "thinking" else ""
    turns = [reasoning + text for text in [*CALLS, ANSWER]]
    rollout, prompts = rollout_for(family, template, tmp_path), [image_prompt(QUESTION, [marked_image()])]
    auto, _, _ = rollout.run(turns, prompts, per_sample=True, loop_options={"export": "auto"}, extra=V1)
    whole, _, _ = rollout.run(turns, prompts, extra=V1)
    assert [fields.sample for fields in SampleFields.every_row(auto.non_tensor_batch)] == [[0, 1]]
    assert rows(auto) == rows(whole)


def feedback_rollout(tmp_path, export: str):
    """An environment's user turn after a wrong answer, on the thinking template: the template then drops the first
    answer's reasoning from the history."""
    rollout = rollout_for("qwen3_vl", "thinking", tmp_path)
    columns = {
        "data_source": ["verl_mm_tools/rotation"],
        "reward_model": [{"style": "rule", "ground_truth": "90"}],
        "extra_info": [
            {"index": 0, "env": {"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 3}}
        ],
    }
    turns = [
        "It looks like 45.\n</think>\n\n<answer>45</answer><|im_end|>",
        "No, 90.\n</think>\n\n<answer>90</answer><|im_end|>",
    ]
    options = {} if export == "per_trajectory" else {"loop_options": {"export": export}}
    output, server, worker = rollout.run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        columns=columns,
        per_sample=export != "per_trajectory",
        extra=V1,
        **options,
    )
    image = server.requests[0]["images"][0]
    conversation = [
        *image_prompt(QUESTION, [image]),
        {"role": "assistant", "content": turns[0].removesuffix("<|im_end|>")},
        {"role": "user", "content": "Your answer is not correct. Please try again; 2 attempt(s) left."},
    ]
    return output, server, worker, render(worker, worker.processor.chat_template, conversation, [image])


def test_per_trajectory_trains_on_reasoning_the_thinking_template_drops(tmp_path):
    output, server, worker, template_render = feedback_rollout(tmp_path, "per_trajectory")
    seen = server.requests[1]["prompt_ids"]
    assert seen != template_render  # verl #6854: the stream keeps the first answer's reasoning
    assert "It looks like 45." in worker.tokenizer.decode(seen)
    assert "It looks like 45." not in worker.tokenizer.decode(template_render)
    assert len(output) == 1


@pytest.mark.parametrize("export", ["per_turn", "auto"])
def test_per_turn_and_auto_start_a_sample_where_the_template_drops_reasoning(tmp_path, export):
    output, server, worker, template_render = feedback_rollout(tmp_path, export)
    assert server.requests[1]["prompt_ids"] == template_render
    samples = rows(output)
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 2], [1, 2]]
    assert samples[1]["prompt_ids"] == template_render
    assert worker.tokenizer.decode(samples[1]["response_ids"]) == "No, 90.\n</think>\n\n<answer>90</answer><|im_end|>"
    assert samples[0]["prompt_ids"] == server.requests[0]["prompt_ids"]
    assert list(output.non_tensor_batch["attempts"]) == [2, 2]


def test_each_per_turn_samples_rollout_logprobs_equal_a_full_forward(tiny_model_dir, tmp_path):
    model = HFVisionLM(str(tiny_model_dir))
    turns = [*CALLS, None]
    output, _, _ = rollout_for("qwen2_5_vl", "family", tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        server=lambda tokenizer: ScriptedServer(tokenizer, turns, model=model),
        per_sample=True,
        loop_options={"export": "per_turn"},
        extra=V1,
        response_length=256,
    )
    assert len(output) == 3
    for row, sample in enumerate(rows(output)):
        recomputed = trainer_logprobs(model, output, row)
        rollout = torch.tensor(sample["logprobs"])
        assert torch.allclose(recomputed, rollout, atol=1e-5), (row, (recomputed - rollout).abs().max())


def test_per_turn_needs_the_v1_trainer(tiny_model_dir, tmp_path):
    rollout = rollout_for("qwen2_5_vl", "family", tmp_path)
    # verl builds loops through hydra, which wraps the ConfigError and keeps its message
    with pytest.raises(Exception, match=r"ConfigError.*export='per_turn'.*trainer.use_v1=false"):
        rollout.run(
            [ANSWER],
            [image_prompt(QUESTION, [marked_image()])],
            loop_options={"export": "per_turn"},
            extra=("trainer.use_v1=false",),
        )


def test_a_prefix_unstable_template_with_per_trajectory_warns_once_naming_per_turn(tmp_path, caplog):
    rollout = rollout_for("qwen3_vl", "thinking", tmp_path)
    with caplog.at_level(logging.WARNING, logger="verl_mm_tools.agent_loop.mm_tool_loop"):
        rollout.run([ANSWER, ANSWER], [image_prompt(QUESTION, [marked_image()])] * 2, extra=V1)
    warnings = [record.message for record in caplog.records if "drops earlier reasoning" in record.message]
    assert len(warnings) == 1 and "export: per_turn" in warnings[0]


def test_a_per_turn_trajectory_is_dumped_once_with_its_samples(tmp_path):
    from verl_mm_tools.agent_loop.hook_config import hook_overrides
    from verl_mm_tools.step_hook.manager import step_batch
    from verl_mm_tools.step_hook.step import process_step

    turns = [*CALLS, ANSWER]
    output, _, worker = rollout_for("qwen2_5_vl", "family", tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        per_sample=True,
        loop_options={"export": "per_turn", "dump_dir": str(tmp_path / "dump")},
        extra=(*V1, *hook_overrides(v1=True)),
    )
    metrics = process_step(step_batch(output, {"global_steps": 2}))
    assert metrics["mm_tool/dump/written"] == 1.0  # one trajectory, three samples
    assert metrics["mm_tool/samples_per_trajectory"] == 3.0
    assert metrics["mm_tool/turns/mean"] == 3.0 and metrics["mm_tool/tool_calls/mean"] == 2.0
    (path,) = (tmp_path / "dump").glob("step_000002/*/trajectory.json")
    record = json.loads(path.read_text())
    samples = rows(output)
    assert record["samples"] == [
        {
            "sample": k,
            "turns": [k + 1],
            "prompt_tokens": len(sample["prompt_ids"]),
            "response_tokens": len(sample["response_ids"]),
            "trained_tokens": len(sample["response_ids"]),
            "images": k + 1,
            "images_left_out": 0,
        }
        for k, sample in enumerate(samples)
    ]
    assert [(turn["sample"], turn["prompt_tokens"], turn["context_tokens_after"]) for turn in record["turns"]] == [
        (k, len(sample["prompt_ids"]), 0) for k, sample in enumerate(samples)
    ]
    texts = [message["text"] for message in record["messages"] if message["role"] == "assistant"]
    assert texts == [worker.tokenizer.decode(sample["response_ids"], skip_special_tokens=True) for sample in samples]
    assert record["mask"]["trained_tokens"] == sum(len(sample["response_ids"]) for sample in samples)


def test_per_turn_needs_the_manager_that_scores_several_samples(tmp_path):
    rollout = rollout_for("qwen2_5_vl", "family", tmp_path)
    with pytest.raises(Exception, match=r"ConfigError.*crashes scoring several samples.*MMToolAgentLoopManagerTQ"):
        rollout.run(
            [ANSWER],
            [image_prompt(QUESTION, [marked_image()])],
            loop_options={"export": "auto"},
            extra=("trainer.use_v1=true",),
        )


# ----- keep_last_images: the context keeps the last K images, earlier ones as a note naming their id; each sample is
# that context token for token (the template's render of the windowed conversation, the images the engine was sent,
# the same images in its multimodal inputs), and a tool still takes an image that left the context by its id -------

WINDOW_TURNS = [*CALLS, ANSWER]  # rotate image 1, rotate image 1 again (out of the context by then), answer


def note(image_id: int) -> dict:
    return {"type": "text", "text": out_of_context_note(image_id)}


def conversations(prompt_image, rotated, width, height):
    """The conversation before each of the three turns, every image in it."""
    conversation = image_prompt(QUESTION, [prompt_image])
    result = [conversation]
    for k, turn in enumerate(WINDOW_TURNS[:2]):
        text = f"Image {k + 2}: Image 1 rotated by 90 degrees counter-clockwise, {width}x{height} px."
        conversation = [
            *conversation,
            {"role": "assistant", "content": turn.removesuffix("<|im_end|>")},
            {"role": "tool", "content": [{"type": "image", "image": rotated}, {"type": "text", "text": text}]},
        ]
        result.append(conversation)
    return result


def with_notes(conversation: list[dict], left_out: int) -> list[dict]:
    """``conversation`` with its first ``left_out`` images as the loop's notes, written out by hand."""
    seen, result = 0, []
    for message in conversation:
        if isinstance(message["content"], list):
            parts = []
            for part in message["content"]:
                if part["type"] == "image":
                    seen += 1
                    part = note(seen) if seen <= left_out else part
                parts.append(part)
            message = {**message, "content": parts}
        result.append(message)
    return result


def windowed_run(tmp_path, **options):
    output, server, worker = rollout_for("qwen2_5_vl", "family", tmp_path).run(
        WINDOW_TURNS, [image_prompt(QUESTION, [marked_image()])], per_sample=True, loop_options=options, extra=V1
    )
    prompt_image = server.requests[0]["images"][0]
    rotated = prompt_image.rotate(90, expand=True)
    return output, server, worker, conversations(prompt_image, rotated, *rotated.size)


def test_each_turn_sees_and_trains_on_its_last_image_only(tmp_path):
    output, server, worker, before_turn = windowed_run(tmp_path, keep_last_images=1, export="per_turn")
    template = reference_template("qwen2_5_vl", "family")
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 3], [1, 3], [2, 3]]
    for k, conversation in enumerate(before_turn):
        images = images_of(conversation)
        shown = images[-1:]
        expected = render(worker, template, with_notes(conversation, len(images) - 1), shown)
        sample = unpadded_row(output, k)
        assert sample["prompt_ids"] == expected, k
        assert server.requests[k]["prompt_ids"] == expected  # what the model saw is what it trains on
        assert [image.tobytes() for image in server.requests[k]["images"]] == [image.tobytes() for image in shown]
        grids = output.non_tensor_batch["multi_modal_inputs"][k]["image_grid_thw"].tolist()
        assert grids == [[1, *[side // 14 for side in shown[0].size[::-1]]]], k
    notes = worker.tokenizer.encode(out_of_context_note(1), add_special_tokens=False)
    assert _contains(unpadded_row(output, 2)["prompt_ids"], notes)
    assert list(output.non_tensor_batch["mm_tool/images"]) == [3, 3, 3]  # the trajectory holds all three


def test_auto_starts_a_sample_where_an_image_leaves_the_context(tmp_path):
    """keep_last_images=2 chooses export auto: turns 1 and 2 share a sample (two images fit); at turn 3 image 1
    leaves the context and a new sample starts from the windowed render."""
    output, server, worker, before_turn = windowed_run(tmp_path, keep_last_images=2)
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 2], [1, 2]]
    last = before_turn[2]
    images = images_of(last)
    expected = render(worker, reference_template("qwen2_5_vl", "family"), with_notes(last, 1), images[1:])
    assert unpadded_row(output, 1)["prompt_ids"] == expected == server.requests[2]["prompt_ids"]
    assert len(server.requests[1]["images"]) == 2 and len(server.requests[2]["images"]) == 2
    assert len(output.non_tensor_batch["multi_modal_inputs"][0]["image_grid_thw"]) == 2


def images_of(conversation: list[dict]) -> list:
    return [
        part["image"]
        for message in conversation
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image"
    ]


def _contains(ids: list[int], run_ids: list[int]) -> bool:
    return any(ids[start : start + len(run_ids)] == run_ids for start in range(len(ids) - len(run_ids) + 1))
