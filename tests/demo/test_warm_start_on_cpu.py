"""The format warm start: demonstrations are real mm_tool trajectories with random labels; the warm-started tiny model
writes parseable rotate calls; the result is cached."""

from __future__ import annotations

import collections
import json
import re

import pytest
import torch

from verl_mm_tools.agent_loop.tool_format import resolve_tool_format, template_traits
from verl_mm_tools.data.rotation import ANGLES, QUESTION, rotation_samples
from verl_mm_tools.demo.demonstrations import demonstrations
from verl_mm_tools.demo.fit_check import ColdStartCheck, cold_start_check
from verl_mm_tools.demo.format_tasks import TOOL_DEGREES, WarmStartSpec
from verl_mm_tools.demo.warm_start import warm_started_model
from verl_mm_tools.errors import ColdStartError
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

TOOL_CALL = re.compile(
    r'<tool_call>\n\{"name": "rotate", "arguments": \{"degrees": (-?\d+)\}\}\n</tool_call><\|im_end\|>'
)
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
    written = {path: path.stat().st_mtime_ns for path in model_dir.rglob("*")}
    assert warm_started_model(tiny_model_dir, tools_yaml) == model_dir
    assert {path: path.stat().st_mtime_ns for path in model_dir.rglob("*")} == written  # reused, not rebuilt

    engine = HFVisionLM(str(model_dir))
    schemas = [
        tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        for tool in initialize_tools_from_config(str(tools_yaml))
    ]
    # the prompt as mm_tool renders it on this template (Qwen2.5-VL's ignores tools: the tool block joins the system)
    tool_format = resolve_tool_format("auto", "auto", template_traits(engine.processor), "hermes")
    requests = []
    for sample in rotation_samples(32, seed=99):  # pictures the warm start never saw
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = engine.processor.apply_chat_template(
            tool_format.view(messages, schemas),
            add_generation_prompt=True,
            tools=tool_format.template_tools(schemas),
            tokenize=False,
        )
        ids = engine.processor(text=[text], images=[sample.image], return_tensors="pt")["input_ids"][0].tolist()
        requests.append((ids, [sample.image]))
    torch.manual_seed(0)
    outputs = engine.generate_batch(requests, max_new_tokens=[48] * len(requests), temperature=1.0)
    valid = sum(bool(TOOL_CALL.fullmatch(engine.tokenizer.decode(ids))) for ids, _ in outputs)
    assert valid >= 24, f"{valid}/32 sampled first turns are a valid rotate call"


def test_color_demonstrations_answer_at_once_with_labels_that_tell_nothing(tiny_model_dir, tools_yaml, tiny_tokenizer):
    """The learning task's warm start answers in the first turn; each color's pictures get each label equally
    often, so a model fitted to them cannot learn which color is which."""
    from verl_mm_tools.data.color import color_samples
    from verl_mm_tools.demo.demonstrations import DEMO_SEED_OFFSET

    examples = demonstrations(tiny_model_dir, tools_yaml, WarmStartSpec(task="color", demonstrations=16, seed=3))
    truth = [sample.label for sample in color_samples(16, 3 + DEMO_SEED_OFFSET)]
    pairs = collections.Counter()
    for example, color in zip(examples, truth, strict=True):
        labels = example["labels"]
        trained = tiny_tokenizer.decode(labels[labels != -100])
        answer = re.fullmatch(r"<answer>(red|blue)</answer><\|im_end\|>", trained)
        assert answer, trained
        assert example["image_grid_thw"].tolist() == [[1, 16, 16]]  # the prompt picture only, 64 tokens
        pairs[color, answer.group(1)] += 1
    assert pairs == {("red", "red"): 4, ("red", "blue"): 4, ("blue", "red"): 4, ("blue", "blue"): 4}


def test_color_tool_demonstrations_rotate_by_90_then_answer(tiny_model_dir, tools_yaml, tiny_tokenizer):
    examples = demonstrations(tiny_model_dir, tools_yaml, WarmStartSpec(task="color_tool", demonstrations=8, seed=3))
    answers = collections.Counter()
    for example in examples:
        labels = example["labels"]
        trained = tiny_tokenizer.decode(labels[labels != -100])
        call = TOOL_CALL.match(trained)
        assert call and int(call.group(1)) == 90, trained
        answer = re.fullmatch(r"<answer>(red|blue)</answer><\|im_end\|>", trained[call.end() :])
        assert answer, trained
        answers[answer.group(1)] += 1
        assert example["image_grid_thw"].tolist() == [[1, 16, 16], [1, 16, 16]]  # the picture, then it rotated
    assert answers == {"red": 4, "blue": 4}


def test_uninformative_labels_give_every_true_class_every_label_equally_often():
    import random

    from verl_mm_tools.demo.demonstrations import uninformative_labels

    answers = ("0", "90", "180", "270")
    truths = list(answers) * 6 + ["0"] * 3  # 9 pictures of "0", 6 of each other angle
    labels = uninformative_labels(truths, answers, random.Random(0))
    for truth, expected in (("0", [2, 2, 2, 3]), ("90", [1, 1, 2, 2]), ("180", [1, 1, 2, 2]), ("270", [1, 1, 2, 2])):
        counts = collections.Counter(label for value, label in zip(truths, labels, strict=True) if value == truth)
        assert set(counts) == set(answers) and sorted(counts.values()) == expected
    assert labels != uninformative_labels(truths, answers, random.Random(1))  # shuffled, not a fixed cycle


def test_unknown_warm_start_tasks_are_refused():
    from verl_mm_tools.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown warm-start task 'arrows'; choose one of"):
        WarmStartSpec(task="arrows")


@pytest.fixture(scope="module")
def zoom_tools_yaml(tmp_path_factory):
    from verl_mm_tools.tools.tool_yaml import ZOOM_TOOLS_YAML

    path = tmp_path_factory.mktemp("zoom_tools") / "tools.yaml"
    path.write_text(ZOOM_TOOLS_YAML)
    return path


def test_zoom_demonstrations_call_zoom_in_half_the_time_and_their_labels_tell_nothing(
    tiny_model_dir, zoom_tools_yaml, tiny_tokenizer
):
    """learn_zoom's warm start: of each answer's pictures, half answer at once and half zoom in on the centre box
    first; within each half every true answer gets each label equally often: neither whether to call nor what to
    answer is taught, and the answer after the zoomed image is fitted to either answer (its tags as they are).
    Beside them, as many color pictures answered truly (the task's ``sight``)."""
    from verl_mm_tools.data.color import color_samples
    from verl_mm_tools.data.zoom_color import zoom_color_samples
    from verl_mm_tools.demo.demonstrations import DEMO_SEED_OFFSET, SIGHT_SEED_OFFSET

    examples = demonstrations(
        tiny_model_dir, zoom_tools_yaml, WarmStartSpec(task="zoom_color", demonstrations=16, seed=3)
    )
    seen = [example for example in examples if example["sight"]]
    assert [tiny_tokenizer.decode(example["labels"][example["labels"] != -100]) for example in seen] == [
        f"<answer>{sample.label}</answer><|im_end|>" for sample in color_samples(16, 3 + SIGHT_SEED_OFFSET)
    ]
    examples = [example for example in examples if not example["sight"]]
    truth = [sample.label for sample in zoom_color_samples(16, 3 + DEMO_SEED_OFFSET)]
    zoom_call = (
        '<tool_call>\n{"name": "zoom_in", "arguments": {"x1": 440, "y1": 440, "x2": 456, "y2": 456}}\n'
        "</tool_call><|im_end|>"
    )
    pairs = collections.Counter()
    for example, color in zip(examples, truth, strict=True):
        labels = example["labels"]
        trained = tiny_tokenizer.decode(labels[labels != -100])
        called = trained.startswith(zoom_call)
        written = tiny_tokenizer.decode(example["input_ids"][example["answer_at"] : example["answer_at"] + 1])
        answer = re.fullmatch(
            r"<answer>(red|blue)</answer><\|im_end\|>",
            trained.removeprefix(zoom_call).replace("<answer></", f"<answer>{written}</"),
        )
        assert answer and answer.group(1) == written, trained
        assert (labels[example["answer_at"]] == -100) == called
        assert example["any_answer_at"] == (example["answer_at"] if called else -1)  # fitted to red or blue
        # the picture at 224 px, then the zoomed box at 224 px: 64 image tokens each
        assert example["image_grid_thw"].tolist() == [[1, 16, 16]] * (2 if called else 1)
        pairs[called, color, answer.group(1)] += 1
    assert pairs == {
        (called, color, label): 2 for called in (True, False) for color in ("red", "blue") for label in ("red", "blue")
    }


@pytest.mark.slow
def test_the_premise_the_answer_is_read_after_zoom_in_and_not_before(tiny_model_dir, zoom_tools_yaml):
    """Fitted with TRUE labels, the tiny model answers pictures it never saw at chance from the prompt picture and
    right after zoom_in (``demo.premise``, the figures the README reports)."""
    from verl_mm_tools.demo.premise import premise_check

    fits = {fit.mode: fit for fit in premise_check(tiny_model_dir, zoom_tools_yaml)}
    prompt_only, zoomed = fits["prompt picture"], fits["zoomed centre"]
    assert 0.3 <= prompt_only.held_out_accuracy <= 0.7, prompt_only
    assert zoomed.held_out_accuracy >= 0.9, zoomed


def test_batches_hold_calls_and_direct_answers_half_and_half_where_both_exist():
    from verl_mm_tools.demo.fit import balanced_picks

    examples = [{"calls": index % 3 == 0} for index in range(12)]  # 4 calls, 8 direct answers
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        picks = balanced_picks(examples, 4, generator)
        assert len(set(picks)) == 4 and sum(examples[pick]["calls"] for pick in picks) == 2
    same_kind = [{"calls": False}] * 6
    picks = balanced_picks(same_kind, 4, torch.Generator().manual_seed(0))
    assert picks == torch.randperm(6, generator=torch.Generator().manual_seed(0))[:4].tolist()  # as before
    with_sight = examples + [{"calls": False, "sight": True}] * 5  # indices 12-16
    for _ in range(20):
        picks = balanced_picks(with_sight, 4, generator)
        assert len(set(picks)) == 6 and sum(with_sight[pick]["calls"] for pick in picks) == 2
        assert sum(pick >= 12 for pick in picks) == 2


def test_the_answer_after_a_zoom_is_fitted_to_either_answer_and_the_rest_to_its_labels(
    tiny_model_dir, zoom_tools_yaml, tiny_tokenizer
):
    """The loss of a batch holding a direct demonstration and two zoom demonstrations: the mean, over every labelled
    token, each zoom's answer and one balance term, of the labels' cross-entropy, -log(p(red) + p(blue)) at each
    answer after a zoom, and KL(even || the shares of red and blue there, averaged over the two)."""
    from transformers import AutoModelForImageTextToText

    from verl_mm_tools.demo.fit import collate, model_inputs, token_loss

    examples = demonstrations(
        tiny_model_dir, zoom_tools_yaml, WarmStartSpec(task="zoom_color", demonstrations=4, seed=3)
    )
    direct = next(example for example in examples if not example["calls"] and not example["sight"])
    callers = [example for example in examples if example["calls"] and not example["sight"]]
    assert len(callers) == 2
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = collate([direct, *callers], pad_token_id=0)
    with torch.no_grad():
        loss = token_loss(model, batch)
        log_probs = model(**model_inputs(batch)).logits.float().log_softmax(-1)

    red, blue = (tiny_tokenizer.encode(answer)[0] for answer in ("red", "blue"))
    assert callers[0]["answer_choices"].tolist() == [red, blue]
    terms, shares = [], []
    for row, example in enumerate((direct, *callers)):
        for at in (example["labels"] != -100).nonzero().flatten().tolist():
            terms.append(-log_probs[row, at - 1, example["labels"][at]])
        if example["calls"]:
            answer = log_probs[row, example["answer_at"] - 1, [red, blue]]
            terms.append(-answer.logsumexp(-1))
            shares.append(answer.softmax(-1))
    mean = torch.stack(shares).mean(0)
    terms.append(0.5 * (torch.log(0.5 / mean[0]) + torch.log(0.5 / mean[1])))
    labelled = sum(int((example["labels"] != -100).sum()) for example in (direct, *callers))
    assert len(terms) == labelled + 3
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), abs=1e-5)


def test_the_zoom_cold_start_answers_truly_after_the_zoom_and_weighs_that_answer(
    tiny_model_dir, zoom_tools_yaml, tiny_tokenizer
):
    """The main job's cold start (``zoom_read``): half its demonstrations zoom in, and their answer is the TRUE one,
    weighted 30 in the loss; the direct answers keep labels that tell nothing; no sight pictures. The loss is the
    weighted mean of the labelled tokens' cross-entropy."""
    from transformers import AutoModelForImageTextToText

    from verl_mm_tools.data.zoom_color import zoom_color_samples
    from verl_mm_tools.demo.demonstrations import DEMO_SEED_OFFSET
    from verl_mm_tools.demo.fit import collate, model_inputs, token_loss
    from verl_mm_tools.demo.format_tasks import TASKS

    assert TASKS["zoom_read"].after_call_weight == 30.0
    examples = demonstrations(
        tiny_model_dir, zoom_tools_yaml, WarmStartSpec(task="zoom_read", demonstrations=16, seed=3)
    )
    truth = [sample.label for sample in zoom_color_samples(16, 3 + DEMO_SEED_OFFSET)]
    assert len(examples) == 16 and not any(example["sight"] for example in examples)
    pairs = collections.Counter()
    for example, color in zip(examples, truth, strict=True):
        answer = tiny_tokenizer.decode(example["labels"][example["answer_at"]])
        weighted = (example["weights"] != (example["labels"] != -100).float()).nonzero().flatten().tolist()
        assert weighted == ([example["answer_at"]] if example["calls"] else [])
        assert example["weights"][example["answer_at"]] == (30.0 if example["calls"] else 1.0)
        assert example["any_answer_at"] == -1
        pairs[example["calls"], color, answer] += 1
    assert pairs == {
        **{(True, color, color): 4 for color in ("red", "blue")},
        **{(False, color, label): 2 for color in ("red", "blue") for label in ("red", "blue")},
    }
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    pair = [next(e for e in examples if not e["calls"]), next(e for e in examples if e["calls"])]
    batch = collate(pair, pad_token_id=0)
    with torch.no_grad():
        loss = token_loss(model, batch)
        log_probs = model(**model_inputs(batch)).logits.float().log_softmax(-1)
    total, weight = 0.0, 0.0
    for row, example in enumerate(pair):
        for at in (example["labels"] != -100).nonzero().flatten().tolist():
            total += float(example["weights"][at] * -log_probs[row, at - 1, example["labels"][at]])
            weight += float(example["weights"][at])
    assert loss.item() == pytest.approx(total / weight, abs=1e-5)


def test_the_reading_fit_trains_the_answers_after_a_call_alone(tiny_model_dir, zoom_tools_yaml, tiny_tokenizer):
    """Before its format fit, the zoom cold start fits the calling demonstrations' answer tokens alone (the premise's
    fit, 100 steps at lr 3e-3): only the answer and its closing tags are labelled, and their loss falls."""
    from transformers import AutoModelForImageTextToText

    from verl_mm_tools.demo.fit import READING_LR, answer_only, read_after_calls
    from verl_mm_tools.demo.format_tasks import TASKS

    assert TASKS["zoom_read"].reading_steps == 100 and READING_LR == 3e-3
    spec = WarmStartSpec(task="zoom_read", demonstrations=4, seed=3)
    examples = demonstrations(tiny_model_dir, zoom_tools_yaml, spec)
    for caller in (example for example in examples if example["calls"]):
        labels = answer_only(caller)["labels"]
        answer = tiny_tokenizer.decode(caller["labels"][caller["answer_at"]])
        assert tiny_tokenizer.decode(labels[labels != -100]) == f"{answer}</answer><|im_end|>"
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    losses = read_after_calls(model, examples, spec)
    assert len(losses) == 100 and losses[-1] < losses[0]
    assert read_after_calls(model, examples, WarmStartSpec(task="zoom_color", demonstrations=4, seed=3)) == []


def test_video_demonstrations_call_get_frames_half_the_time_and_read_the_flash_after(tiny_model_dir, tiny_tokenizer):
    """demo --task video's cold start (``video_read``): on the task's clips (colours alternating, every flash at
    2.0-2.1 s), half the trajectories call get_frames over the flash and answer its true colour; the others answer at
    once, red and blue alternately (the script sees nothing the prompt's frames miss). Each example carries the
    video's frames, the called frames, transformers' token types and the video's 2 s a grid step."""
    from transformers import AutoModelForImageTextToText

    from verl_mm_tools.demo.fit import collate, token_loss
    from verl_mm_tools.tools.tool_yaml import GET_FRAMES_TOOLS_YAML

    tools = tiny_model_dir.parent / "get_frames_tools.yaml"
    tools.write_text(GET_FRAMES_TOOLS_YAML)
    examples = demonstrations(tiny_model_dir, tools, WarmStartSpec(task="video_read", demonstrations=8, seed=2))
    call = (
        '<tool_call>\n{"name": "get_frames", "arguments": {"video_id": 1, "start_s": 2.0, "end_s": 2.1, "n": 2}}\n'
        "</tool_call><|im_end|>"
    )
    rows = []
    for index, example in enumerate(examples):
        trained = tiny_tokenizer.decode(example["labels"][example["labels"] != -100])
        called = trained.startswith(call)
        assert example["calls"] == called
        truth = ("blue", "red")[index % 2]
        rows.append(
            (called, truth, re.fullmatch(r"<answer>(red|blue)</answer><\|im_end\|>", trained.removeprefix(call))[1])
        )
        types = example["mm_token_type_ids"]
        assert (int((types == 2).sum()), int((types == 1).sum())) == (128, 32 if called else 0)
        assert example["video_grid_thw"].tolist() == [[2, 16, 16]] and example["second_per_grid_ts"].tolist() == [2.0]
        assert ("pixel_values" in example) == called and example["weights"][example["answer_at"]] == (
            30.0 if called else 1.0
        )
    assert sum(called for called, _, _ in rows) == 4
    assert all(answer == truth for called, truth, answer in rows if called)
    assert collections.Counter(answer for called, _, answer in rows if not called) == {"red": 2, "blue": 2}
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    assert torch.isfinite(token_loss(model, collate(examples[:4], 0)))
    # the untrained model writes none of it: each part of the check fails
    assert cold_start_check(model, examples, reads=True).failures(direct_share=0.5) == [
        "p(its call) 0.000 < 0.8 x the calling share 0.50",
        "p(its direct answer's format) 0.000 < 0.8 x 0.50",
        "it starts a call with p 0.001, the demonstrations in 0.50",
        "p(the true answer after a call) 0.001 < 0.9",
    ]


def test_the_cold_start_check_names_what_keeps_rl_from_learning():
    calls_half = ColdStartCheck(call=0.45, direct=0.49, call_share=0.5, reading=0.998)
    assert calls_half.failures(direct_share=0.5) == []
    assert ColdStartCheck(call=0.0, direct=0.47, call_share=0.48, reading=0.998).failures(0.5) == [
        "p(its call) 0.000 < 0.8 x the calling share 0.50"
    ]
    assert ColdStartCheck(call=0.45, direct=0.3, call_share=0.8, reading=0.5).failures(0.5) == [
        "p(its direct answer's format) 0.300 < 0.8 x 0.50",
        "it starts a call with p 0.800, the demonstrations in 0.50",
        "p(the true answer after a call) 0.500 < 0.9",
    ]
    # answers after a call that are not the truth are not checked; a task that always calls starts one at p 1
    assert ColdStartCheck(call=0.9, direct=1.0, call_share=1.0, reading=None).failures(direct_share=0.0) == []


def test_a_checked_warm_start_that_did_not_take_fails_and_caches_nothing(tiny_model_dir, tmp_path):
    from verl_mm_tools.tools.tool_yaml import GET_FRAMES_TOOLS_YAML

    tools = tmp_path / "tools.yaml"
    tools.write_text(GET_FRAMES_TOOLS_YAML)
    spec = WarmStartSpec(task="video_read", demonstrations=8, steps=2, seed=2)
    with pytest.raises(
        ColdStartError,
        match=r"the warm start of video_read \(seed 2, 2 steps at lr 0.01\) did not take: p\(its call\) 0.000",
    ):
        warm_started_model(tiny_model_dir, tools, spec, cache_root=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
