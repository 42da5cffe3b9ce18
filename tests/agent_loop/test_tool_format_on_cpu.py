"""How tools reach the model: the template probe, the hermes tool block, tool results as user turns, and the exact
tokens of a tool trajectory through verl's real AgentLoopWorker for each tool_prompt / tool_response_role setting on
the Qwen2.5-VL-format and Qwen3-VL-format tiny models."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from verl_mm_tools.agent_loop.tool_format import (
    TemplateTraits,
    ToolFormat,
    resolve_tool_format,
    system_tool_block,
    template_traits,
    tool_results_as_user_turns,
    with_tool_block,
)
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

pytestmark = pytest.mark.integration  # every family's chat template

SCHEMA = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    'signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": "f", '
    '"parameters": {"type": "object", "properties": {}}}}\n</tools>\n\nFor each function call, return a json object '
    "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
QUESTION = "How far is this image turned?"  # names no tool: "rotated" would contain the tool's name
TURNS = [tool_call_text("rotate", degrees=90), "<answer>90</answer><|im_end|>"]
TOOL_TEXT = "Image 2: Image 1 rotated by 90 degrees counter-clockwise, 56x84 px."


def test_tool_block_is_the_hermes_block_of_qwens_tool_templates():
    assert system_tool_block([SCHEMA]) == BLOCK


def test_tool_block_joins_the_system_message_or_brings_the_default_one():
    user = {"role": "user", "content": "q"}
    assert with_tool_block([user], [SCHEMA]) == [
        {"role": "system", "content": "You are a helpful assistant.\n\n" + BLOCK},
        user,
    ]
    assert with_tool_block([{"role": "system", "content": "Be brief."}, user], [SCHEMA])[0] == {
        "role": "system",
        "content": "Be brief.\n\n" + BLOCK,
    }
    listed = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert with_tool_block([listed, user], [SCHEMA])[0]["content"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "\n\n" + BLOCK},
    ]


def test_consecutive_tool_results_become_one_user_turn_with_images_in_place():
    image = Image.new("RGB", (4, 4))
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": [{"type": "image", "image": image}, {"type": "text", "text": "one"}]},
        {"role": "tool", "content": "two"},
        {"role": "assistant", "content": "b"},
        {"role": "tool", "content": "three"},
    ]
    assert tool_results_as_user_turns(messages) == [
        *messages[:2],
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<tool_response>\n"},
                {"type": "image", "image": image},
                {"type": "text", "text": "one\n</tool_response>\n<tool_response>\ntwo\n</tool_response>"},
            ],
        },
        messages[4],
        {"role": "user", "content": "<tool_response>\nthree\n</tool_response>"},
    ]


@pytest.mark.parametrize(
    ("family", "template", "expected"),
    [
        ("qwen2_vl", "family", TemplateTraits(renders_tools=False, tool_role_convention=False)),
        ("qwen2_5_vl", "family", TemplateTraits(renders_tools=False, tool_role_convention=False)),
        ("qwen3_vl", "family", TemplateTraits(renders_tools=True, tool_role_convention=True)),
        ("qwen2_5_vl", "tool_aware", TemplateTraits(renders_tools=True, tool_role_convention=True)),
    ],
)
def test_template_probe_tells_the_families_apart(family, template, expected):
    from verl.utils import hf_processor

    processor = hf_processor(str(tiny_model_path(family=family, template=template)))
    assert template_traits(processor) == expected
    assert template_traits(processor.tokenizer) == expected


QWEN25, QWEN3 = TemplateTraits(False, False), TemplateTraits(True, True)


@pytest.mark.parametrize(
    ("options", "traits", "expected"),
    [
        (("auto", "auto"), QWEN25, ToolFormat("system", "user")),
        (("auto", "auto"), QWEN3, ToolFormat("template", "tool")),
        (("system", "tool"), QWEN25, ToolFormat("system", "tool")),
        (("off", "user"), QWEN3, ToolFormat("off", "user")),
    ],
)
def test_auto_settings_resolve_from_the_template(options, traits, expected):
    assert resolve_tool_format(*options, traits, "hermes") == expected


def test_settings_that_cannot_reach_the_model_are_refused():
    with pytest.raises(ConfigError, match="tool_prompt=template, but the chat template ignores the tool schemas"):
        resolve_tool_format("template", "auto", QWEN25, "hermes")
    with pytest.raises(ConfigError, match="multi_turn.format='gpt-oss'"):
        resolve_tool_format("auto", "auto", QWEN25, "gpt-oss")
    assert resolve_tool_format("auto", "auto", QWEN3, "gpt-oss") == ToolFormat("template", "tool")


# ----- exact tokens through verl's real AgentLoopWorker ---------------------------------------------------------


def rotate_block(worker) -> str:
    schema = worker.tools[0].tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    return BLOCK.replace(json.dumps(SCHEMA), json.dumps(schema))


def run_rotation(family: str, tmp_path, question: str = QUESTION, **loop_options):
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    image = Image.new("RGB", (84, 56), (200, 30, 30))
    return LocalRollout(tiny_model_path(family=family), tools_yaml, tmp_path).run(
        TURNS, [image_prompt(question, [image])], loop_options=loop_options
    )


def expected_ids(worker, server, system: str, tool_turn: str) -> list[int]:
    text = (
        f"{system}<|im_start|>user\n{VISION}{QUESTION}<|im_end|>\n<|im_start|>assistant\n{TURNS[0]}\n"
        f"{tool_turn}<|im_start|>assistant\n{TURNS[1]}"
    )
    images = server.requests[1]["images"]
    return worker.processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()


USER_TURN = f"<|im_start|>user\n<tool_response>\n{VISION}{TOOL_TEXT}\n</tool_response><|im_end|>\n"
TOOL_TURN = f"<|im_start|>tool\n{VISION}{TOOL_TEXT}<|im_end|>\n"


@pytest.mark.parametrize(
    ("family", "options", "default_system", "tool_turn"),
    [
        ("qwen2_5_vl", {}, True, USER_TURN),
        ("qwen2_5_vl", {"tool_prompt": "system", "tool_response_role": "tool"}, True, TOOL_TURN),
        ("qwen2_5_vl", {"tool_prompt": "system", "tool_response_role": "user"}, True, USER_TURN),
        ("qwen3_vl", {}, False, USER_TURN),
        ("qwen3_vl", {"tool_prompt": "system", "tool_response_role": "user"}, True, USER_TURN),
    ],
    ids=["qwen2.5-auto", "qwen2.5-system-tool", "qwen2.5-system-user", "qwen3-auto", "qwen3-system-user"],
)
def test_exact_tokens_of_a_tool_trajectory_per_setting(family, options, default_system, tool_turn, tmp_path):
    output, server, worker = run_rotation(family, tmp_path, **options)
    row = unpadded_row(output)
    if family == "qwen3_vl":
        tool_turn = tool_turn.replace("56x84", "64x96")  # Qwen3-VL's 32 px factor resizes the image to 96x64
    prefix = "You are a helpful assistant.\n\n" if default_system else ""
    system = f"<|im_start|>system\n{prefix}{rotate_block(worker)}<|im_end|>\n"
    assert row["prompt_ids"] + row["response_ids"] == expected_ids(worker, server, system, tool_turn)
    assert output.non_tensor_batch["tool_call_counts"][0] == 1
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"


def test_tool_prompt_off_leaves_the_tools_to_the_dataset_prompt(tmp_path):
    question = f"{QUESTION} Call rotate with degrees if needed."
    output, server, worker = run_rotation("qwen2_5_vl", tmp_path, question=question, tool_prompt="off")
    row = unpadded_row(output)
    text = (
        f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{VISION}{question}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    images = server.requests[0]["images"]
    assert row["prompt_ids"] == worker.processor(text=[text], images=images)["input_ids"][0]
    assert "<tool_response>" in worker.tokenizer.decode(row["response_ids"])


def test_a_tool_the_first_prompt_never_names_stops_the_run(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"the tools \['rotate'\] are configured but appear nowhere in the first "
        r"prompt.*tool_prompt='off'",
    ):
        run_rotation("qwen2_5_vl", tmp_path, tool_prompt="off")


def test_tool_prompt_template_on_a_template_that_ignores_tools_stops_the_run(tmp_path):
    # raised while verl builds the loop, so hydra wraps it
    with pytest.raises(Exception, match="ConfigError.*tool_prompt=template, but the chat template ignores"):
        run_rotation("qwen2_5_vl", tmp_path, tool_prompt="template")
