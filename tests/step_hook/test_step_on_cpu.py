"""The step hook both trainers run (``step.process_step``), on real mm_tool outputs of the tiny VLM through verl's
AgentLoopWorker: the masked-batch guard, metrics, turn rewards; and which hook a config selects."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from handoff_rows import columns
from PIL import Image

from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.hook_config import hook_overrides, step_hook_configured
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt
from verl_mm_tools.runtime.config import compose_trainer_config
from verl_mm_tools.step_hook.batch import StepBatch
from verl_mm_tools.step_hook.manager import step_batch
from verl_mm_tools.step_hook.step import MaskedBatchError, process_step
from verl_mm_tools.step_metrics import GENERATE_S_MAX

ANSWER = "<answer>90</answer><|im_end|>"
CLASSIC = ["trainer.use_v1=false"]
# With the default system prompt, the short question renders to 358 tokens and the long ones to 414: a prompt length
# of 400 masks exactly the three long ones (verl refuses to truncate a multimodal prompt).
PROMPT_LENGTH = 400


def prompts(long: int, short: int = 1) -> list:
    picture = Image.new("RGB", (56, 56), (200, 0, 0))
    return [image_prompt("What color?", [picture])] * short + [image_prompt("What color? " * 20, [picture])] * long


def run_step(rollout, rows, *, validate=False, **loop_options):
    output, _, _ = rollout.run(
        [ANSWER], rows, prompt_length=PROMPT_LENGTH, loop_options=loop_options or None, extra=CLASSIC
    )
    return process_step(step_batch(output, {"global_steps": 7, "validate": validate}))


def test_a_batch_with_most_trajectories_masked_stops_the_run_with_the_most_common_error(rollout):
    with pytest.raises(MaskedBatchError) as raised:
        run_step(rollout, prompts(long=3))
    message = str(raised.value)
    assert message.startswith(
        "3 of 4 mm_tool trajectories of training step 7 were masked (trained on nothing), more "
        "than max_masked_fraction=0.5; the most common error (3 of them): ValueError: "
        "Multimodal prompt produced 414 tokens, exceeding rollout.prompt_length=400."
    )
    assert message.endswith("or raise max_masked_fraction in the mm_tool agent-loop config.")


def test_the_slowest_trajectorys_time_in_the_engine_is_verls_own_timer(rollout):
    """verl's v1 trainer drops the loops' ``generate_sequences`` timers; mm_tool carries each trajectory's (the
    worker's per-trajectory metrics, which the classic trainer's manager takes the largest of) and logs the largest:
    bench figure 5 takes the rollout's share outside generation from it on both trainers."""
    output, _, _ = rollout.run([ANSWER], prompts(long=0, short=3), prompt_length=PROMPT_LENGTH, extra=CLASSIC)
    seconds = list(output.non_tensor_batch["mm_tool/generate_s"])
    assert seconds == [metrics["generate_sequences"] for metrics in output.meta_info["metrics"]]
    assert len(seconds) == 3 and min(seconds) > 0
    assert process_step(step_batch(output, {"global_steps": 7, "validate": False}))[GENERATE_S_MAX] == max(seconds)


def test_the_batch_holds_exactly_the_keys_of_the_typed_hand_off_and_reads_back_as_it(rollout):
    """verl concatenates each extra field across workers: the loop writes every ``SampleFields`` key, no other, and
    the trainer side reads each row back to the record the loop built."""
    output, _, _ = rollout.run([ANSWER], prompts(long=0, short=2), prompt_length=PROMPT_LENGTH, extra=CLASSIC)
    keys = {SampleFields.key(item.name) for item in dataclasses.fields(SampleFields)}
    ours = {key for key in output.non_tensor_batch if key.startswith("mm_tool/")}
    assert ours == {key for key in keys if key.startswith("mm_tool/")} and len(keys) == len(ours) + 3
    rows = SampleFields.every_row(output.non_tensor_batch)
    assert [(fields.stop_reason, fields.turns, fields.tool_calls, fields.sample) for fields in rows] == [
        ("answered", 1, 0, [0, 1])
    ] * 2
    assert rows[0].extra_fields() == {key: output.non_tensor_batch[key][0] for key in keys}


def test_the_guard_checks_validation_batches_too(rollout):
    with pytest.raises(MaskedBatchError, match="^4 of 4 mm_tool trajectories of validation step 7 were masked"):
        run_step(rollout, prompts(long=4, short=0), validate=True)


def test_masked_trajectories_within_the_limit_are_counted_and_training_goes_on(rollout):
    metrics = run_step(rollout, prompts(long=3), max_masked_fraction=0.75)
    assert metrics["mm_tool/masked/count"] == 3
    assert metrics["mm_tool/masked/mean"] == 0.75
    assert metrics["mm_tool/stop/error"] == 0.75
    assert metrics["mm_tool/stop/answered"] == 0.25
    assert "tool_call_counts/mean" not in metrics  # verl's classic trainer logs it itself; the v1 buffer adds it
    assert "mm_tool/turn_rewards/unplaced" not in metrics  # GRPO: no turn credit


@pytest.mark.parametrize("fraction", [-0.1, 1.5, "half", True])
def test_max_masked_fraction_must_be_a_fraction(fraction):
    with pytest.raises(ConfigError, match=f"max_masked_fraction must be a number in \\[0, 1\\], got {fraction!r}"):
        MMToolLoopConfig.from_options({"max_masked_fraction": fraction}, limit_images=None)


def test_turn_rewards_land_on_each_turns_last_token_only_for_rows_with_turn_credit():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]])
    scores = torch.zeros(3, 6)
    scores[:, 4] = 1.0
    batch = StepBatch(
        columns=columns(  # as the loop recorded them
            {"turn_credit": True, "turn_rewards": [0.25, 0.5], "turn_spans": [[0, 2], [4, 5]]},
            {"turn_credit": False, "turn_rewards": [0.25, 0.5], "turn_spans": [[0, 2], [4, 5]]},
            {"turn_credit": True, "turn_rewards": [1, 2], "turn_spans": [[0, 1]]},
        ),
        response_mask=mask,
        rm_scores=scores,
        rollout_n=[0, 1, 2],
    )
    metrics = process_step(batch)
    assert batch.rm_scores.tolist() == [[0, 0.25, 0, 0, 1.5, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 0]]
    assert metrics["mm_tool/turn_rewards/unplaced"] == 1.0  # the third row has 1 turn but 2 rewards


@pytest.mark.parametrize(
    "overrides, configured",
    [
        ([], False),
        (
            [
                "trainer.v1.sampler.custom_sampler.path=pkg://verl_mm_tools.step_hook.replay_buffer",
                "trainer.v1.sampler.custom_sampler.name=MMToolReplayBuffer",
            ],
            True,
        ),
        (
            [
                "trainer.v1.sampler.custom_sampler.path=pkg://verl_mm_tools.step_hook.replay_buffer",
                "trainer.v1.sampler.custom_sampler.name=MMToolReplayBufferAsync",
            ],
            True,
        ),  # a subclass
        (
            [
                "trainer.v1.sampler.custom_sampler.path=pkg://verl.trainer.ppo.v1.replay_buffer",
                "trainer.v1.sampler.custom_sampler.name=ReplayBuffer",
            ],
            False,
        ),
        (
            [
                "+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                "verl_mm_tools.step_hook.manager.MMToolAgentLoopManager"
            ],
            False,
        ),  # the classic hook on the v1 trainer
        (
            [
                "trainer.use_v1=false",
                "+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                "verl_mm_tools.step_hook.manager.MMToolAgentLoopManager",
            ],
            True,
        ),
        (["trainer.use_v1=false"], False),
    ],
)
def test_the_hook_of_the_trainer_in_use_is_recognised(tiny_model_dir, overrides, configured):
    config = compose_trainer_config(str(tiny_model_dir), overrides)
    assert step_hook_configured(config) is configured
    if not configured:  # what the loop's warning and errors tell the user to set
        fixed = compose_trainer_config(str(tiny_model_dir), [*overrides, *hook_overrides(config)])
        assert step_hook_configured(fixed)


def test_dapo_group_filtering_with_the_v1_hook_is_refused_not_silently_dropped(rollout):
    hook = hook_overrides(v1=True)
    with pytest.raises(
        Exception,
        match=r"algorithm.filter_groups.enable=true \(DAPO dynamic sampling\) does not "
        r"work with verl-mm-tools' replay buffer",
    ):
        rollout.run([ANSWER], prompts(long=0), extra=[*hook, "algorithm.filter_groups.enable=true"])


def call_rate_step(step: int, window, *, validate=False) -> StepBatch:
    """A training step's batch as the tool-call guard reads it: each row's loop option ``call_rate_window``."""
    return StepBatch(
        columns=columns(*[{"call_rate_window": window}] * 4),
        response_mask=torch.ones(4, 3),
        rm_scores=None,
        rollout_n=[0, 1, 2, 3],
        step=step,
        validate=validate,
    )


def test_the_tool_call_guard_warns_when_the_call_rate_falls_below_half_its_recent_peak(caplog):
    from verl_mm_tools.step_hook.step import CallRateWatch

    watch, flags = CallRateWatch(), []
    for step, rate in enumerate((0.5, 0.8, 0.6, 0.41, 0.39, 0.2), start=1):
        metrics = {"mm_tool/tool_call_rate": rate}
        watch.check(call_rate_step(step, 3), metrics)
        flags.append(metrics.get("mm_tool/tool_call_rate/collapsed"))
    # step 5: 0.39 < 0.8 / 2 (step 2, within the last 3 steps); step 6: the peak of steps 3-5 is 0.6, and 0.2 < 0.3
    assert flags == [None, 0.0, 0.0, 0.0, 1.0, 1.0]
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warnings[0] == (
        "tool-use collapse: 39% of step 5's trajectories called a tool, against 80% at step 2 (within the last 3 "
        "steps, the mm_tool option call_rate_window). The policy is dropping its tools: check that calling can pay "
        "(the reward, the tools' errors: mm_tool/tool/*/error_rate), and consider a KL loss to the starting policy "
        "or a lower learning rate."
    )
    assert len(warnings) == 2 and warnings[1].startswith("tool-use collapse: 20% of step 6's trajectories")


def test_the_tool_call_guard_skips_validation_and_a_window_of_zero(caplog):
    from verl_mm_tools.step_hook.step import CallRateWatch

    watch = CallRateWatch()
    watch.check(call_rate_step(1, 5), {"mm_tool/tool_call_rate": 0.9})
    validation = {"mm_tool/tool_call_rate": 0.0}
    watch.check(call_rate_step(2, 5, validate=True), validation)  # greedy validation: not the policy's call rate
    off = {"mm_tool/tool_call_rate": 0.0}
    CallRateWatch().check(call_rate_step(1, 0), off)
    assert watch.rates == [(1, 0.9)] and "mm_tool/tool_call_rate/collapsed" not in validation | off
    assert not caplog.records


def test_call_rate_window_must_be_a_whole_number_of_steps():
    with pytest.raises(ConfigError, match=r"call_rate_window must be a whole number of steps >= 0 \(0: off\), got -1"):
        MMToolLoopConfig(call_rate_window=-1)


def test_the_loop_hands_a_judge_the_question_and_images_and_the_step_hook_drops_them_once_scored(rollout):
    import io

    import numpy as np

    from verl_mm_tools.judge.context import ImageOrigin, JudgeContext

    output, _, _ = rollout.run(
        [ANSWER],
        prompts(long=0, short=2),
        prompt_length=PROMPT_LENGTH,
        loop_options={"judge_images": "all"},
        extra=CLASSIC,
    )
    key = SampleFields.key("judge_context")
    context = output.non_tensor_batch[key][0]
    assert isinstance(context, JudgeContext) and context.question == "What color?"
    assert [(image.image_id, image.origin) for image in context.images] == [(1, ImageOrigin.PROMPT)]
    shown = Image.open(io.BytesIO(context.images[0].png))
    assert shown.size == (56, 56) and shown.getpixel((3, 3)) == (200, 0, 0)

    # the reward worker scored both: the first could not be judged under on_failure: mask
    verdicts = {"judge_score": [0.0, 0.75], "judge_judged": [0.0, 1.0], "judge_unparseable": [0.0, 0.0]}
    verdicts |= {"judge_failed": [1.0, 0.0], "judge_cached": [0.0, 1.0], "judge_latency_s": [2.5, 0.0]}
    verdicts |= {"judge_mask": [1.0, 0.0]}
    for name, values in verdicts.items():
        output.non_tensor_batch[name] = np.array(values)
    output.meta_info["reward_extra_keys"] = list(verdicts)
    output.batch["rm_scores"] = torch.zeros_like(output.batch["response_mask"], dtype=torch.float32)
    generated = int(output.batch["response_mask"][1].sum())
    metrics = process_step(step_batch(output, {"global_steps": 3}))
    assert list(output.non_tensor_batch[key]) == [None, None]  # the PNG bytes left the batch
    assert int(output.batch["response_mask"][0].sum()) == 0 and int(output.batch["response_mask"][1].sum()) == generated
    judge = {name: value for name, value in metrics.items() if name.startswith("mm_tool/judge/")}
    assert judge == {
        "mm_tool/judge/score/mean": 0.75,
        "mm_tool/judge/judged/count": 1.0,
        "mm_tool/judge/parse_failures/count": 0.0,
        "mm_tool/judge/failed/count": 1.0,
        "mm_tool/judge/fallbacks/count": 1.0,
        "mm_tool/judge/cache_hits/count": 1.0,
        "mm_tool/judge/latency_s/mean": 2.5,
        "mm_tool/judge/latency_s/max": 2.5,
        "mm_tool/judge/masked/count": 1.0,
    }


def test_a_judge_images_option_that_names_no_choice_is_refused():
    with pytest.raises(ConfigError, match="judge_images must be all, none, named or last:N"):
        MMToolLoopConfig(judge_images="first")
