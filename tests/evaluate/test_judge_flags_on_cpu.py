"""The ``--judge`` flags of ``eval`` and ``rescore`` (``evaluate.judging``): what they ask of verl's trainer config,
read back through hydra; the loop's ``judge_images``; and the mistakes refused with what to do."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_mm_tools.cli import main
from verl_mm_tools.data.common import image_row, write_parquet
from verl_mm_tools.errors import ConfigError
from verl_mm_tools.evaluate.judging import JudgeFlags, hydra_value, judge_figures
from verl_mm_tools.evaluate.run import NO_TOOLS, EvalOptions, loop_entries, trainer_overrides
from verl_mm_tools.runtime.config import compose_trainer_config
from verl_mm_tools.testkit.sample_dump import sample_image

URL = "http://127.0.0.1:8000/v1"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    row = image_row("s", "<image>What?", sample_image(), "90", {"index": 0}, "mm_tool")
    return write_parquet([row], tmp_path_factory.mktemp("data") / "rows.parquet")


STRINGS = ["it's \\ a\\'b", "end\\", "${not.an.interpolation}", "a b,c{d}[e]=:x", "{{ question }}"]


def test_the_reward_options_reach_verls_config_exactly(tmp_path):
    (tmp_path / "rubric.j2").write_text("Grade it.")
    options = {"rubric_path": str(tmp_path / "rubric.j2"), "max_score": 5, "fallback_score": 0.25, "retries": 0}
    flags = JudgeFlags(URL, "Qwen/Qwen2.5-VL-7B-Instruct", tmp_path / "rubric.j2", options={"rule_weight": 0.5})
    assert flags.reward_kwargs(None) == {"endpoint": URL, "model": "Qwen/Qwen2.5-VL-7B-Instruct",
                                         "rule_weight": 0.5, "rubric_path": options["rubric_path"]}  # fmt: skip
    config = compose_trainer_config("m", flags.overrides("exact_answer_reward"))
    assert OmegaConf.to_container(config.reward.custom_reward_function, resolve=True) == {
        "path": "pkg://verl_mm_tools.rewards.judge",
        "name": "judge_reward",
        "reward_kwargs": {
            "endpoint": URL,
            "model": "Qwen/Qwen2.5-VL-7B-Instruct",
            "rule_weight": 0.5,
            "rubric_path": options["rubric_path"],
            "rule_reward": "exact_answer_reward",
        },
    }


def test_hydra_values_come_back_as_given():
    value = {"text": STRINGS, "nested": {"require_tag": True, "none": None, "ratio": 0.1}}
    config = compose_trainer_config("m", ["+reward.custom_reward_function.reward_kwargs=" + hydra_value(value)])
    assert OmegaConf.to_container(config.reward.custom_reward_function.reward_kwargs, resolve=True) == value
    with pytest.raises(ConfigError, match="judge option key 'a-b' must be a name"):
        hydra_value({"a-b": 1})


def test_eval_scores_with_the_judge_and_hands_the_loop_judge_images(data, tmp_path):
    flags = JudgeFlags(URL, "judge", images="last:2", options={"rule_weight": 1.0})
    options = EvalOptions(
        data=data, out=tmp_path, model_path="m", modes=(NO_TOOLS,), reward_fn="exact_answer_reward", judge=flags
    )
    overrides = trainer_overrides(options, NO_TOOLS)
    assert "reward.custom_reward_function.name=judge_reward" in overrides
    assert not any("reward_kwargs.reward_fn" in override for override in overrides)  # the rule joins the judge
    assert loop_entries(options, NO_TOOLS)[-1]["judge_images"] == "last:2"
    loops = tmp_path / "loops.yaml"
    loops.write_text("- {name: mm_tool, _target_: verl_mm_tools.agent_loop.MMToolAgentLoop, judge_images: named}\n")
    unset = JudgeFlags(URL, "judge")
    from_config = EvalOptions(
        data=data, out=tmp_path, model_path="m", modes=(NO_TOOLS,), loop_config=loops, judge=unset
    )
    assert loop_entries(from_config, NO_TOOLS)[-1]["judge_images"] == "named"  # the training run's choice
    plain = EvalOptions(data=data, out=tmp_path, model_path="m", modes=(NO_TOOLS,), judge=unset)
    assert loop_entries(plain, NO_TOOLS)[-1]["judge_images"] == "all"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--judge-model", "j"], "--judge-model needs --judge URL"),
        (["--judge", URL], "--judge needs --judge-model NAME"),
        (["--judge", URL, "--judge-model", "j", "--reward-fn", "exact_answer_reward"],
         "--reward-fn exact_answer_reward with --judge adds that rule reward to the judge's: give its weight with "
         "--judge-option rule_weight=W"),
        (["--judge", URL, "--judge-model", "j", "--judge-option", "endpoint=http://x/v1"],
         "--judge-option endpoint=...: give it as --judge"),
        (["--judge", URL, "--judge-model", "j", "--judge-option", "max_scor=5"],
         "unknown judge option(s) ['max_scor']"),
        (["--judge", URL, "--judge-model", "j", "--judge-option", "max_score"],
         "--judge-option takes KEY=VALUE (e.g. max_score=10), got 'max_score'"),
        (["--judge", URL, "--judge-model", "j", "--judge-option", "min_score=5", "--judge-option", "max_score=1"],
         "judge min_score (5) must be below max_score (1)"),
        (["--judge", URL, "--judge-model", "j", "--judge-rubric", "/nonexistent/rubric.j2"],
         "--judge-rubric /nonexistent/rubric.j2: no such file"),
        (["--judge", "127.0.0.1:8000", "--judge-model", "j"], "judge endpoint must be an http(s) URL"),
    ],
)  # fmt: skip
def test_judge_mistakes_are_refused_with_what_to_do(flags, message, data, tmp_path, capsys):
    for command in (
        ["eval", "--data", str(data), "--endpoint", URL, "--model", "m", "--no-tools", "--out", str(tmp_path / "e")],
        ["rescore", str(tmp_path), "--out", str(tmp_path / "r")],
    ):
        assert main([*command, *flags]) == 2
        assert message in capsys.readouterr().err


def test_a_bad_image_choice_is_a_usage_error(data, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--data", str(data), "--endpoint", URL, "--judge", URL, "--judge-images", "last:0"])
    assert "--judge-images: must be all, none, named or last:N (N >= 1), got 'last:0'" in capsys.readouterr().err


def test_the_judges_figures_count_only_the_rows_it_scored():
    columns = {
        "judge_score": [0.9, 0.0, 0.25, None],
        "judge_judged": [1.0, 0.0, 0.0, None],
        "judge_unparseable": [0.0, 1.0, 0.0, None],
        "judge_failed": [0.0, 0.0, 1.0, None],
        "judge_cached": [1.0, 0.0, 0.0, None],
    }
    assert judge_figures(columns, [0, 1, 2, 3]) == {
        "judged": 1,
        "parse_failures": 1,
        "failed": 1,
        "cache_hits": 1,
        "score_mean": 0.9,
    }
    assert judge_figures(columns, [3]) is None and judge_figures({}, [0]) is None
