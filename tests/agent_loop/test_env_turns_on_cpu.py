"""Environment turns in the mm_tool loop, scored by verl's real reward worker with the mm_turn_discount manager."""

from __future__ import annotations

import pytest
from PIL import Image

from verl_mm_tools.agent_loop.budget import ImageGeometry
from verl_mm_tools.agent_loop.validation import placeholder_runs
from verl_mm_tools.ops import rotate
from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.tokens import processor_image_tokens

REWARD = [
    "reward.reward_manager.name=mm_turn_discount",
    "+reward.reward_kwargs.gamma=0.9",
    "+reward.reward_kwargs.reward_fn=rotation_reward_45",
]


def rotated_image() -> Image.Image:
    upright = Image.new("RGB", (84, 56), (128, 128, 128))
    upright.paste((255, 0, 0), (0, 0, 28, 28))
    return upright.rotate(90, expand=True)  # ground truth: 90 degrees


def rotation_rows(env):
    columns = {
        "data_source": ["verl_mm_tools/rotation"],
        "reward_model": [{"style": "rule", "ground_truth": "90"}],
        "extra_info": [{"index": 0, "env": env}],
    }
    return [image_prompt("By how many degrees was this image rotated?", [rotated_image()])], columns


def test_wrong_answer_feedback_right_answer_is_discounted_by_the_manager(rollout):
    prompts, columns = rotation_rows({"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 3})
    turns = ["<answer>45</answer><|im_end|>", "<answer>90</answer><|im_end|>"]
    output, server, worker = rollout.run(turns, prompts, columns=columns, score=True, extra=REWARD)

    feedback = worker.tokenizer.decode(server.requests[1]["prompt_ids"]).rsplit("<|im_start|>user\n", 1)[1]
    assert (
        feedback
        == "Your answer is not correct. Please try again; 2 attempt(s) left.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert output.non_tensor_batch["attempts"][0] == 2
    assert output.non_tensor_batch["turn_scores"][0] == [0.0, 1.0]
    assert output.non_tensor_batch["mm_tool/turn_rewards"][0] == [0.0, 1.0]
    assert output.non_tensor_batch["last_assistant_text"][0] == "<answer>90</answer>"
    # mm_turn_discount: final score x gamma^(attempts - 1) = 1.0 x 0.9
    assert output.batch["rm_scores"][0].sum().item() == pytest.approx(0.9)
    assert output.non_tensor_batch["turn_discount"][0] == pytest.approx(0.9)
    row = unpadded_row(output)
    assert row["response_mask"].count(0) > 0 and row["response_mask"][-1] == 1


def test_rotation_feedback_image_enters_the_workspace_with_its_id_and_token_count(rollout):
    prompts, columns = rotation_rows({"name": "rotation", "max_attempts": 2})
    turns = [
        "<answer>45</answer><|im_end|>",
        tool_call_text("rotate", degrees=-45, image_id=2),
        "<answer>90</answer><|im_end|>",
    ]
    output, server, worker = rollout.run(turns, prompts, columns=columns, score=True, extra=REWARD)

    turned_back = rotate(server.requests[0]["images"][0], -45)
    geometry = ImageGeometry.from_processor(worker.processor)  # sized by the budget like a tool image
    size = geometry.resized(*turned_back.size, geometry.min_pixels, geometry.max_pixels)
    assert [len(request["images"]) for request in server.requests] == [1, 2, 3]
    shown = server.requests[1]["images"][1]
    assert shown.size == size == (112, 112)  # the 99x99 turned-back canvas, rounded to 28 px tokens
    assert list(shown.getdata()) == list(turned_back.resize(size, Image.Resampling.BICUBIC).getdata())
    feedback = worker.tokenizer.decode(server.requests[1]["prompt_ids"]).rsplit("<|im_start|>user\n", 1)[1]
    assert feedback.startswith("<|vision_start|>")
    assert "Image 2. Image 1 turned back by your estimate of 45 degrees" in feedback
    image_pad = worker.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    row = unpadded_row(output)
    expected = [processor_image_tokens(worker.processor, image) for image in server.requests[2]["images"]]
    assert placeholder_runs(row["prompt_ids"] + row["response_ids"], image_pad) == expected
    assert expected[1] == processor_image_tokens(worker.processor, turned_back)
    assert output.non_tensor_batch["attempts"][0] == 2
    assert output.non_tensor_batch["tool_call_counts"][0] == 1
    assert output.batch["rm_scores"][0].sum().item() == pytest.approx(0.9)
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"


def test_an_environments_text_that_is_not_valid_reaches_the_model_as_valid_text(rollout, monkeypatch):
    """reset's and step's observations: a lone surrogate made the tokenizer raise; control characters are replaced."""
    from verl_mm_tools.envs import ENVIRONMENTS, Environment, Observation

    class Garbled(Environment):
        name = "garbled_text"

        def reset(self, sample):
            return Observation(text="reset \ud800 \x00 end")

        def step(self, assistant_text):
            return Observation(text="step \udcff \x07 end"), 0.0, False, {}

    monkeypatch.setitem(ENVIRONMENTS, Garbled.name, Garbled)
    prompts, columns = rotation_rows("garbled_text")
    output, server, worker = rollout.run(["<answer>0</answer><|im_end|>"] * 2, prompts, columns=columns, max_turns=2)
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "turn_limit"
    users = worker.tokenizer.decode(server.requests[1]["prompt_ids"]).split("<|im_start|>user\n")[1:]
    assert users[1].startswith("reset \ufffd \ufffd end<|im_end|>\n")
    assert users[2] == "step \ufffd \ufffd end<|im_end|>\n<|im_start|>assistant\n"


def test_out_of_attempts_stops_and_the_environment_is_closed_once(rollout, monkeypatch):
    from verl_mm_tools.envs import AnswerFeedbackEnv

    closed = []
    monkeypatch.setattr(AnswerFeedbackEnv, "close", lambda self: closed.append(self.attempts))
    prompts, columns = rotation_rows({"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 2})
    output, server, _ = rollout.run(["<answer>0</answer><|im_end|>"] * 3, prompts, columns=columns)
    assert len(server.requests) == 2
    assert closed == [2]
    assert output.non_tensor_batch["turn_scores"][0] == [0.0, 0.0]
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"


def test_the_environment_scores_the_last_allowed_answer_then_stops_at_the_turn_limit(rollout):
    prompts, columns = rotation_rows({"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 5})
    output, server, _ = rollout.run(["<answer>0</answer><|im_end|>"] * 3, prompts, columns=columns, max_turns=2)
    assert len(server.requests) == 2
    assert output.non_tensor_batch["turn_scores"][0] == [0.0, 0.0]
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "turn_limit"


def test_manager_places_turn_rewards_for_mm_turn_grpo(rollout):
    from verl_mm_tools.rewards.turn_credit import turn_spans
    from verl_mm_tools.runtime.batch import make_batch
    from verl_mm_tools.runtime.config import CLASSIC_HOOK
    from verl_mm_tools.runtime.workers import InProcessActor, in_process_reward_worker, make_worker
    from verl_mm_tools.step_hook.manager import MMToolAgentLoopManager
    from verl_mm_tools.testkit.scripted import ScriptedServer

    prompts, columns = rotation_rows({"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 3})
    config = rollout.config(extra=[*REWARD, *CLASSIC_HOOK, "algorithm.adv_estimator=mm_turn_grpo"])
    worker = make_worker(config, None)
    worker.reward_loop_worker_handles = [InProcessActor(in_process_reward_worker(config))]
    worker.llm_client = ScriptedServer(
        worker.tokenizer, ["<answer>80</answer><|im_end|>", "<answer>90</answer><|im_end|>"]
    )
    manager = MMToolAgentLoopManager.__new__(MMToolAgentLoopManager)
    manager.config = config
    manager.agent_loop_workers = [InProcessActor(worker)]
    batch = make_batch(prompts, **columns)

    async def generate():  # on verl's loop, which the reward worker captured
        return await manager.generate_sequences(batch)

    from verl.utils.ray_utils import get_event_loop

    output = get_event_loop().run_until_complete(generate())

    first, second = turn_spans(output.batch["response_mask"][0])
    rm_scores = output.batch["rm_scores"][0]
    assert rm_scores[first[1] - 1].item() == pytest.approx(1 - 10 / 45)  # environment reward of the first answer
    assert rm_scores[second[1] - 1].item() == pytest.approx(1.0 + 0.9)  # env reward + discounted final score
    assert rm_scores.sum().item() == pytest.approx(1 - 10 / 45 + 1.9)
    assert output.meta_info["timing"]["mm_tool/turn_rewards/unplaced"] == 0.0
