"""The v1 trainer's step hook, ``MMToolReplayBuffer``, sampling from a real TransferQueue (local Ray) with verl's
own replay-buffer logic: rows stored as verl's ``AgentLoopWorkerTQ`` stores them, exact metrics and rewards back."""

from __future__ import annotations

import pytest
import torch

from verl_mm_tools.agent_loop.state import TrajectoryState, TrajectoryStats
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.handoff import LoopSettings


def buffer(trainer_mode="sync", **sampler_kwargs):
    from verl_mm_tools.step_hook.replay_buffer import MMToolReplayBuffer

    # the keyword arguments verl's PPOTrainer._build_replay_buffer passes a custom sampler
    return MMToolReplayBuffer(
        trainer_mode=trainer_mode,
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs=sampler_kwargs,
        refill_fn=None,
    )


def trajectory(calls: int, *, masked=False, turn_credit=False, turns=()) -> dict:
    """The extra fields of a trajectory with these (response span, reward) turns."""
    state = TrajectoryState(stats=TrajectoryStats(images=1 + calls))
    for _ in range(calls):
        state.stats.record_call("rotate", 0.01, failed=False)
    for span, reward in turns:
        state.start_turn(prompt_end=0, images_before=1).response_span, state.turns[-1].reward = span, reward
    if masked:
        state.mask("ValueError: broken")
    settings = LoopSettings(max_masked_fraction=0.5, call_rate_window=0, turn_credit=turn_credit, turn_gamma=1.0)
    return {
        **state.sample_fields(settings).extra_fields(),
        "reward_extra_info": {"score": 1.0},
        "min_global_steps": 3,
        "max_global_steps": 3,
    }


def put_group(
    tq, uid: str, rows: list[tuple[list[int], list[float], dict]], step: int = 3, keys=None, versions=None
) -> None:
    """A finished prompt group as verl's AgentLoopWorkerTQ leaves it: one key per session (or the given
    ``{uid}_{session}_{sample}`` keys), then the prompt tag; ``versions``: each row's weight version (default
    ``step``; None as verl tags a sample that never generated)."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys = keys or [f"{uid}_{session}_0" for session in range(len(rows))]
    fields = [
        {"response_mask": torch.tensor(mask), "rm_scores": torch.tensor(scores), "extra_fields": extra, "uid": uid}
        for mask, scores, extra in rows
    ]
    versions = versions or [step] * len(rows)
    tags = [
        {"status": "success", "global_steps": step, "min_global_steps": version, "max_global_steps": version}
        for version in versions
    ]
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": step})


def test_sampling_adds_mm_tool_metrics_and_places_turn_rewards(transfer_queue):
    tq = transfer_queue
    put_group(
        tq,
        "group1",
        [
            (
                [1, 1, 0, 0, 1],
                [0, 0, 0, 0, 1.0],
                trajectory(2, turn_credit=True, turns=[((0, 2), 0.5), ((4, 5), 0.25)]),
            ),
            ([1, 1, 1], [0, 0, 0.0], trajectory(0, turn_credit=True, turns=[((0, 3), 0.0)])),
        ],
    )
    batch, metrics = buffer().sample(global_steps=3, partition_id="train", batch_size=1)
    assert sorted(batch.keys) == ["group1_0_0", "group1_1_0"]
    assert metrics["tool_call_counts/mean"] == 1.0 and metrics["tool_call_counts/max"] == 2.0
    assert metrics["mm_tool/tool/rotate/calls_per_trajectory"] == 1.0
    assert metrics["mm_tool/tool_call_rate"] == metrics["mm_tool/tool/rotate/call_rate"] == 0.5  # 2 calls and none
    assert metrics["mm_tool/reward/with_tool_calls"] == 1.0 and metrics["mm_tool/reward/without_tool_calls"] == 0.0
    assert metrics["mm_tool/images/mean"] == 2.0
    assert metrics["mm_tool/masked/count"] == 0
    assert metrics["mm_tool/turn_rewards/unplaced"] == 0
    scores = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["rm_scores"])["rm_scores"]
    by_key = dict(zip(batch.keys, (row.tolist() for row in scores.unbind()), strict=True))
    assert by_key == {"group1_0_0": [0, 0.5, 0, 0, 1.25], "group1_1_0": [0, 0, 0]}
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_a_sample_masked_before_it_generated_gets_the_batchs_oldest_weight_version(transfer_queue):
    """verl's v1 trainer reads every tag's versions as ints; a browser that failed to launch left them None."""
    from verl_mm_tools.handoff import fill_missing_weight_versions

    tq = transfer_queue
    lost = trajectory(0, masked=True)
    put_group(tq, "group6", [([1, 1], [0, 1.0], trajectory(1)), ([0], [0.0], lost)], step=4, versions=[2, None])
    batch, metrics = buffer().sample(global_steps=4, partition_id="train", batch_size=1)
    versions = {key: (tag["min_global_steps"], tag["max_global_steps"]) for key, tag in zip(batch.keys, batch.tags)}
    assert versions == {"group6_0_0": (2, 2), "group6_1_0": (2, 2)}
    assert metrics["mm_tool/unversioned_samples"] == 1.0
    tq.kv_clear(keys=batch.keys, partition_id="train")
    alone = [{"min_global_steps": None, "max_global_steps": None}]
    assert fill_missing_weight_versions(alone, fallback=6) == 1 and alone[0]["min_global_steps"] == 6
    assert fill_missing_weight_versions([{"min_global_steps": 1, "max_global_steps": 2}], fallback=6) == 0


def test_a_trajectory_the_judge_could_not_score_is_masked_in_transfer_queue(transfer_queue):
    """``on_failure: mask``: the hook zeroes the sample's response mask and writes it back, where verl reads it."""
    tq = transfer_queue
    verdict = {"judge_score": 0.0, "judge_judged": 0.0, "judge_unparseable": 0.0, "judge_failed": 1.0}
    verdict |= {"judge_cached": 0.0, "judge_latency_s": 1.5, "judge_mask": 1.0}
    failed = {**trajectory(0), "reward_extra_info": {"score": 0.0, **verdict}}
    judged = {**trajectory(1), "reward_extra_info": {"score": 0.8, **verdict, "judge_score": 0.8, "judge_judged": 1.0}}
    judged["reward_extra_info"] |= {"judge_failed": 0.0, "judge_mask": 0.0, "judge_latency_s": 0.5}
    put_group(tq, "group5", [([1, 1, 0, 1], [0, 0, 0, 0.0], failed), ([1, 1, 1], [0, 0, 0.8], judged)])
    batch, metrics = buffer().sample(global_steps=3, partition_id="train", batch_size=1)
    masks = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["response_mask"])["response_mask"]
    by_key = dict(zip(batch.keys, (row.tolist() for row in masks.unbind()), strict=True))
    assert by_key == {"group5_0_0": [0, 0, 0, 0], "group5_1_0": [1, 1, 1]}
    assert (metrics["mm_tool/judge/masked/count"], metrics["mm_tool/judge/failed/count"]) == (1.0, 1.0)
    assert metrics["mm_tool/judge/score/mean"] == 0.8 and metrics["mm_tool/judge/latency_s/mean"] == 1.0
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_a_batch_of_masked_trajectories_stops_the_run(transfer_queue):
    from verl_mm_tools.step_hook.step import MaskedBatchError

    put_group(transfer_queue, "group2", [([0], [0.0], trajectory(0, masked=True))] * 2)
    with pytest.raises(MaskedBatchError, match="^2 of 2 mm_tool trajectories of training step 3 were masked"):
        buffer().sample(global_steps=3, partition_id="train", batch_size=1)


def test_async_modes_get_verls_async_buffer_and_the_poll_interval_is_an_option():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    from verl_mm_tools.step_hook.replay_buffer import DEFAULT_POLL_INTERVAL_S, MMToolReplayBufferAsync

    assert not isinstance(buffer("sync"), ReplayBufferAsync)
    assert isinstance(buffer("colocate_async"), MMToolReplayBufferAsync)
    assert isinstance(buffer("separate_async"), ReplayBufferAsync)
    assert buffer().poll_interval == DEFAULT_POLL_INTERVAL_S
    assert buffer(poll_interval_s=0.5).poll_interval == 0.5


@pytest.mark.parametrize(
    "options, message",
    [
        ({"poll_interval_s": 0}, "poll_interval_s must be in (0, 60] seconds, got 0"),
        ({"poll_interval_s": "1"}, "poll_interval_s must be in (0, 60] seconds, got '1'"),
        ({"poll_intervals": 1}, "unknown trainer.v1.sampler.sampler_kwargs ['poll_intervals'] for MMToolReplayBuffer"),
    ],
)
def test_bad_sampler_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        buffer(**options)


def test_a_batch_without_rewards_yet_reads_as_no_scores(transfer_queue):
    """With a colocated reward model verl scores the batch after sampling: no rm_scores in TransferQueue yet."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from verl_mm_tools.step_hook.replay_buffer import read_step_batch

    fields = [{"response_mask": torch.tensor([1, 1, 0]), "extra_fields": trajectory(1)}]
    transfer_queue.kv_batch_put(keys=["group3_0_0"], partition_id="train", fields=list_of_dict_to_tensordict(fields))
    step, lengths = read_step_batch(["group3_0_0"], "train", global_steps=4)
    assert step.rm_scores is None and lengths == [3] and step.rollout_n == [0] and step.step == 4
    assert step.response_mask.tolist() == [[1, 1, 0]]
    assert [fields.tool_call_counts for _, fields in step.ours] == [1]
    transfer_queue.kv_clear(keys=["group3_0_0"], partition_id="train")


def test_a_trajectory_exported_as_samples_counts_once_and_its_turn_credit_is_chained(transfer_queue):
    """Session 0 exported as two samples (verl copied its final reward 1.0 to the first), session 1 as one."""
    tq = transfer_queue

    def sample(index, count, turns, calls=2):
        fields = trajectory(calls, turn_credit=True, turns=[((0, 1), 0.0)] * count)
        spans, rewards = zip(*turns)
        return {
            **fields,
            "mm_tool/sample": [index, count],
            "mm_tool/turn_spans": [list(span) for span in spans],
            "mm_tool/turn_rewards": list(rewards),
            "mm_tool/turn_gamma": 0.5,
        }

    put_group(
        tq,
        "group3",
        [
            ([1, 1, 1], [0, 0, 1.0], sample(0, 2, [((0, 3), 0.5)])),
            ([1, 1], [0, 1.0], sample(1, 2, [((0, 2), 0.25)])),
            ([1, 1, 1, 1], [0, 0, 0, 0.0], sample(0, 1, [((0, 4), 0.0)], calls=0)),
        ],
        keys=["group3_0_0", "group3_0_1", "group3_1_0"],
    )
    batch, metrics = buffer().sample(global_steps=3, partition_id="train", batch_size=1)
    assert sorted(batch.keys) == ["group3_0_0", "group3_0_1", "group3_1_0"]
    assert metrics["mm_tool/samples_per_trajectory"] == 1.5
    assert metrics["mm_tool/reward/mean"] == 0.5  # the reward manager's scores per trajectory: 1.0 and 0.0
    assert metrics["tool_call_counts/mean"] == 1.0  # per trajectory: (2 + 0) / 2, not per sample
    assert metrics["mm_tool/tool/rotate/calls_per_trajectory"] == 1.0
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["rm_scores", "uid"])
    by_key = dict(zip(batch.keys, (row.tolist() for row in data["rm_scores"].unbind()), strict=True))
    # the final sample: final reward + its turn reward; G = 1.25. The first: the copy of the final reward removed,
    # its turn reward 0.5 plus 0.5 x 1.25 on its last token.
    assert by_key == {"group3_0_0": [0, 0, 1.125], "group3_0_1": [0, 1.25], "group3_1_0": [0, 0, 0, 0]}
    uids = dict(zip(batch.keys, data["uid"], strict=True))
    assert uids == {"group3_0_0": "group3", "group3_0_1": "group3#mm_turn_sample", "group3_1_0": "group3"}
    tq.kv_clear(keys=batch.keys, partition_id="train")
