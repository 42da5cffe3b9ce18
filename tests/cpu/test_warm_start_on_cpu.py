"""The format warm start: demonstrations are real mm_tool trajectories with random labels; the warm-started tiny model
writes parseable rotate calls; the result is cached."""

from __future__ import annotations

import collections
import json
import re
import time

import pytest
import torch

from verl_mm_tools.agent_loop.harness import ROTATE_TOOLS_YAML
from verl_mm_tools.cpu.warm_start import ANGLES, TOOL_DEGREES, WarmStartSpec, demonstrations, warm_started_model
from verl_mm_tools.data.rotation import QUESTION, rotation_samples

TOOL_CALL = re.compile(r'<tool_call>\n\{"name": "rotate", "arguments": \{"degrees": (-?\d+)\}\}\n</tool_call><\|im_end\|>')
ANSWER = re.compile(r"<answer>(\d+)</answer><\|im_end\|>")


@pytest.fixture(scope="module")
def tools_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "tools.yaml"
    path.write_text(ROTATE_TOOLS_YAML)
    return path


def test_demonstrations_train_exactly_the_two_assistant_turns(tiny_model_dir, tools_yaml, tiny_tokenizer):
    examples = demonstrations(tiny_model_dir, tools_yaml, WarmStartSpec(demonstrations=24, seed=5))
    assert len(examples) == 24
    image_pad = tiny_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    calls, answers = collections.Counter(), collections.Counter()
    for example in examples:
        labels = example["labels"]
        trained = tiny_tokenizer.decode(labels[labels != -100])
        call, answer = TOOL_CALL.match(trained), ANSWER.search(trained)
        assert call and answer and trained == call.group(0) + answer.group(0), trained
        calls[int(call.group(1))] += 1
        answers[int(answer.group(1))] += 1
        # two images (the prompt's and the tool's), their placeholders matching the processor's features
        assert example["image_grid_thw"].shape[0] == 2
        features = int(example["image_grid_thw"].prod(dim=1).sum()) // 4  # 2x2 patches merge into one token
        assert int((example["input_ids"] == image_pad).sum()) == features
        assert torch.equal(example["mm_token_type_ids"], (example["input_ids"] == image_pad).long())
    # random labels: tool angles and answers spread over their choices, unrelated to the pictures
    assert set(calls) <= set(TOOL_DEGREES) and len(calls) >= 2
    assert set(answers) <= set(ANGLES) and len(answers) >= 3


def test_the_warm_started_model_calls_the_tool_and_is_cached(tiny_model_dir, tools_yaml, tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    from verl_mm_tools.cpu.hf_engine import HFVisionLM

    model_dir = warm_started_model(tiny_model_dir, tools_yaml)
    report = json.loads((model_dir / "warm_start.json").read_text())
    assert report["last_loss"] < report["first_loss"] / 10
    started = time.perf_counter()
    assert warm_started_model(tiny_model_dir, tools_yaml) == model_dir
    assert time.perf_counter() - started < 1.0  # reused, not rebuilt

    engine = HFVisionLM(str(model_dir))
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
               for tool in initialize_tools_from_config(str(tools_yaml))]
    requests = []
    for sample in rotation_samples(32, seed=99):  # pictures the warm start never saw
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = engine.processor.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=False)
        ids = engine.processor(text=[text], images=[sample.image], return_tensors="pt")["input_ids"][0].tolist()
        requests.append((ids, [sample.image]))
    torch.manual_seed(0)
    outputs = engine.generate_batch(requests, max_new_tokens=[48] * len(requests), temperature=1.0)
    valid = sum(bool(TOOL_CALL.fullmatch(engine.tokenizer.decode(ids))) for ids, _ in outputs)
    assert valid >= 24, f"{valid}/32 sampled first turns are a valid rotate call"
