"""Golden trajectories of the mm_tool loop through verl's real AgentLoopWorker: exact tokens, masks, log-probs,
images and features, on every tiny family; the same trajectory with the tiny model generating; log-probs of a full
forward with verl's position ids equal to the rollout's."""

from __future__ import annotations

import pytest
import torch

from verl_mm_tools.compact_image import CompactImages, expanded_inputs
from verl_mm_tools.cpu.hf_engine import HFVisionLM
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import scripted_logprob, tool_call_text
from verl_mm_tools.testkit.rows import marked_image, trainer_logprobs
from verl_mm_tools.testkit.scripted import ScriptedServer
from verl_mm_tools.tiny import TinyModelSpec, tiny_model_path
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

TURNS = [
    tool_call_text("rotate", degrees=90),
    tool_call_text("rotate", degrees=90, image_id=1),
    "<answer>90</answer><|im_end|>",
]
QUESTION = "How far is this image rotated?"


def find(sequence: list[int], part: list[int], start: int) -> int:
    for index in range(start, len(sequence) - len(part) + 1):
        if sequence[index : index + len(part)] == part:
            return index
    raise AssertionError(f"{part} not found after position {start}")


def reference_template(family: str) -> str:
    """Qwen's tool-aware token format, which mm_tool's auto tool settings must produce: Qwen3-VL's own template renders
    it; on the Qwen2-VL / Qwen2.5-VL templates, which ignore tools, mm_tool adds the tool block to the system message
    and sends tool results as <tool_response> user turns, so the tokens equal the tool-aware template's."""
    template = "family" if family == "qwen3_vl" else "tool_aware"
    return TinyModelSpec(family=family, template=template).chat_template


def expected_stream(worker, family, prompt_image, tool_texts):
    """Prompt ids and the full token stream, rendered independently: one processor call on the final conversation."""
    processor, template = worker.processor, reference_template(family)
    rotated = prompt_image.rotate(90, expand=True)
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in worker.tools]
    user = image_prompt(QUESTION, [prompt_image])
    conversation = [
        *user,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "rotate", "arguments": {"degrees": 90}}}],
        },
        {"role": "tool", "content": [{"type": "image", "image": rotated}, {"type": "text", "text": tool_texts[0]}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "rotate", "arguments": {"degrees": 90, "image_id": 1}}}
            ],
        },
        {"role": "tool", "content": [{"type": "image", "image": rotated}, {"type": "text", "text": tool_texts[1]}]},
        {"role": "assistant", "content": "<answer>90</answer>"},
    ]
    render = lambda messages, images, gen: processor(  # noqa: E731
        text=[
            processor.apply_chat_template(
                messages, tools=schemas, tokenize=False, add_generation_prompt=gen, chat_template=template
            )
        ],
        images=images,
        return_tensors="pt",
    )["input_ids"][0].tolist()
    prompt = render(user, [prompt_image], True)
    full = render(conversation, [prompt_image, rotated, rotated], False)
    assert worker.tokenizer.decode(full[-1:]) == "\n"  # generation stops at <|im_end|>, before the template's newline
    return prompt, full[:-1], rotated


def generated_spans(stream: list[int], prompt_length: int, generated: list[list[int]]) -> list[tuple[int, int]]:
    spans, cursor = [], prompt_length
    for tokens in generated:
        start = find(stream, tokens, cursor)
        spans.append((start - prompt_length, start - prompt_length + len(tokens)))
        cursor = start + len(tokens)
    return spans


def test_golden_three_turn_trajectory_with_two_tool_images(tiny_family_dir, tmp_path):
    family, model_dir = tiny_family_dir
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    output, server, worker = LocalRollout(model_dir, tools_yaml, tmp_path).run(
        TURNS, [image_prompt(QUESTION, [marked_image()])]
    )
    row = unpadded_row(output)
    prompt_image = server.requests[0]["images"][0]
    tool_texts = [
        "Image 2: Image 1 rotated by 90 degrees counter-clockwise, 56x84 px.",
        "Image 3: Image 1 rotated by 90 degrees counter-clockwise, 56x84 px.",
    ]
    if prompt_image.size != (84, 56):  # Qwen3-VL's 32 px factor resizes the prompt image to 96x64
        tool_texts = [text.replace("56x84", "64x96") for text in tool_texts]
    prompt, stream, rotated = expected_stream(worker, family, prompt_image, tool_texts)

    assert row["prompt_ids"] == prompt
    assert prompt + row["response_ids"] == stream
    generated = [worker.tokenizer.encode(turn, add_special_tokens=False) for turn in TURNS]
    spans = generated_spans(stream, len(prompt), generated)
    expected_mask = [0] * len(row["response_ids"])
    expected_logprobs = [0.0] * len(row["response_ids"])
    for start, end in spans:
        expected_mask[start:end] = [1] * (end - start)
        expected_logprobs[start:end] = [scripted_logprob(i) for i in range(end - start)]
    assert row["response_mask"] == expected_mask
    assert row["logprobs"] == pytest.approx(expected_logprobs, abs=1e-7)
    assert spans[0][0] == 0 and spans[-1][1] == len(row["response_ids"])

    # The server saw the images in placeholder order: 1 prompt image, then +1 per tool turn.
    assert [len(request["images"]) for request in server.requests] == [1, 2, 3]
    assert list(server.requests[2]["images"][1].getdata()) == list(rotated.getdata())

    # verl's postprocess: one grid per image, each image's resized pixels (uint8, 14 px a patch), M-RoPE position ids
    # (1, 4, L) per sample; the trainer's expansion: pixel rows = patches
    inputs = output.non_tensor_batch["multi_modal_inputs"][0]
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 6], [1, 6, 4], [1, 6, 4]]
    compact = CompactImages.from_inputs(inputs)
    patch = worker.processor.image_processor.patch_size
    assert [tuple(pixels.shape) for pixels in compact.pixels] == [
        (3, 4 * patch, 6 * patch),
        *[(3, 6 * patch, 4 * patch)] * 2,
    ]
    assert "pixel_values" not in inputs and expanded_inputs(inputs)["pixel_values"].shape[0] == 3 * 24
    image_pad = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (prompt + row["response_ids"]).count(image_pad) == 3 * 6
    assert output.batch["position_ids"].shape == (1, 4, output.batch["input_ids"].shape[1])

    assert output.non_tensor_batch["tool_call_counts"][0] == 2
    assert output.non_tensor_batch["mm_tool/images"][0] == 3
    assert output.non_tensor_batch["mm_tool/image_tokens"][0] == 18
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0
    assert output.non_tensor_batch["__num_turns__"][0] == 6


@pytest.mark.parametrize("last_turn", ["<answer>90</answer><|im_end|>", None], ids=["scripted", "model-generated"])
def test_rollout_logprobs_equal_a_full_forward_with_verls_position_ids(tiny_model_dir, tmp_path, last_turn):
    """Tool calls forced, log-probs from the real tiny model (teacher-forced at each turn, or sampled by it for the
    last turn): the trainer's single forward over the whole trajectory must reproduce them."""
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    model = HFVisionLM(str(tiny_model_path()))
    turns = [*TURNS[:2], last_turn]
    output, _, _ = LocalRollout(tiny_model_dir, tools_yaml, tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        server=lambda tokenizer: ScriptedServer(tokenizer, turns, model=model),
        response_length=256,
    )
    row = unpadded_row(output)
    mask = torch.tensor(row["response_mask"]).bool()
    recomputed = trainer_logprobs(model, output)
    rollout = torch.tensor(row["logprobs"])
    assert mask.sum() > 30
    assert torch.allclose(recomputed[mask], rollout[mask], atol=1e-5), (recomputed[mask] - rollout[mask]).abs().max()
    assert output.non_tensor_batch["mm_tool/images"][0] == 3
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0
