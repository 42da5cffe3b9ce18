"""mm_turn_grpo against hand-computed advantages, through verl's own compute_advantage; reward placement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import AdvantageEstimator, get_adv_estimator_fn

from verl_mm_tools.rewards.turn_credit import (
    CONTINUATION_MARK,
    chain_sample_returns,
    compute_turn_grpo_advantage,
    place_turn_rewards,
    turn_spans,
)

# Two trajectories of one prompt (uid "a"), response length 10:
#   A: turn 1 = tokens 0-1, context 2-3, turn 2 = tokens 4-5, padding; turn rewards 1.0 (on token 1) and 0.0
#   B: one turn = tokens 0-2, reward 0.0
MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
REWARDS = torch.zeros(2, 10)
REWARDS[0, 1] = 1.0
UIDS = np.array(["a", "a"], dtype=object)


def test_turn_spans_are_the_runs_of_generated_tokens():
    assert turn_spans(MASK[0]) == [(0, 2), (4, 6)]
    assert turn_spans(torch.tensor([0, 0])) == []
    assert turn_spans(torch.tensor([1, 1, 1])) == [(0, 3)]


def test_hand_computed_advantages_with_discount():
    # gamma 0.5: G_A1 = 1 + 0.5 * 0 = 1, G_A2 = 0, G_B1 = 0; b = 0.5, s = std([1, 0]) = sqrt(0.5)
    config = AlgoConfig(gamma=0.5, norm_adv_by_std_in_grpo=True)
    advantages, returns = compute_turn_grpo_advantage(REWARDS, MASK, UIDS, config=config)
    s = 0.5**0.5 + 1e-6
    expected = torch.tensor([[0.5 / s] * 2 + [0, 0] + [-0.5 / s] * 2 + [0] * 4, [-0.5 / s] * 3 + [0] * 7])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.equal(advantages, returns)


def test_later_rewards_flow_back_to_earlier_turns_but_not_forward():
    rewards = torch.zeros(2, 10)
    rewards[0, 5] = 1.0  # A is rewarded at its second turn only
    config = AlgoConfig(gamma=0.5, norm_adv_by_std_in_grpo=False)
    advantages, _ = compute_turn_grpo_advantage(rewards, MASK, UIDS, config=config)
    # G_A1 = 0 + 0.5 * 1 = 0.5, G_A2 = 1, G_B1 = 0, b = 0.25
    assert advantages[0, :2].tolist() == [0.25, 0.25]
    assert advantages[0, 4:6].tolist() == [0.75, 0.75]
    assert advantages[1, :3].tolist() == [-0.25] * 3
    assert advantages[:, 6:].abs().sum() == 0 and advantages[0, 2:4].abs().sum() == 0


def test_single_turn_or_final_reward_only_equals_verls_grpo():
    rewards = torch.zeros(3, 6)
    rewards[0, 5], rewards[1, 2] = 1.0, 0.5
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    uids = np.array(["a", "a", "a"], dtype=object)
    ours, _ = compute_turn_grpo_advantage(rewards, mask, uids, config=AlgoConfig(gamma=1.0))
    grpo, _ = get_adv_estimator_fn(AdvantageEstimator.GRPO_VECTORIZED)(
        token_level_rewards=rewards, response_mask=mask, index=uids, config=AlgoConfig()
    )
    assert torch.allclose(ours, grpo, atol=1e-6)


def test_selected_by_name_through_verls_compute_advantage():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import verl_mm_tools.plugin  # noqa: F401  (registers mm_turn_grpo)

    data = DataProto(
        batch=TensorDict({"token_level_rewards": REWARDS.clone(), "response_mask": MASK.clone()}, batch_size=2),
        non_tensor_batch={"uid": UIDS},
    )
    config = AlgoConfig(adv_estimator="mm_turn_grpo", gamma=0.5)
    out = compute_advantage(data, adv_estimator="mm_turn_grpo", config=config)
    expected, _ = compute_turn_grpo_advantage(REWARDS, MASK, UIDS, config=config)
    assert torch.equal(out.batch["advantages"], expected)


def test_place_turn_rewards_on_each_turns_last_token():
    rm_scores = torch.zeros(3, 10)
    rm_scores[0, 5] = 0.9  # the reward manager's final score
    mask = torch.cat([MASK, torch.zeros(1, 10, dtype=MASK.dtype)])
    skipped = place_turn_rewards(rm_scores, [turn_spans(row) for row in mask], [[0.25, 1.0], [0.5, 0.5], [1.0]])
    assert skipped == 1  # B has one turn but two rewards; the masked third row is left alone, not counted
    assert rm_scores[0].tolist() == [0, 0.25, 0, 0, 0, pytest.approx(1.9), 0, 0, 0, 0]
    assert rm_scores[1:].abs().sum() == 0


def test_a_trajectory_exported_as_samples_gets_its_per_trajectory_advantages_through_verls_v1_path():
    """Trajectory A of the tests above, exported per turn: sample A1 = turn 1, A2 = turn 2 (two tokens each, their
    context gone); B one sample. Chained as the step hook chains them, marked as the hook marks them, verl's v1
    advantage code must give every turn the advantage it has in the one-sample trajectory."""
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    import verl_mm_tools.plugin  # noqa: F401  (registers mm_turn_grpo)

    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]])
    rewards = torch.zeros(3, 3)
    assert place_turn_rewards(rewards, [[(0, 2)], [(0, 2)], [(0, 3)]], [[1.0], [0.0], [0.0]]) == 0
    chain_sample_returns(rewards, [0, 1], [[(0, 2)], [(0, 2)]], gamma=0.5)
    assert rewards[0].tolist() == [0, 1.0, 0]  # G_A1 = 1 + 0.5 * G_A2, and G_A2 = 0
    data = DataProto(
        batch=TensorDict({"token_level_rewards": rewards, "response_mask": mask}, batch_size=3),
        non_tensor_batch={"uid": np.array(["a", "a" + CONTINUATION_MARK, "a"], dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(
        data,
        batch_keys=["a_0_0", "a_0_1", "a_1_0"],
        adv_estimator="mm_turn_grpo",
        gamma=0.5,
        config=AlgoConfig(adv_estimator="mm_turn_grpo", gamma=0.5),
    )
    s = 0.5**0.5 + 1e-6  # b = 0.5 and s = std([1, 0]) over the trajectories' whole returns, as for A and B above
    expected = torch.tensor([[0.5 / s, 0.5 / s, 0], [-0.5 / s, -0.5 / s, 0], [-0.5 / s] * 3])
    assert torch.allclose(out.batch["advantages"], expected, atol=1e-6)


def test_chaining_carries_a_later_samples_return_back_discounted():
    rewards = torch.zeros(3, 4)
    rewards[2, 3] = 2.0  # the final reward, on the final sample
    chain_sample_returns(rewards, [0, 1, 2], [[(0, 1), (2, 3)], [(0, 2)], [(0, 4)]], gamma=0.5)
    # sample 3's return 2.0 -> sample 2's last turn gets 0.5 * 2 = 1.0 -> its return 1.0 -> sample 1's last turn 0.5
    assert rewards.tolist() == [[0, 0, 0.5, 0], [0, 1.0, 0, 0], [0, 0, 0, 2.0]]
