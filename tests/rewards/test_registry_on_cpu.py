"""The built-in reward functions by name."""

from __future__ import annotations

import inspect
import pickle

import pytest

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.rewards import REWARD_FUNCTIONS, get_reward_function


@pytest.mark.parametrize("name", sorted(REWARD_FUNCTIONS))
def test_every_function_has_verls_signature_and_pickles(name: str) -> None:
    function = REWARD_FUNCTIONS[name]
    parameters = list(inspect.signature(function).parameters.values())
    assert [p.name for p in parameters[:4]] == ["data_source", "solution_str", "ground_truth", "extra_info"]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in parameters[4:])  # tunables are keyword-only
    assert pickle.loads(pickle.dumps(function)) is function
    assert "score" in function("src", "<answer>90</answer>", "90", None)


def test_unknown_name_suggests_the_nearest() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown reward function 'rotation_reward45'.*Did you mean 'rotation_reward_45'"
    ):
        get_reward_function("rotation_reward45")


def test_verl_loads_a_builtin_as_its_custom_reward_function() -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    custom = {"path": "pkg://verl_mm_tools.rewards", "name": "rotation_reward", "reward_kwargs": {"tolerance": 45}}
    compute_score = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": custom}}))
    result = compute_score(data_source="r", solution_str="<answer>100</answer><|im_end|>", ground_truth="90")
    assert result["score"] == pytest.approx(1 - 10 / 45)
