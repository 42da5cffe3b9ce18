"""vLLM reads every tiny chat template as it reads the official template of that family. vLLM decides from the
template's Jinja AST whether a message's content reaches the template as a string or as a list of parts
("openai"); the official Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-V templates iterate ``message['content']``
(or the macro argument ``content``) and are read as "openai". A template read as "string" gets its images flattened
into the text with a ``\\n`` after each: one prompt token more per image than the loop's (found with a real
``vllm serve``)."""

from __future__ import annotations

from importlib.resources import files

import pytest

TEMPLATE_FILES = sorted(
    path.name for path in files("verl_mm_tools.tiny").joinpath("templates").iterdir() if path.name.endswith(".jinja")
)


@pytest.fixture(scope="module")
def detect():
    from vllm.renderers.hf import _detect_content_format

    return lambda template: _detect_content_format(template, default="unknown")


def test_every_template_is_checked():
    assert TEMPLATE_FILES == [
        "gemma4.jinja",
        "glm4v.jinja",
        "qwen2_vl.jinja",
        "qwen3_5.jinja",
        "qwen3_vl.jinja",
        "qwen3_vl_thinking.jinja",
        "tool_aware.jinja",
    ]


@pytest.mark.parametrize("name", TEMPLATE_FILES)
def test_vllm_reads_the_tiny_template_as_a_content_list_template(detect, name):
    template = files("verl_mm_tools.tiny").joinpath("templates", name).read_text()
    assert detect(template) == "openai"


def test_the_detection_is_real_a_guarded_loop_reads_as_string(detect):
    """What the tiny templates did before: iterating ``message.content or []`` hides the loop from vLLM."""
    loop = "{%- for message in messages -%}{%- for item in message.content {} -%}{{ item.text }}{%- endfor -%}{%- endfor -%}"  # noqa: E501
    assert detect(loop.replace("{}", "or []")) == "string"
    assert detect(loop.replace("{}", "")) == "openai"
