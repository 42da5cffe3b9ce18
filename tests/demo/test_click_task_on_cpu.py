"""The demo's GUI task (``demo --task click``) on real Chromium and verl's AgentLoopWorker: its episodes are the seeds
whose button covers exactly one of the four points, balanced; a click on the covered point scores 1 and any other 0;
each screenshot's demonstrations hit in 0.85 of them and miss on every other point alike; a demonstration of another
click is the rolled-out prompt with that click's call; the trainer's command runs the click tool alone on the task's
data."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from verl_mm_tools.demo.click_task import (
    ENV,
    POINTS,
    ClickColdStart,
    ClickEpisode,
    clear_point,
    click_episodes,
    click_example,
    cold_start,
    covered_points,
    demonstration_rollout,
    digit_ids,
    interleaved,
    point_shares,
    weighted_digits,
    with_call,
    write_click_dataset,
)
from verl_mm_tools.envs.gui.miniwob_env import POOL
from verl_mm_tools.errors import ColdStartError
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import unpadded_row
from verl_mm_tools.tiny import tiny_model_path
from verl_mm_tools.tools.tool_yaml import CLICK_TOOLS_YAML


def test_a_point_is_covered_three_pixels_inside_the_button():
    assert covered_points((37.0, 87.0, 40.0, 40.0)) == [0]  # (40, 90): 3 px inside the left and top edges
    assert covered_points((38.0, 87.0, 40.0, 40.0)) == []
    assert covered_points((3.0, 59.0, 150.0, 60.0)) == [0, 1]
    assert covered_points((0.0, 50.0, 160.0, 160.0)) == [0, 1, 2, 3]
    assert covered_points((38.0, 87.0, 40.0, 40.0), margin=-3) == [0]  # within 3 px outside it


def test_a_clear_point_is_the_only_one_near_the_button():
    assert clear_point((37.0, 87.0, 40.0, 40.0)) == 0
    assert clear_point((20.0, 60.0, 104.0, 40.0)) is None  # (125, 90) is 1 px right of its edge: a click may land
    assert clear_point((20.0, 60.0, 101.0, 40.0)) == 0  # now 4 px right of it
    assert clear_point((3.0, 59.0, 150.0, 60.0)) is None  # two points
    assert clear_point((60.0, 100.0, 40.0, 40.0)) is None  # none


def test_interleaved_episodes_take_the_points_in_turn():
    episodes = [ClickEpisode(seed, (0.0, 0.0, 1.0, 1.0), point) for seed, point in enumerate([3, 3, 0, 1, 2, 0])]
    assert [(e.seed, e.point) for e in interleaved(episodes)] == [(2, 0), (3, 1), (4, 2), (0, 3), (5, 0), (1, 3)]


def test_each_screenshot_is_demonstrated_hitting_in_085_and_missing_on_every_other_point_alike():
    spec = ClickColdStart()
    assert spec.clicks_of(2) == [2] * 16 + [0, 1, 2, 3]  # 17 of 20 hit
    assert ClickColdStart(clicks_per_screenshot=8, true_click_share=0.5).clicks_of(0) == [0] * 4 + [0, 1, 2, 3]
    with pytest.raises(ValueError, match="20 clicks per screenshot at true share 0.9 leave 2 guesses"):
        ClickColdStart(true_click_share=0.9).clicks_of(0)


def test_another_click_on_a_screenshot_is_its_prompt_with_that_call():
    example = {
        "input_ids": torch.tensor([5, 6, 7, 8, 9]),
        "labels": torch.tensor([-100, -100, -100, 8, 9]),
        "weights": torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0]),
        "mm_token_type_ids": torch.tensor([0, 1, 0, 0, 0]),
        "prompt_length": 3,
        "call": [8, 9],
        "pixel_values": torch.zeros(1),
    }
    other = with_call(example, [11, 12, 13])
    assert other["input_ids"].tolist() == [5, 6, 7, 11, 12, 13]
    assert other["labels"].tolist() == [-100, -100, -100, 11, 12, 13]
    assert other["weights"].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert other["mm_token_type_ids"].tolist() == [0, 1, 0, 0, 0, 0]
    assert other["call"] == [11, 12, 13] and other["pixel_values"] is example["pixel_values"]


@pytest.mark.integration  # Chromium
def test_the_episodes_are_the_seeds_covering_one_point_balanced(tmp_path):
    episodes = click_episodes(8, 0)
    assert [(e.seed, e.point) for e in episodes] == [
        (3, 3), (4, 3), (5, 2), (6, 1), (7, 1), (8, 2), (10, 0), (24, 0)
    ]  # fmt: skip
    assert episodes[0].box == (47.0, 124.0, 84.0, 84.0)
    assert all(covered_points(e.box) == [e.point] for e in episodes)
    train, val = write_click_dataset(tmp_path, train_size=8, val_size=4, seed=0)
    rows = pd.read_parquet(train)
    assert [info["seed"] for info in rows["extra_info"]] == [10, 6, 5, 3, 24, 7, 8, 4]  # points in turn
    assert [info["target_point"] for info in rows["extra_info"]] == [0, 1, 2, 3] * 2
    assert rows["extra_info"][0]["env"] == ENV and rows["extra_info"][0]["reward_fn"] == "environment_reward"
    val_seeds = [info["seed"] for info in pd.read_parquet(val)["extra_info"]]
    assert len(val_seeds) == 4 and min(val_seeds) >= 1_000_003  # no episode in both splits
    assert POOL.idle == 0  # the demo leaves no idle browser running beside the trainer


@pytest.mark.integration  # the tiny model's processor, verl's worker and reward worker, Chromium
@pytest.mark.parametrize(
    ("family", "x", "image_tokens"),
    [("qwen2_5_vl", 42, 48), ("qwen3_vl", 40, 35)],  # 168x224 in 28 px tokens (6x8); the task's: 160x224 in 32 (5x7)
)
def test_a_click_on_the_covered_point_scores_one_and_any_other_zero(tmp_path, family, x, image_tokens):
    tiny_model_dir = tiny_model_path(family=family)
    tools = tmp_path / "tools.yaml"
    tools.write_text(CLICK_TOOLS_YAML)
    episodes = click_episodes(4, 0)  # covering points 3, 2, 1 and 0
    clicks = [3, 2, 0, 1]
    output, image_token = demonstration_rollout(tiny_model_dir, tools, episodes, clicks)
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0, 0.0, 0.0]
    fields = SampleFields.every_row(output.non_tensor_batch)
    assert [f.stop_reason for f in fields] == ["episode_done"] * 4
    assert output.non_tensor_batch["tool_call_counts"].tolist() == [1, 1, 1, 1]
    row = unpadded_row(output, 2)
    text = tiny_decode(tiny_model_dir, row["response_ids"])
    # the call in the pixels of the shown screenshot (for the 160x210 page): POINTS[0] = (40, 90) is (x, 96)
    assert text.startswith(
        f'<tool_call>\n{{"name": "click", "arguments": {{"x": {x}, "y": 96}}}}\n</tool_call><|im_end|>'
    )
    assert f"The task is over after clicking at ({x}, 96): not done (reward 0)." in text
    assert row["prompt_ids"].count(image_token) == image_tokens  # one screenshot
    examples = [click_example(output, index, image_token) for index in range(4)]
    # the trained tokens are the call's: x and y one digit each (x 42 or 131 / 40 or 125, y 96 or 181)
    assert [len(example["call"]) for example in examples] == [32, 31, 30, 31]
    assert [int(example["weights"].sum()) for example in examples] == [32, 31, 30, 31]
    # the fit weighs each digit 10x: 6, 5, 4 and 5 of them (x of 3 digits, y "181"; x of 2, y "181"; 2, "96"; 3, "96")
    digits = digit_ids(tiny_model_dir)
    weighted = [weighted_digits(example, digits, 10.0) for example in examples]
    assert [int(example["weights"].sum()) for example in weighted] == [86, 76, 66, 76]
    assert torch.equal(weighted[2]["labels"], examples[2]["labels"])  # only the weights change
    calls = {click: example["call"] for example, click in zip(examples, clicks)}
    shares = point_shares(tiny_model(tiny_model_dir), examples, [e.point for e in episodes], calls)
    assert sum(shares["point_shares"]) == pytest.approx(1.0, abs=1e-3)
    assert shares["call_mass"] < 1e-6 and shares["true_call_probability"] < 1e-6  # the untrained model writes none


@pytest.mark.integration  # verl's worker, Chromium, the tiny model's fit
def test_a_cold_start_that_does_not_localize_the_button_stops_with_its_figures(tiny_model_dir, tmp_path):
    import shutil

    tools = tmp_path / "tools.yaml"
    tools.write_text(CLICK_TOOLS_YAML)
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    weights = (model / "model.safetensors").read_bytes()
    spec = ClickColdStart(demonstrations=8, steps=2, share_examples=4, held_out=4)
    # two steps teach nothing: the four held-out screenshots (one per point) share their point at chance
    with pytest.raises(ColdStartError, match=r"true-point share on 4 held-out screenshots is 0\.2\d*, under 0\.3"):
        cold_start(model, tools, spec)
    assert (model / "model.safetensors").read_bytes() == weights  # a refused fit is not saved
    assert POOL.idle == 0  # its browsers are closed


def tiny_model(model_dir):
    import torch
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)


def tiny_decode(model_dir, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).decode(ids)


def test_the_click_task_trains_the_click_tool_on_its_rows(tmp_path):
    from verl_mm_tools.demo.options import DemoOptions
    from verl_mm_tools.demo.overrides import task_overrides
    from verl_mm_tools.demo.prepare import DemoPaths
    from verl_mm_tools.demo.tasks import TRAINING_REWARD

    options = DemoOptions(out=tmp_path, task="click")
    paths = DemoPaths(out=tmp_path, model=tmp_path / "model", train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    overrides = task_overrides(options, paths)
    assert options.spec.tools_yaml == CLICK_TOOLS_YAML and options.spec.chance_reward == 0.25
    assert not any(item.startswith("+reward.reward_kwargs.reward_fn") for item in overrides)  # the rows' own
    assert "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3" in overrides
    # learned: 0.95 success over 5 steps (the demonstrations hit 0.85), 15 of 16 held-out validation episodes
    assert (options.spec.stop_at_reward, options.spec.stop_at_validation, options.total_steps) == (0.95, 0.9, 50)
    steps = [{TRAINING_REWARD: 0.96}] * 4 + [{TRAINING_REWARD: 0.96, options.spec.validation_metric: 0.9375}]
    assert options.spec.learned(steps) and not options.spec.learned(steps[:4])
    assert not options.spec.learned([*steps, {options.spec.validation_metric: 0.875}])
    # its tiny model: the Qwen3-VL as built (the other tasks': Qwen2.5-VL); --family still chooses another
    assert (options.tiny_family, options.tool_parser) == ("qwen3_vl", "hermes")
    assert DemoOptions(out=tmp_path, task="click", family="qwen2_5_vl").tiny_family == "qwen2_5_vl"
    assert DemoOptions(out=tmp_path, task="zoom").tiny_family == "qwen2_5_vl"
    assert len(POINTS) == 4
