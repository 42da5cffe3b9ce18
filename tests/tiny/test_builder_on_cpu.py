"""The embedded tiny VLMs: deterministic builds, loading through transformers and verl, the chat template, and
verl's Continuous-Token builder on them."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoProcessor

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.families.vocabularies import QWEN_VOCABULARY
from verl_mm_tools.tiny import TinyModelSpec, build_tiny_model, tiny_model_path
from verl_mm_tools.tiny.builder import BUILDER_VERSION, COMPLETE_MARKER

pytestmark = pytest.mark.integration  # builds tiny models

ROTATE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "rotate",
        "description": "Rotate an image.",
        "parameters": {
            "type": "object",
            "properties": {"degrees": {"type": "number", "description": "Angle."}},
            "required": ["degrees"],
        },
    },
}
TOOL_CALL_TEXT = '<tool_call>\n{"name": "rotate", "arguments": {"degrees": 90}}\n</tool_call><|im_end|>'


def solid(color, size=(56, 56)):
    return Image.new("RGB", size, color)


def tool_conversation(first, second):
    return [
        {"role": "user", "content": [{"type": "image", "image": first}, {"type": "text", "text": "Rotate it."}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "rotate", "arguments": {"degrees": 90}}}],
        },
        {"role": "tool", "content": [{"type": "image", "image": second}, {"type": "text", "text": "Image 2: done"}]},
    ]


def test_same_seed_builds_identical_models_and_other_seed_differs(tmp_path):
    first = build_tiny_model(tmp_path / "a", TinyModelSpec(seed=3))
    second = build_tiny_model(tmp_path / "b", TinyModelSpec(seed=3))
    other = build_tiny_model(tmp_path / "c", TinyModelSpec(seed=4))
    weights_a, weights_b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    weights_c = load_file(other / "model.safetensors")
    assert not torch.equal(weights_a["lm_head.weight"], weights_c["lm_head.weight"])


def test_cache_is_reused_and_rebuilt_when_the_builder_version_changes(tmp_path):
    path = tiny_model_path(out=tmp_path / "m")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_path(out=path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    assert marker["builder_version"] == BUILDER_VERSION
    marker["builder_version"] = BUILDER_VERSION - 1
    (path / COMPLETE_MARKER).write_text(json.dumps(marker))
    tiny_model_path(out=path)
    assert json.loads((path / COMPLETE_MARKER).read_text())["builder_version"] == BUILDER_VERSION


@pytest.mark.parametrize(
    ("family", "layer"),
    [("qwen2_5_vl", "visual.merger.mlp.2.weight"), ("qwen3_vl", "model.visual.merger.linear_fc2.weight")],
)
def test_vision_output_scale_multiplies_the_merger_output_layer_only(tmp_path, family, layer):
    plain = load_file(build_tiny_model(tmp_path / "a", TinyModelSpec(family=family)) / "model.safetensors")
    spec = TinyModelSpec(family=family, vision_output_scale=10.0)
    scaled = load_file(build_tiny_model(tmp_path / "b", spec) / "model.safetensors")
    assert torch.equal(scaled[layer], 10.0 * plain[layer])
    assert [name for name in plain if not torch.equal(plain[name], scaled[name])] == [layer]
    assert spec.cache_name() == f"tiny-{family}-vision10x-seed0-v{BUILDER_VERSION}"
    assert TinyModelSpec(family=family).cache_name() == f"tiny-{family}-seed0-v{BUILDER_VERSION}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vision_output_scale": 0.0}, r"vision_output_scale must be a positive finite number; got 0.0"),
        ({"vision_output_scale": float("nan")}, r"must be a positive finite number; got nan"),
        ({"vision_output_scale": float("inf")}, r"must be a positive finite number; got inf"),
        ({"family": "gemma4", "vision_output_scale": 10.0}, r"built for the Qwen-VL families .* not 'gemma4'"),
    ],
)
def test_a_vision_output_scale_that_cannot_be_built_is_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TinyModelSpec(**kwargs)


def test_unknown_family_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown tiny model family 'qwen25_vl'.*Did you mean 'qwen2_5_vl'"):
        TinyModelSpec(family="qwen25_vl")


def test_tokenizer_has_qwen_special_tokens_in_order_and_one_newline_token(tiny_tokenizer):
    special = QWEN_VOCABULARY.special
    assert [tiny_tokenizer.convert_tokens_to_ids(token) for token in special] == list(range(len(special)))
    assert len(tiny_tokenizer.encode("\n", add_special_tokens=False)) == 1
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    call_ids = tiny_tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False)
    # <tool_call> tags are ordinary added tokens: skip_special_tokens keeps them, so the hermes parser sees them.
    assert tiny_tokenizer.decode(call_ids, skip_special_tokens=True) == TOOL_CALL_TEXT.removesuffix("<|im_end|>")
    assert tiny_tokenizer.decode(call_ids) == TOOL_CALL_TEXT


def family_processor(family: str, template: str = "family"):
    from verl.utils import hf_processor

    return hf_processor(str(tiny_model_path(family=family, template=template)))


VISION = "<|vision_start|><|image_pad|><|vision_end|>"
TOOL_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    f"signatures within <tools></tools> XML tags:\n<tools>\n{json.dumps(ROTATE_SCHEMA)}\n</tools>\n\nFor each "
    "function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen2_family_templates_ignore_tools_and_render_a_plain_tool_role(family):
    """The official Qwen2-VL / Qwen2.5-VL format: default system prompt, no tool schemas, assistant tool calls
    dropped, a tool result as a bare ``tool`` turn (its image rendered), the same text with or without ``tools``."""
    processor = family_processor(family)
    messages = tool_conversation(solid("red"), solid("blue"))
    text = processor.apply_chat_template(messages, tools=[ROTATE_SCHEMA], tokenize=False, add_generation_prompt=True)
    assert text == processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{VISION}Rotate it.<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        f"<|im_start|>tool\n{VISION}Image 2: done<|im_end|>\n<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert processor.apply_chat_template(system, tokenize=False, add_vision_id=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )
    labelled = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}]
    assert processor.apply_chat_template(labelled, tokenize=False, add_vision_id=True).endswith(
        f"<|im_start|>user\nPicture 1: {VISION}Picture 2: {VISION}<|im_end|>\n"
    )


def test_qwen3_family_template_renders_tools_in_the_system_prompt_and_tool_responses_in_user_turns():
    processor = family_processor("qwen3_vl")
    messages = [*tool_conversation(solid("red"), solid("blue")), {"role": "tool", "content": "two"}]
    text = processor.apply_chat_template(messages, tools=[ROTATE_SCHEMA], tokenize=False, add_generation_prompt=True)
    assert text == (
        f"<|im_start|>system\n{TOOL_BLOCK}<|im_end|>\n"
        f"<|im_start|>user\n{VISION}Rotate it.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "rotate", "arguments": {"degrees": 90}}\n</tool_call><|im_end|>\n'
        f"<|im_start|>user\n<tool_response>\n{VISION}Image 2: done\n</tool_response>\n<tool_response>\ntwo\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # no default system prompt; a system message goes before the tool block
    user = [{"role": "user", "content": "hi"}]
    assert processor.apply_chat_template(user, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    system = [{"role": "system", "content": "Be brief."}, *user]
    assert processor.apply_chat_template(system, tools=[ROTATE_SCHEMA], tokenize=False).startswith(
        f"<|im_start|>system\nBe brief.\n\n{TOOL_BLOCK}<|im_end|>\n<|im_start|>user\nhi"
    )


def test_tool_aware_template_renders_tools_tool_calls_and_tool_images():
    processor = family_processor("qwen2_5_vl", template="tool_aware")
    messages = tool_conversation(solid("red"), solid("blue"))
    text = processor.apply_chat_template(messages, tools=[ROTATE_SCHEMA], tokenize=False, add_generation_prompt=True)
    assert text == (
        f"<|im_start|>system\nYou are a helpful assistant.\n\n{TOOL_BLOCK}<|im_end|>\n"
        f"<|im_start|>user\n{VISION}Rotate it.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "rotate", "arguments": {"degrees": 90}}\n</tool_call><|im_end|>\n'
        f"<|im_start|>user\n<tool_response>\n{VISION}Image 2: done\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_aware_template_string_arguments_and_grouped_tool_messages():
    processor = family_processor("qwen2_5_vl", template="tool_aware")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\nok\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response><|im_end|>\n"
    )


def test_language_model_head_size_is_32_for_vllm(tiny_family_dir):
    """vLLM's CPU attention supports head sizes 32-512: the tiny models must load in a vLLM engine."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_family_dir[1]).text_config
    assert getattr(config, "head_dim", None) in (None, 32)
    assert config.hidden_size // config.num_attention_heads == 32


def test_unknown_template_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown tiny model template 'tool-aware'.*Did you mean 'tool_aware'"):
        TinyModelSpec(template="tool-aware")


@pytest.mark.parametrize(("size", "expected_tokens"), [((56, 56), 4), ((112, 56), 8), ((30, 30), 1)])
def test_processor_expands_one_image_pad_per_merged_patch(tiny_processor, size, expected_tokens):
    messages = [{"role": "user", "content": [{"type": "image", "image": solid("red", size)}]}]
    text = tiny_processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tiny_processor(text=[text], images=[solid("red", size)], return_tensors="pt")
    image_pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == image_pad).sum()) == expected_tokens
    assert int(inputs["image_grid_thw"].prod()) == 4 * expected_tokens
    assert inputs["pixel_values"].shape[0] == 4 * expected_tokens


def test_families_load_generate_and_round_trip_through_continuous_tokens(tiny_family_dir):
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.tokenizer.continuous_token import QwenVLContinuousTokenBuilder
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    family, path = tiny_family_dir
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert model.config.model_type == family
    assert type(AutoProcessor.from_pretrained(path)).__name__ == type(hf_processor(str(path))).__name__
    tokenizer, processor = hf_tokenizer(str(path)), hf_processor(str(path))
    builder = create_continuous_token_builder(tokenizer, hf_model_type=family, processor=processor)
    assert type(builder) is QwenVLContinuousTokenBuilder

    first, second = solid("red"), solid("blue", (84, 56))
    conversation = tool_conversation(first, second)
    prompt_ids = builder.build_initial_tokens(conversation[:1], tools=[ROTATE_SCHEMA], images=[first])
    generated = tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False)
    after_call = builder.merge_assistant_tokens(prompt_ids, generated).token_ids
    merged = builder.merge_context_tokens(conversation[:2], conversation, after_call, tools=[ROTATE_SCHEMA])

    # the history as the model saw it: its own call text (the Qwen2/2.5-VL templates drop ``tool_calls``)
    history = [
        conversation[0],
        {"role": "assistant", "content": TOOL_CALL_TEXT.removesuffix("<|im_end|>")},
        conversation[2],
    ]
    text = processor.apply_chat_template(history, tools=[ROTATE_SCHEMA], tokenize=False, add_generation_prompt=True)
    full = processor(text=[text], images=[first, second], return_tensors="pt")
    assert merged.token_ids == full["input_ids"][0].tolist()
    assert merged.inserted_token_ids == tokenizer.encode("\n", add_special_tokens=False)

    with torch.no_grad():
        out = model.generate(**full, min_new_tokens=5, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, full["input_ids"].shape[1] + 5)
    assert torch.equal(out[0, : full["input_ids"].shape[1]], full["input_ids"][0])
