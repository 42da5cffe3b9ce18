"""The mm_tool loop on the VLM families beyond Qwen-VL that verl 0.9.1 builds tokens for: Qwen3-VL MoE, Qwen3.5 and
GLM-V (GLM-4.1V/4.5V/4.6V, dense and MoE). Each tiny stand-in speaks its family's token format (tool calls, stop
tokens, image placeholders, thinking); these tests pin what the loop produces on it through verl's real
AgentLoopWorker: exact ids, masks and log-probs against the template's own render, per-turn samples, the image check
on the family's own placeholder, and rollout log-probs a float32 forward reproduces."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from PIL import Image

from verl_mm_tools.agent_loop.budget import ImageGeometry
from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.agent_loop.tool_format import template_traits
from verl_mm_tools.cpu.hf_engine import HFVisionLM
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import SCRIPTED_WEIGHTS_STEP
from verl_mm_tools.testkit.rows import marked_image, trainer_logprobs
from verl_mm_tools.testkit.scripted import ScriptedServer, scripted_turn_expectations
from verl_mm_tools.tiny import FAMILIES, tiny_model_path
from verl_mm_tools.tokens import processor_image_tokens
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

pytestmark = pytest.mark.integration  # every family's tiny model through verl's worker

QUESTION = "How far is this image rotated?"
V1 = ("trainer.use_v1=true", MANAGER_TQ_OVERRIDE)


@dataclass(frozen=True)
class Dialect:
    """How a family's model writes a turn after the generation prompt: what it writes first (the rest of the thinking
    block the prompt opened), its tool-call format, and the token it stops at after a call and after an answer."""

    parser: str
    opening: str
    call_end: str
    answer_end: str

    def call(self, name: str, **arguments) -> str:
        if self.parser == "glm":
            pairs = "".join(
                f"\n<arg_key>{key}</arg_key>\n<arg_value>{json.dumps(value)}</arg_value>"
                for key, value in arguments.items()
            )
            body = f"<tool_call>{name}{pairs}\n</tool_call>"
        elif self.parser == "qwen3_coder":
            parameters = "".join(
                f"<parameter={key}>\n{json.dumps(value)}\n</parameter>\n" for key, value in arguments.items()
            )
            body = f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"
        else:
            body = f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
        return self.opening + body + self.call_end

    def answer(self, text: str) -> str:
        return self.opening + text + self.answer_end


GLM = Dialect("glm", opening="\n<think></think>\n", call_end="<|observation|>", answer_end="<|user|>")
DIALECTS = {
    "qwen3_vl_moe": Dialect("hermes", opening="", call_end="<|im_end|>", answer_end="<|im_end|>"),
    # Qwen3.5 thinks by default: the generation prompt opens <think>, the model closes it
    "qwen3_5": Dialect("qwen3_coder", opening="\n</think>\n\n", call_end="<|im_end|>", answer_end="<|im_end|>"),
    "glm4v": GLM,
    "glm4v_moe": GLM,
}
NEW_FAMILIES = sorted(DIALECTS)


def turns_of(dialect: Dialect) -> list[str]:
    return [
        dialect.call("rotate", degrees=90),
        dialect.call("rotate", degrees=90, image_id=1),
        dialect.answer("<answer>90</answer>"),
    ]


def rollout_for(family: str, tmp_path) -> LocalRollout:
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    return LocalRollout(tiny_model_path(family=family), tools_yaml, tmp_path)


def parser_override(family: str) -> str:
    return f"actor_rollout_ref.rollout.multi_turn.format={DIALECTS[family].parser}"


def structured_conversation(prompt_image, rotated, tool_texts) -> list[dict]:
    """The trajectory as an OpenAI-style conversation: what the family's own template renders it from."""
    calls = [{"degrees": 90}, {"degrees": 90, "image_id": 1}]
    conversation = image_prompt(QUESTION, [prompt_image])
    for arguments, text in zip(calls, tool_texts):
        conversation += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "rotate", "arguments": arguments}}],
            },
            {"role": "tool", "content": [{"type": "image", "image": rotated}, {"type": "text", "text": text}]},
        ]
    return [*conversation, {"role": "assistant", "content": "<answer>90</answer>"}]


def render_ids(worker, messages, images, generation: bool) -> list[int]:
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in worker.tools]
    text = worker.processor.apply_chat_template(
        messages, tools=schemas, tokenize=False, add_generation_prompt=generation
    )
    return worker.processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()


def test_each_family_builds_with_its_own_verl_builder_and_tokens():
    """The stand-ins are the real transformers classes of their model type; verl picks its model-specific Continuous
    Token builder for each; MoE ones route between >= 2 experts."""
    from transformers import AutoConfig
    from verl.utils import hf_processor
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builders = {}
    for family in NEW_FAMILIES:
        path = tiny_model_path(family=family)
        config = AutoConfig.from_pretrained(path)
        assert config.model_type == family
        processor = hf_processor(str(path))
        builder = create_continuous_token_builder(processor.tokenizer, hf_model_type=family, processor=processor)
        builders[family] = type(builder).__name__
        assert config.get_text_config().vocab_size >= 32
    assert builders == {
        "glm4v": "GLM46VContinuousTokenBuilder",
        "glm4v_moe": "GLM46VContinuousTokenBuilder",
        "qwen3_5": "QwenVLContinuousTokenBuilder",
        "qwen3_vl_moe": "QwenVLContinuousTokenBuilder",
    }
    moe = AutoConfig.from_pretrained(tiny_model_path(family="qwen3_vl_moe")).text_config
    assert (moe.num_experts, moe.num_experts_per_tok) == (4, 2)
    glm_moe = AutoConfig.from_pretrained(tiny_model_path(family="glm4v_moe")).text_config
    assert (glm_moe.n_routed_experts, glm_moe.num_experts_per_tok) == (4, 2)
    assert AutoConfig.from_pretrained(tiny_model_path(family="qwen3_5")).text_config.layer_types == [
        "linear_attention",
        "full_attention",
    ]


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_tokens_per_448px_image_follow_each_familys_resize(family, tmp_path):
    """The budget counts each family's own tokens: Qwen3's 32 px tokens, GLM's 28 px tokens with its pixel bounds
    counted over two frames. At the tiny processors' budget (64 tokens) a 448 px square is 8x8 tokens for both."""
    from verl.utils import hf_processor

    processor = hf_processor(str(tiny_model_path(family=family)))
    geometry = ImageGeometry.from_processor(processor)
    square = Image.new("RGB", (448, 448))
    assert geometry.tokens(448, 448) == processor_image_tokens(processor, square) == 64
    assert geometry.factor == (28 if family.startswith("glm") else 32)
    assert geometry.max_pixels == 64 * geometry.factor**2
    # an image the budget sized is one the processor keeps as it is: its grid equals the budget's tokens
    width, height = geometry.resized(1000, 300, geometry.min_pixels, geometry.max_pixels)
    grid = processor.image_processor(images=[Image.new("RGB", (width, height))], return_tensors="pt")["image_grid_thw"]
    assert grid[0].tolist() == [1, height // geometry.patch_size, width // geometry.patch_size]
    # GLM counts odd sizes its own way (a side under 28 px is scaled up): the budget asks the processor
    assert geometry.tokens(650, 11) == processor_image_tokens(processor, Image.new("RGB", (650, 11)))


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_tool_format_auto_resolves_to_the_familys_own_template(family):
    """Every new family's template renders tool schemas and has its own tool-result convention: mm_tool passes the
    schemas to the template and keeps tool messages (GLM: <|observation|>, Qwen: <tool_response> user turns)."""
    from verl.utils import hf_processor

    traits = template_traits(hf_processor(str(tiny_model_path(family=family))))
    assert traits.renders_tools and traits.tool_role_convention
    assert FAMILIES[family].tool_parser == DIALECTS[family].parser


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_golden_trajectory_equals_the_templates_render(family, tmp_path):
    """Two rotate calls and an answer in the family's own format: the token stream is the template's render of the
    structured conversation (tool calls as the template writes them), the generated spans are trained with their
    log-probs, and each image's placeholder run has the processor's token count."""
    dialect = DIALECTS[family]
    turns = turns_of(dialect)
    output, server, worker = rollout_for(family, tmp_path).run(
        turns, [image_prompt(QUESTION, [marked_image()])], extra=[parser_override(family)]
    )
    row = unpadded_row(output)
    tokenizer = worker.tokenizer
    prompt_image = server.requests[0]["images"][0]
    rotated = prompt_image.rotate(90, expand=True)
    size = f"{rotated.width}x{rotated.height}"
    tool_texts = [f"Image {k}: Image 1 rotated by 90 degrees counter-clockwise, {size} px." for k in (2, 3)]

    images = [prompt_image, rotated, rotated]
    prompt = render_ids(worker, image_prompt(QUESTION, [prompt_image]), images[:1], generation=True)
    full = render_ids(worker, structured_conversation(prompt_image, rotated, tool_texts), images, generation=False)
    stop = tokenizer.convert_tokens_to_ids(dialect.answer_end)
    # the template closes the last turn with <|im_end|> and a newline (Qwen), or not at all (GLM: the next role token
    # ends it); generation stops at the stop token
    expected_stream = full[:-1] if full[-2] == stop else [*full, stop]
    assert row["prompt_ids"] == prompt
    assert prompt + row["response_ids"] == expected_stream
    assert tokenizer.decode(row["response_ids"][-1:]) == dialect.answer_end

    generated = [tokenizer.encode(turn, add_special_tokens=False) for turn in turns]
    expected_mask, expected_logprobs = scripted_turn_expectations(row["response_ids"], generated)
    response = row["response_ids"]
    assert row["response_mask"] == expected_mask
    assert row["logprobs"] == pytest.approx(expected_logprobs, abs=1e-7)

    inputs = output.non_tensor_batch["multi_modal_inputs"][0]
    grids = inputs["image_grid_thw"].tolist()
    tokens_per_image = [processor_image_tokens(worker.processor, image) for image in images]
    assert [t * h * w // 4 for t, h, w in grids] == tokens_per_image
    placeholder = tokenizer.convert_tokens_to_ids(worker.processor.image_token)
    assert (prompt + response).count(placeholder) == sum(tokens_per_image)
    assert output.non_tensor_batch["mm_tool/image_tokens"][0] == sum(tokens_per_image)
    assert output.non_tensor_batch["tool_call_counts"][0] == 2
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_a_generated_vision_placeholder_masks_the_trajectory(family, tmp_path):
    """The model writing the family's own image placeholder (GLM's <|image|>, not Qwen's <|image_pad|>) is caught by
    the trajectory check: the trajectory is masked and says why, never sent to the trainer with broken features."""
    dialect = DIALECTS[family]
    placeholder = "<|image|>" if family.startswith("glm") else "<|image_pad|>"
    output, _, _ = rollout_for(family, tmp_path).run(
        [dialect.answer(f"<answer>{placeholder}</answer>")],
        [image_prompt(QUESTION, [marked_image()])],
        extra=[parser_override(family)],
    )
    assert output.non_tensor_batch["mm_tool/masked"][0] == 1
    assert "vision placeholder" in output.non_tensor_batch["mm_tool/error"][0]
    # the turn was generated: its weight version stays (verl's v1 trainer reads it for every sample)
    assert output.non_tensor_batch["min_global_steps"][0] == SCRIPTED_WEIGHTS_STEP
    assert output.non_tensor_batch["max_global_steps"][0] == SCRIPTED_WEIGHTS_STEP


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_per_turn_samples_are_the_templates_own_render(family, tmp_path):
    """export: per_turn: each sample's prompt is the template's render of the conversation so far (earlier turns as
    the text the model wrote), its response exactly the turn's generated tokens, all trained."""
    dialect = DIALECTS[family]
    turns = turns_of(dialect)
    output, server, worker = rollout_for(family, tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        per_sample=True,
        loop_options={"export": "per_turn"},
        extra=[*V1, parser_override(family)],
    )
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 3], [1, 3], [2, 3]]
    prompt_image = server.requests[0]["images"][0]
    rotated = prompt_image.rotate(90, expand=True)
    conversation, images = image_prompt(QUESTION, [prompt_image]), [prompt_image]
    for k, turn in enumerate(turns):
        sample = unpadded_row(output, k)
        expected = render_ids(worker, conversation, images, generation=True)
        assert sample["prompt_ids"] == expected, k
        assert server.requests[k]["prompt_ids"] == expected
        generated = worker.tokenizer.encode(turn, add_special_tokens=False)
        assert sample["response_ids"] == generated
        assert sample["response_mask"] == [1] * len(generated)
        ended = turn.removesuffix(dialect.call_end).removesuffix(dialect.answer_end)
        conversation = [*conversation, {"role": "assistant", "content": ended}]
        if k < 2:
            text = (
                f"Image {k + 2}: Image 1 rotated by 90 degrees counter-clockwise, {rotated.width}x{rotated.height} px."
            )
            conversation.append(
                {"role": "tool", "content": [{"type": "image", "image": rotated}, {"type": "text", "text": text}]}
            )
            images = [*images, rotated]


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_rollout_logprobs_equal_a_full_forward(family, tmp_path):
    """Log-probs from the real tiny model at each turn (teacher-forced), and the trainer's single float32 forward over
    the whole trajectory with verl's position ids and multi_modal_inputs: equal within 1e-5."""
    model = HFVisionLM(str(tiny_model_path(family=family)))
    turns = turns_of(DIALECTS[family])
    output, _, _ = rollout_for(family, tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()])],
        server=lambda tokenizer: ScriptedServer(tokenizer, turns, model=model),
        response_length=400,
        extra=[parser_override(family)],
    )
    row = unpadded_row(output)
    recomputed = trainer_logprobs(model, output)
    mask = torch.tensor(row["response_mask"]).bool()
    rollout = torch.tensor(row["logprobs"])
    assert mask.sum() > 30
    assert torch.allclose(recomputed[mask], rollout[mask], atol=1e-5), (recomputed[mask] - rollout[mask]).abs().max()
    assert output.non_tensor_batch["mm_tool/masked"][0] == 0


@pytest.mark.parametrize("family", ["glm4v", "qwen2_5_vl"])
def test_the_budget_reads_mm_processor_kwargs_as_the_processor_does(family):
    """verl passes data.mm_processor_kwargs to the processor: a ``size`` bounds every family's images; ``min_pixels``
    with ``max_pixels`` only Qwen-VL's, and only both together (transformers 5 ignores one alone; GLM-V's processor
    ignores both, with transformers' warning). The budget counts what the processor then does, token for token."""
    from verl.utils import hf_processor

    processor = hf_processor(str(tiny_model_path(family=family)))
    square = Image.new("RGB", (448, 448))
    frames = 2 if family.startswith("glm") else 1  # GLM's bounds count an image as two frames
    cases = [
        {"min_pixels": 784, "max_pixels": 784 * 16},
        {"max_pixels": 784 * 16},
        {"size": {"shortest_edge": 784 * frames, "longest_edge": 784 * 25 * frames}},
    ]
    for kwargs in cases:
        geometry = ImageGeometry.from_processor(processor, kwargs)
        text = processor.apply_chat_template(image_prompt("hi", [square]), tokenize=False)
        grid = processor(text=[text], images=[square], return_tensors="pt", **kwargs)["image_grid_thw"][0].tolist()
        assert geometry.tokens(448, 448) == grid[1] * grid[2] // 4, kwargs
    assert ImageGeometry.from_processor(processor, cases[1]).tokens(448, 448) == 64  # max_pixels alone: ignored
    ignores_pixel_bounds = ImageGeometry.from_processor(processor, cases[0]).tokens(448, 448) == 64
    assert ignores_pixel_bounds == family.startswith("glm")
