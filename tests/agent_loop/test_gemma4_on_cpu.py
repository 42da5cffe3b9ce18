"""The mm_tool loop on Gemma 4 (model type ``gemma4``), whose format differs from every other family verl builds
tokens for: calls are ``<|tool_call>call:NAME{key:value}<tool_call|>`` (verl's ``gemma4`` parser stops generation
there), their results follow inside the same model turn as ``<|tool_response>response:NAME{...}<tool_response|>``,
the template renders only the text of a tool message (so mm_tool shows tool images in a user turn after the results:
``tool_response_role: split``), and the processor scales every image to its soft-token budget. These tests pin what
the loop produces on the tiny stand-in through verl's real AgentLoopWorker and Gemma 4 Continuous-Token builder."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from verl_mm_tools.agent_loop.budget import ImageGeometry, SoftTokenGeometry, check_pixel_bounds
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.agent_loop.options import ToolPrompt, ToolResponseRole
from verl_mm_tools.agent_loop.tool_format import TemplateTraits, resolve_tool_format, template_traits
from verl_mm_tools.agent_loop.tool_runner import MALFORMED_CALL_TEXT_OTHER_FORMATS
from verl_mm_tools.cpu.hf_engine import HFVisionLM
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.testkit.rows import marked_image, trainer_logprobs
from verl_mm_tools.testkit.scripted import ScriptedServer, scripted_turn_expectations
from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.tokens import processor_image_tokens
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

pytestmark = pytest.mark.integration  # the tiny Gemma 4 through verl's worker

QUESTION = "How far is this image rotated?"
FORMAT = "actor_rollout_ref.rollout.multi_turn.format=gemma4"
V1 = ("trainer.use_v1=true", MANAGER_TQ_OVERRIDE)
CALLS = [
    "<|tool_call>call:rotate{degrees:90}<tool_call|>",
    "<|tool_call>call:rotate{degrees:90,image_id:1}<tool_call|>",
]
ANSWER = "<answer>90</answer><turn|>"
TURNS = [*CALLS, ANSWER]
# the generation prompt with thinking off: a model turn that opens with an empty thought channel
MODEL_TURN = "<|turn>model\n<|channel>thought\n<channel|>"


@pytest.fixture(scope="module")
def processor():
    from verl.utils import hf_processor

    return hf_processor(str(tiny_model_path(family="gemma4")))


def run(tmp_path, turns, **kwargs):
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    rollout = LocalRollout(tiny_model_path(family="gemma4"), tools_yaml, tmp_path)
    extra = [FORMAT, *kwargs.pop("extra", ())]
    return rollout.run(turns, [image_prompt(QUESTION, [marked_image()])], extra=extra, **kwargs)


def tool_text(k: int, rotated: Image.Image) -> str:
    return f"Image {k}: Image 1 rotated by 90 degrees counter-clockwise, {rotated.width}x{rotated.height} px."


def result(text: str) -> str:
    return f'<|tool_response>response:rotate{{value:<|"|>{text}<|"|>}}<tool_response|>'


def ids_of(processor, text: str, images) -> list[int]:
    return processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()


def test_the_stand_in_is_gemma4_with_verls_gemma4_builder(processor):
    """The real transformers classes of model type gemma4 (tied LM head, soft-token budget in the vision config as
    the released config.json has it), and verl's Gemma 4 vision-language Continuous-Token builder."""
    from transformers import AutoConfig
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    config = AutoConfig.from_pretrained(tiny_model_path(family="gemma4"))
    assert (config.model_type, config.tie_word_embeddings) == ("gemma4", True)
    assert config.vision_config.default_output_length == processor.image_processor.max_soft_tokens == 70
    assert config.text_config.layer_types == ["sliding_attention", "full_attention"]
    assert config.get_text_config().vocab_size >= 32
    builder = create_continuous_token_builder(processor.tokenizer, hf_model_type="gemma4", processor=processor)
    assert type(builder).__name__ == "Gemma4VLContinuousTokenBuilder"
    assert type(processor).__name__ == "Gemma4Processor"


def test_auto_splits_tool_images_into_a_user_turn_because_the_template_drops_them(processor):
    """Gemma 4's template renders tool schemas and has its own tool-result convention, but renders only the text of a
    tool message and only results that follow structured calls: auto resolves to the template's schemas and the
    split role; the tool role, which would lose every tool image, is refused with the reason. Its history is not
    what the model generated after (export: per_trajectory gets the warning of templates that rewrite history)."""
    traits = template_traits(processor)
    assert traits == TemplateTraits(
        renders_tools=True,
        tool_role_convention=True,
        prefix_stable=False,  # the generation prompt's empty thought channel is not in the history's render
        renders_tool_images=False,
        renders_results_without_calls=False,
    )
    resolved = resolve_tool_format(ToolPrompt.AUTO, ToolResponseRole.AUTO, traits, "gemma4")
    assert (resolved.tool_prompt, resolved.response_role) == (ToolPrompt.TEMPLATE, ToolResponseRole.SPLIT)
    with pytest.raises(ConfigError, match="renders only the text of a tool message"):
        resolve_tool_format(ToolPrompt.AUTO, ToolResponseRole.TOOL, traits, "gemma4")


def test_the_budget_counts_gemmas_soft_tokens(processor):
    """The processor scales every image, up or down, to the largest whole-soft-token size within max_soft_tokens (48
    px per soft token): the budget's count equals the processor's own for every size, honours
    data.mm_processor_kwargs.max_soft_tokens, keeps a small image as it is (the processor scales it the same either
    way) and refuses mm_tool pixel bounds, which cannot apply."""
    geometry = ImageGeometry.from_processor(processor)
    assert isinstance(geometry, SoftTokenGeometry) and geometry.factor == 48
    sizes = [(448, 448), (1000, 300), (84, 56), (20, 20), (650, 11)]
    counted = processor.image_processor(images=[Image.new("RGB", size) for size in sizes])["num_soft_tokens_per_image"]
    assert [geometry.tokens(*size) for size in sizes] == list(counted) == [64, 60, 60, 64, 64]
    assert processor_image_tokens(processor, Image.new("RGB", (448, 448))) == 64
    assert ImageGeometry.from_processor(processor, {"max_soft_tokens": 280}).tokens(448, 448) == 256
    assert geometry.resized(84, 56, 0, 0) == (84, 56)
    assert geometry.resized(1000, 300, 0, 0) == (720, 192)
    check_pixel_bounds(MMToolLoopConfig(), geometry)
    with pytest.raises(ConfigError, match="max_soft_tokens"):
        check_pixel_bounds(MMToolLoopConfig(max_pixels=100_000), geometry)


def test_golden_trajectory(tmp_path, processor):
    """Two rotate calls and an answer: each call's result follows inside its model turn as the template renders it,
    named by its call; the rotated image follows in a user turn, before which verl's builder closes the model turn
    with <turn|> (the template, which expects the model to go on after results, leaves it open); the generated
    spans are trained with their log-probs; each image's placeholder run has the processor's soft-token count."""
    output, server, worker = run(tmp_path, TURNS)
    row = unpadded_row(output)
    prompt_image = server.requests[0]["images"][0]
    rotated = prompt_image.rotate(90, expand=True)
    images = [prompt_image, rotated, rotated]
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in worker.tools]
    prompt_text = processor.apply_chat_template(
        image_prompt(QUESTION, [prompt_image]), tools=schemas, tokenize=False, add_generation_prompt=True
    )
    assert prompt_text.endswith(f"<|image|>{QUESTION}<turn|>\n{MODEL_TURN}")
    tool_images = "<turn|>\n<|turn>user\n<|image|><turn|>\n" + MODEL_TURN
    stream = (
        prompt_text
        + CALLS[0]
        + result(tool_text(2, rotated))
        + tool_images
        + CALLS[1]
        + result(tool_text(3, rotated))
        + tool_images
        + ANSWER
    )
    assert row["prompt_ids"] == ids_of(processor, prompt_text, images[:1])
    assert row["prompt_ids"] + row["response_ids"] == ids_of(processor, stream, images)

    tokenizer = worker.tokenizer
    generated = [tokenizer.encode(turn, add_special_tokens=False) for turn in TURNS]
    expected_mask, expected_logprobs = scripted_turn_expectations(row["response_ids"], generated)
    assert row["response_mask"] == expected_mask
    assert row["logprobs"] == pytest.approx(expected_logprobs, abs=1e-7)
    # generation stops at the parser's <tool_call|> (verl adds it to the stop tokens) and at <turn|>
    stops = [request["sampling_params"].get("stop_token_ids") for request in server.requests]
    assert stops == [[tokenizer.convert_tokens_to_ids("<tool_call|>")]] * 3

    image_positions = output.non_tensor_batch["multi_modal_inputs"][0]["image_position_ids"]
    assert image_positions.shape == (3, 70 * 9, 2)  # every image padded to the soft-token budget's patches
    assert output.non_tensor_batch["mm_tool/image_tokens"][0] == 3 * 60
    assert output.non_tensor_batch["tool_call_counts"][0] == 2
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0


def test_per_turn_samples_are_the_templates_own_render(tmp_path, processor):
    """export: per_turn: each sample's prompt is the template's render of the conversation so far, the turns that
    called tools as verl parsed them (the template renders results only from their calls), the results named and
    the images in their user turns; its response exactly the turn's generated tokens, all trained."""
    output, server, worker = run(tmp_path, TURNS, per_sample=True, loop_options={"export": "per_turn"}, extra=V1)
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 3], [1, 3], [2, 3]]
    prompt_image = server.requests[0]["images"][0]
    rotated = prompt_image.rotate(90, expand=True)
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in worker.tools]
    conversation, images = image_prompt(QUESTION, [prompt_image]), [prompt_image]
    for k, (turn, arguments) in enumerate(zip(TURNS, [{"degrees": 90}, {"degrees": 90, "image_id": 1}, None])):
        sample = unpadded_row(output, k)
        text = processor.apply_chat_template(conversation, tools=schemas, tokenize=False, add_generation_prompt=True)
        assert sample["prompt_ids"] == server.requests[k]["prompt_ids"] == ids_of(processor, text, images), k
        generated = worker.tokenizer.encode(turn, add_special_tokens=False)
        assert sample["response_ids"] == generated
        assert sample["response_mask"] == [1] * len(generated)
        if arguments is not None:
            call = {"type": "function", "function": {"name": "rotate", "arguments": arguments}}
            conversation = [
                *conversation,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "rotate", "content": tool_text(k + 2, rotated)},
                {"role": "user", "content": [{"type": "image", "image": rotated}]},
            ]
            images = [*images, rotated]
    # the template leaves the model turn open before the tool images' user turn (no <turn|>)
    assert "<tool_response|><|turn>user\n" in text


def test_rollout_logprobs_equal_a_full_forward(tmp_path):
    """Log-probs from the real tiny model at each turn (teacher-forced), and the trainer's single float32 forward over
    the whole trajectory with verl's position ids and multi_modal_inputs (pixel values padded to the soft-token
    budget, image_position_ids): equal within 1e-5."""
    model = HFVisionLM(str(tiny_model_path(family="gemma4")))
    output, _, _ = run(
        tmp_path, TURNS, server=lambda tokenizer: ScriptedServer(tokenizer, TURNS, model=model), response_length=600
    )
    row = unpadded_row(output)
    mask = torch.tensor(row["response_mask"]).bool()
    rollout, recomputed = torch.tensor(row["logprobs"]), trainer_logprobs(model, output)
    assert mask.sum() > 30
    assert torch.allclose(recomputed[mask], rollout[mask], atol=1e-5), (recomputed[mask] - rollout[mask]).abs().max()
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0


def test_an_unparsable_call_is_answered_in_gemmas_format_and_a_placeholder_masks(tmp_path):
    """A call whose arguments cannot be read (an unterminated list) counts as attempted by Gemma's own call tag (a
    special token) and is answered as a named result in the call's model turn with how to write a call; a
    trajectory in which the model writes Gemma's image placeholder is masked and says why."""
    broken = "<|tool_call>call:rotate{degrees:[90}<tool_call|>"
    output, _, worker = run(tmp_path, [broken, ANSWER])
    text = worker.tokenizer.decode(unpadded_row(output)["response_ids"])
    answer = f'<|tool_response>response:unparsed_call{{value:<|"|>{MALFORMED_CALL_TEXT_OTHER_FORMATS}<|"|>}}'
    assert text == f"{broken}{answer}<tool_response|>{ANSWER}"
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0

    output, _, _ = run(tmp_path, ["<answer><|image|></answer><turn|>"])
    assert output.non_tensor_batch["mm_tool/masked"][0] == 1
    assert "vision placeholder" in output.non_tensor_batch["mm_tool/error"][0]
