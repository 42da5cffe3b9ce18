"""mm_turn_discount through verl's own reward path: RewardLoopWorker builds the manager from a trainer config, and
the DataProto is built by verl's AgentLoopWorker._compute_score (streaming path) or like _postprocess (batch path).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.experimental.reward_loop.reward_manager import registry
from verl.trainer.ppo.reward import resolve_reward_manager_cls

from verl_mm_tools.errors import ConfigError, TrajectoryValidationError
from verl_mm_tools.rewards import REWARD_EXTRA_KEYS, REWARD_MANAGERS, MMTurnDiscountRewardManager

PROMPT = "<|im_start|>user\nHow far is the image rotated?<|im_end|>\n<|im_start|>assistant\n"
WRONG_THEN_RIGHT = (
    "<answer>45</answer><|im_end|>\n<|im_start|>user\nThat is not right. Try again.<|im_end|>\n"
    "<|im_start|>assistant\n<answer>90</answer><|im_end|>"
)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the managers the way verl_mm_tools.plugin does, undone after the test."""
    for name, cls in REWARD_MANAGERS.items():
        monkeypatch.setitem(registry.REWARD_MANAGER, name, cls)


def trainer_config(
    tokenizer_dir: str,
    reward_kwargs: dict | None = None,
    custom_path: str | None = None,
    custom_name: str = "compute_score",
    custom_kwargs: dict | None = None,
):
    """The parts of verl's trainer config that RewardLoopWorker and load_reward_manager read."""
    custom = {"path": custom_path, "name": custom_name, "reward_kwargs": custom_kwargs or {}}
    reward = {
        "num_workers": 1,
        "custom_reward_function": custom,
        "reward_manager": {"source": "register", "name": "mm_turn_discount", "module": {"path": None}},
        "reward_model": {"enable": False, "enable_resource_pool": False, "model_path": None},
        "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
    }
    if reward_kwargs is not None:
        reward["reward_kwargs"] = reward_kwargs
    return OmegaConf.create(
        {"actor_rollout_ref": {"model": {"path": tokenizer_dir, "tokenizer_path": None}}, "reward": reward}
    )


def reward_worker(tokenizer_dir: str, **config: Any) -> RewardLoopWorker:
    """verl's reward worker, constructed as Ray would (minus Ray): it loads the tokenizer and the manager."""
    return RewardLoopWorker(trainer_config(tokenizer_dir, **config))


def row(ground_truth: str = "90", **extra_info: Any) -> dict[str, Any]:
    """One dataset row as the agent loop receives it (``kwargs`` of ``_run_agent_loop``)."""
    return {
        "data_source": "verl_mm_tools/rotation",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": 0, **extra_info},
        "raw_prompt": [{"role": "user", "content": "How far is the image rotated?"}],
        "agent_name": "mm_tool",
    }


class _RewardHandle:
    """Stands in for a Ray actor handle: ``handle.compute_score.remote(data)`` is awaitable."""

    def __init__(self, worker: RewardLoopWorker):
        self.compute_score = types.SimpleNamespace(remote=worker.compute_score)


def score_through_agent_loop(worker, tokenizer, response: str, extra_fields: dict, sample: dict, num_turns: int = 4):
    """Run verl's AgentLoopWorker._compute_score on one finished trajectory; returns the AgentLoopOutput."""
    response_ids = tokenizer.encode(response)
    output = AgentLoopOutput(
        prompt_ids=tokenizer.encode(PROMPT),
        response_ids=response_ids,
        response_mask=[1] * len(response_ids),
        num_turns=num_turns,
        metrics=AgentLoopMetrics(),
        extra_fields=dict(extra_fields),
    )
    agent_worker = object.__new__(AgentLoopWorker)  # only the attributes _compute_score reads on a text model
    agent_worker.processor = None
    agent_worker.tokenizer = tokenizer
    agent_worker.mm_processor_kwargs = None
    agent_worker.reward_loop_worker_handles = [_RewardHandle(worker)]
    worker.loop.run_until_complete(agent_worker._compute_score([output], kwargs=sample))
    return output


def expected_extra_info(**values: Any) -> dict[str, Any]:
    return dict.fromkeys(REWARD_EXTRA_KEYS) | values


# (gamma, attempts, final answer, tolerance preset, discounted reward)
DISCOUNTED = [
    (0.9, 1, 90, "rotation_reward_180", 1.0),
    (0.9, 2, 90, "rotation_reward_180", 0.9),
    (0.5, 3, 135, "rotation_reward_180", 0.75 * 0.25),
    (0.8, 4, 100, "rotation_reward_45", (1 - 10 / 45) * 0.8**3),
    (1.0, 5, 90, "rotation_reward_45", 1.0),
]


@pytest.mark.parametrize(("gamma", "attempts", "answer", "reward_fn", "reward"), DISCOUNTED)
def test_discounted_reward_through_verls_streaming_path(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer, gamma, attempts, answer, reward_fn, reward
) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": gamma, "reward_fn": reward_fn})
    assert isinstance(worker.reward_manager, MMTurnDiscountRewardManager)
    response = WRONG_THEN_RIGHT.replace("<answer>90</answer>", f"<answer>{answer}</answer>")
    extra_fields = {"attempts": attempts, "tool_call_counts": 2}
    output = score_through_agent_loop(worker, tokenizer, response, extra_fields, row("90"))

    raw = reward / gamma ** (attempts - 1)
    assert output.reward_score == pytest.approx(reward, abs=1e-12)
    info = output.extra_fields["reward_extra_info"]
    assert info == expected_extra_info(
        score=pytest.approx(reward, abs=1e-12),
        raw_score=pytest.approx(raw, abs=1e-12),
        turn_discount=pytest.approx(gamma ** (attempts - 1), abs=1e-12),
        attempts=attempts,
        tool_calls=2,
        angle_error=pytest.approx(abs(answer - 90)),
        predicted_angle=float(answer),
        reason="ok",
    )


def test_wrong_feedback_right_scores_the_last_answer_and_leaves_extra_fields_alone(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer
) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.9, "reward_fn": "rotation_reward_45"})
    extra_fields = {"attempts": 2, "tool_call_counts": 1, "turn_scores": [0.0, 1.0]}
    output = score_through_agent_loop(worker, tokenizer, WRONG_THEN_RIGHT, extra_fields, row("90"))
    assert output.reward_score == pytest.approx(0.9)
    assert output.extra_fields.keys() == {*extra_fields, "reward_extra_info"}
    assert {k: output.extra_fields[k] for k in extra_fields} == extra_fields


def test_last_assistant_text_is_scored_instead_of_the_whole_response(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer
) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.9, "reward_fn": "rotation_reward_45"})
    extra_fields = {"attempts": 1, "last_assistant_text": "<answer>100</answer>"}
    output = score_through_agent_loop(worker, tokenizer, WRONG_THEN_RIGHT, extra_fields, row("90"))
    assert output.reward_score == pytest.approx(1 - 10 / 45)


def test_missing_attempts_mean_one_and_missing_tool_count_is_none(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer
) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.5, "reward_fn": "rotation_reward_180"})
    output = score_through_agent_loop(worker, tokenizer, "<answer>90</answer><|im_end|>", {}, row("90"))
    info = output.extra_fields["reward_extra_info"]
    assert (output.reward_score, info["attempts"], info["turn_discount"], info["tool_calls"]) == (1.0, 1, 1.0, None)


@pytest.mark.parametrize(("row_attempts", "loop_attempts", "used"), [(3, None, 3), (3, 2, 2), (None, 2, 2)])
def test_agent_loop_attempts_win_over_the_rows(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer, row_attempts, loop_attempts, used
) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.5, "reward_fn": "rotation_reward_180"})
    sample = row("90") if row_attempts is None else row("90", attempts=row_attempts)
    output = score_through_agent_loop(worker, tokenizer, "<answer>90</answer>", {"attempts": loop_attempts}, sample)
    assert (output.reward_score, output.extra_fields["reward_extra_info"]["attempts"]) == (0.5 ** (used - 1), used)


def test_row_names_its_reward_function(registered, event_loop_for_verl, tokenizer_dir, tokenizer) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.5, "reward_fn": "rotation_reward_180"})
    sample = row("90", reward_fn="rotation_reward_45")
    output = score_through_agent_loop(worker, tokenizer, "<answer>120</answer>", {"attempts": 2}, sample)
    assert output.reward_score == pytest.approx((1 - 30 / 45) * 0.5)


def test_a_configured_judge_scores_rows_that_name_their_own_function(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer
) -> None:
    from PIL import Image

    from verl_mm_tools.handoff import SampleFields
    from verl_mm_tools.judge.context import ImageOrigin, JudgeContext, JudgeImage
    from verl_mm_tools.testkit.judge import ScriptedJudge

    context = JudgeContext("How far?", (JudgeImage.of(1, ImageOrigin.PROMPT, Image.new("RGB", (4, 4))),))
    with ScriptedJudge(lambda body: "<score>6</score>") as judge:
        worker = reward_worker(
            tokenizer_dir,
            reward_kwargs={"gamma": 0.5},
            custom_path="pkg://verl_mm_tools.rewards.judge",
            custom_name="judge_reward",
            custom_kwargs={"endpoint": judge.url, "model": "judge"},
        )
        fields = {"attempts": 2, SampleFields.key("judge_context"): context}
        sample = row("90", reward_fn="rotation_reward_45")
        output = score_through_agent_loop(worker, tokenizer, "<answer>90</answer>", fields, sample)
    assert output.reward_score == pytest.approx(0.6 * 0.5) and len(judge.requests) == 1


def test_tool_shaping_from_config_then_discount(registered, event_loop_for_verl, tokenizer_dir, tokenizer) -> None:
    shaping = {"budget": 2, "penalty_per_extra_call": 0.1, "bonus": 0.25}
    reward_kwargs = {"gamma": 0.9, "reward_fn": "rotation_reward_180", "tool_shaping": shaping}
    worker = reward_worker(tokenizer_dir, reward_kwargs=reward_kwargs)
    extra_fields = {"attempts": 2, "tool_call_counts": 4}
    output = score_through_agent_loop(worker, tokenizer, "<answer>90</answer>", extra_fields, row("90"))
    shaped = 1.0 + 0.25 - 0.1 * 2
    assert output.reward_score == pytest.approx(shaped * 0.9)
    info = output.extra_fields["reward_extra_info"]
    assert (info["raw_score"], info["answer_score"], info["tool_shaping"]) == pytest.approx((shaped, 1.0, 0.05))


def test_reward_fn_kwargs_reach_the_function(registered, event_loop_for_verl, tokenizer_dir, tokenizer) -> None:
    reward_kwargs = {"reward_fn": "rotation_reward", "reward_fn_kwargs": {"tolerance": 60, "require_tag": True}}
    worker = reward_worker(tokenizer_dir, reward_kwargs=reward_kwargs)
    tagged = score_through_agent_loop(worker, tokenizer, "<answer>105</answer>", {}, row("90"))
    bare = score_through_agent_loop(worker, tokenizer, "105", {}, row("90"))
    assert (tagged.reward_score, bare.reward_score) == (pytest.approx(0.75), 0.0)


CUSTOM_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 0.5 if extra_info["tool_call_counts"] == 3 and extra_info["num_turns"] == 4 else 0.0
"""


def test_custom_reward_function_sees_the_agent_loop_fields(
    registered, event_loop_for_verl, tokenizer_dir, tokenizer, tmp_path
) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM_REWARD)
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.5}, custom_path=str(path))
    output = score_through_agent_loop(worker, tokenizer, "anything", {"attempts": 2, "tool_call_counts": 3}, row())
    info = output.extra_fields["reward_extra_info"]
    assert (output.reward_score, info["raw_score"], info["acc"]) == (0.25, 0.5, 0.5)


def test_batch_path_with_mixed_reward_functions(registered, event_loop_for_verl, tokenizer_dir, tokenizer) -> None:
    """extra_fields as top-level columns, rows scored one by one like RewardLoopManager.compute_rm_score."""
    worker = reward_worker(tokenizer_dir, reward_kwargs={"gamma": 0.5, "reward_fn": "rotation_reward_180"})
    responses = ["<answer>90</answer>", r"<think>t</think> \boxed{3}", "<answer>135</answer>"]
    rows = [row("90"), row("3", reward_fn="geo3k_reward"), row("90")]
    extra_fields = {"attempts": [2, 1, None], "tool_call_counts": [1, None, 0]}
    data = batch_like_postprocess(tokenizer, responses, rows, extra_fields)

    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    scores = [output["reward_score"] for output in outputs]
    assert scores == pytest.approx([0.5, 1.0, 0.75])
    rm_scores = MMTurnDiscountRewardManager.assemble_rm_scores(data, scores)
    last_tokens = data.batch["attention_mask"][:, data.batch["prompts"].size(1) :].sum(dim=1) - 1
    assert rm_scores.sum().item() == pytest.approx(2.25)
    assert rm_scores[torch.arange(3), last_tokens].tolist() == pytest.approx(scores)

    # verl builds one column per key of the first sample: every sample must carry the same keys
    infos = [output["reward_extra_info"] for output in outputs]
    columns = {key: np.array([info[key] for info in infos]) for key in infos[0]}
    assert columns["attempts"].tolist() == [2, 1, 1]
    assert columns["tool_calls"].tolist() == [1, None, 0]
    assert columns["acc"].tolist() == [None, 1.0, None]
    assert columns["angle_error"].tolist() == [0.0, None, 45.0]


def batch_like_postprocess(tokenizer, responses: list[str], rows: list[dict], extra_fields: dict) -> DataProto:
    """A padded batch shaped like AgentLoopWorker._postprocess output (left-padded prompts, right-padded responses)."""
    prompt_ids = [tokenizer.encode(PROMPT) for _ in responses]
    response_ids = [tokenizer.encode(text) for text in responses]
    prompt_len, response_len = max(map(len, prompt_ids)), max(map(len, response_ids)) + 3
    prompts = torch.zeros(len(responses), prompt_len, dtype=torch.long)
    resp = torch.zeros(len(responses), response_len, dtype=torch.long)
    mask = torch.zeros(len(responses), prompt_len + response_len, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        prompts[i, prompt_len - len(p) :] = torch.tensor(p)
        resp[i, : len(r)] = torch.tensor(r)
        mask[i, prompt_len - len(p) : prompt_len + len(r)] = 1
    batch = TensorDict(
        {"prompts": prompts, "responses": resp, "attention_mask": mask, "input_ids": torch.cat([prompts, resp], 1)},
        batch_size=len(responses),
    )
    columns = {
        key: np.array([r[key] for r in rows], dtype=object) for key in ("data_source", "reward_model", "extra_info")
    }
    columns["__num_turns__"] = np.array([2] * len(responses), dtype=np.int32)
    for key, values in extra_fields.items():
        columns[key] = np.array(values, dtype=object)
    return DataProto(batch=batch, non_tensor_batch=columns)


def test_invalid_attempts_are_reported(registered, event_loop_for_verl, tokenizer_dir, tokenizer) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"reward_fn": "rotation_reward_180"})
    with pytest.raises(TrajectoryValidationError, match=r"extra_fields\['attempts'\] .* got 0"):
        score_through_agent_loop(worker, tokenizer, "<answer>90</answer>", {"attempts": 0}, row())


def test_verl_resolves_the_registered_name(registered, tokenizer_dir) -> None:
    # verl 0.9.1's RewardManagerConfig.__post_init__ cannot run (it calls a missing super().__post_init__), so the
    # name is checked where verl resolves it.
    assert resolve_reward_manager_cls(trainer_config(tokenizer_dir)) is MMTurnDiscountRewardManager


@pytest.mark.parametrize(
    ("reward_kwargs", "message"),
    [
        ({"gamma": 1.5}, r"reward.reward_kwargs.gamma must be a number in \(0, 1\], got 1.5"),
        ({"gamma": 0}, r"got 0"),
        ({"gamma": "0.9"}, r"got '0.9'"),
        ({"gama": 0.9}, r"reward.reward_kwargs.gama .*Did you mean 'gamma'"),
        ({"reward_fn": "rotation_reward_90"}, r"unknown reward function 'rotation_reward_90'"),
        ({"reward_fn": "rotation_reward", "reward_fn_kwargs": {"tolerence": 9}}, r"Did you mean 'tolerance'"),
        ({"reward_fn_kwargs": {"tolerance": 9}}, r"without reward_fn"),
        ({"tool_shaping": {"budjet": 1}}, r"tool_shaping.budjet.*Did you mean 'budget'"),
        ({"tool_shaping": {"bonus": -1}}, r"bonus .* got -1"),
    ],
)
def test_config_errors(registered, event_loop_for_verl, tokenizer_dir, reward_kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        reward_worker(tokenizer_dir, reward_kwargs=reward_kwargs)


def test_custom_function_and_reward_fn_together_is_an_error(
    registered, event_loop_for_verl, tokenizer_dir, tmp_path
) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM_REWARD)
    with pytest.raises(ConfigError, match="keep one"):
        reward_worker(tokenizer_dir, reward_kwargs={"reward_fn": "rotation_reward_180"}, custom_path=str(path))


def test_dapo_keys_are_tolerated(registered, event_loop_for_verl, tokenizer_dir) -> None:
    worker = reward_worker(tokenizer_dir, reward_kwargs={"max_resp_len": 512, "gamma": 0.7})
    assert worker.reward_manager.settings.gamma == 0.7
