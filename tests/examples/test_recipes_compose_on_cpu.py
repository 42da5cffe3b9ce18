"""Every recipe under examples/recipes composes through verl's hydra config (for vLLM and for SGLang), and every
name it references resolves: agent loop, its options, tools (through verl's own YAML loader), reward function or
manager, advantage estimator, the trainer's step hook. Recipes cannot rot silently."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import verl_mm_tools.plugin  # noqa: F401  (registers our names, as `import verl` does through the entry point)
from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.agent_loop.hook_config import step_hook_configured
from verl_mm_tools.agent_loop.mm_tool_loop import VERL_LOOP_KWARGS

pytestmark = pytest.mark.integration  # verl's whole trainer config, composed per recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes"
NAMES = sorted(path.stem for path in RECIPES.glob("*.yaml") if path.stem != "common")


def compose_recipe(name: str, backend: str):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name=name, overrides=[f"actor_rollout_ref.rollout.name={backend}"])


def test_the_recipes_are_the_documented_ones():
    assert NAMES == ["code", "geo3k_retry", "judge", "miniwob", "rotation_180", "rotation_45", "video", "zoom"]
    assert all((RECIPES / f"run_{name}.sh").is_file() for name in NAMES)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("name", NAMES)
def test_recipe_composes_and_every_name_resolves(name, backend, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # run.sh launches from the repository root; relative paths resolve there
    monkeypatch.setenv("HOME", str(tmp_path))  # where the recipes' data lives (make-data's --out in their comments)
    config = compose_recipe(name, backend)
    OmegaConf.to_container(config, resolve=True)  # every interpolation resolves
    rollout = config.actor_rollout_ref.rollout
    assert rollout.name == backend and rollout.multi_turn.enable and rollout.multi_turn.format == "hermes"
    _check_rollout_dataclass(rollout)
    _check_agent_loops(rollout)
    _check_tools(rollout.multi_turn.tool_config_path)
    _check_reward(config.reward)
    _check_estimator(config.algorithm.adv_estimator)
    assert step_hook_configured(config)  # the v1 trainer's: verl-mm-tools' replay buffer


def _check_rollout_dataclass(rollout):
    from verl.utils.config import omega_conf_to_dataclass

    omega_conf_to_dataclass(rollout)  # verl's own typed view of the rollout section


def _check_agent_loops(rollout):
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    entries = OmegaConf.load(rollout.agent.agent_loop_config_path)
    names = {entry.name for entry in entries} | set(_agent_loop_registry)
    assert rollout.agent.default_agent_loop in names
    for entry in entries:
        _check_class(entry._target_)
        options = {
            key: value
            for key, value in OmegaConf.to_container(entry).items()
            if key != "_target_" and key not in VERL_LOOP_KWARGS
        }
        for root in options.get("file_roots") or []:
            Path(root).expanduser().mkdir(parents=True, exist_ok=True)  # the data make-data writes there
        MMToolLoopConfig.from_options(options, limit_images=rollout.get("limit_images"))


def _check_tools(tool_config_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    tools = initialize_tools_from_config(tool_config_path)
    assert tools and len({tool.name for tool in tools}) == len(tools)


def _check_reward(reward):
    from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls

    get_reward_manager_cls(reward.reward_manager.name)
    custom = reward.custom_reward_function
    if custom.path:
        module = importlib.import_module(custom.path.removeprefix("pkg://"))
        assert callable(getattr(module, custom.name))
    if reward.get("reward_kwargs", {}).get("reward_fn"):
        from verl_mm_tools.rewards import get_reward_function

        get_reward_function(reward.reward_kwargs.reward_fn)


def _check_estimator(name):
    from verl.trainer.ppo.core_algos import AdvantageEstimator, get_adv_estimator_fn

    if name not in {AdvantageEstimator.GRPO.value, AdvantageEstimator.GAE.value}:
        get_adv_estimator_fn(name)


def _check_class(qualified: str):
    module, _, attribute = qualified.rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), attribute), type), qualified


def test_rotation_recipe_first_prompt_shows_the_real_qwen2_5_vl_every_tool_schema(tmp_path, monkeypatch):
    """The recipe's model, Qwen2.5-VL-3B, has a chat template that ignores ``tools``: the recipe's own loop options and
    tools, on the tiny model with that template (standing in for the real one), must still put each tool's schema in
    the first prompt."""
    import json

    from PIL import Image

    from verl_mm_tools.data.rotation import UNIFORM_PROMPT
    from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
    from verl_mm_tools.runtime.rollout import LocalRollout
    from verl_mm_tools.tiny import tiny_model_path

    monkeypatch.chdir(ROOT)
    config = compose_recipe("rotation_45", "vllm")
    entry = OmegaConf.to_container(OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)[0])
    options = {key: value for key, value in entry.items() if key not in ("name", "_target_")}
    rollout = LocalRollout(
        tiny_model_path(family="qwen2_5_vl"), config.actor_rollout_ref.rollout.multi_turn.tool_config_path, tmp_path
    )
    question = UNIFORM_PROMPT.removeprefix("<image>")
    output, _, worker = rollout.run(
        ["<answer>0</answer><|im_end|>"],
        [image_prompt(question, [Image.new("RGB", (56, 56))])],
        loop_options=options,
        max_turns=4,
    )
    prompt = worker.tokenizer.decode(unpadded_row(output)["prompt_ids"])
    schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in worker.tools]
    assert [schema["function"]["name"] for schema in schemas] == ["rotate", "flip"]
    for schema in schemas:
        assert f"\n{json.dumps(schema)}\n" in prompt
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")


def test_the_readme_command_composes_and_every_name_resolves(monkeypatch):
    """README_VLMRL.md's "Using it with verl" command is a real verl command line: its overrides compose through
    verl's hydra config, select the step hook, and every file, loop option, tool and reward it names resolves."""
    import re
    import shlex

    import verl

    monkeypatch.chdir(ROOT)
    readme = (ROOT / "README_VLMRL.md").read_text()
    block = readme.split("## Using it with verl", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    command = block[block.index("python -m verl.trainer.main_ppo") :].replace("\\\n", " ")
    overrides = [part for part in shlex.split(command)[3:] if not re.match(r"data\.(train|val)_files=", part)]
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    rollout = config.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "mm_tool" and step_hook_configured(config)
    _check_agent_loops(rollout)
    _check_tools(rollout.multi_turn.tool_config_path)
    _check_reward(config.reward)


FAMILY_FILES = sorted(path.stem for path in (RECIPES / "family").glob("*.yaml"))


def test_every_family_has_a_recipe_line():
    from verl_mm_tools.tiny import FAMILIES

    assert FAMILY_FILES == sorted(FAMILIES)


@pytest.mark.parametrize("family", FAMILY_FILES)
def test_a_family_composes_with_every_recipe_and_names_its_tool_parser(family, monkeypatch):
    """``run.sh <recipe> +family=F``: the family's model, tool parser and pixel bounds replace the recipe's, and
    each bound is one the family's processor applies (GLM-V's processor ignores min/max_pixels: it gets a size;
    Gemma 4's scales every image to a soft-token budget)."""
    from verl_mm_tools.tiny import FAMILIES

    monkeypatch.chdir(ROOT)
    for name in NAMES:
        with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
            config = compose(config_name=name, overrides=[f"+family={family}"])
        OmegaConf.to_container(config, resolve=True)
        assert config.actor_rollout_ref.rollout.multi_turn.format == FAMILIES[family].tool_parser
        assert config.actor_rollout_ref.model.path != "Qwen/Qwen2.5-VL-3B-Instruct" or family == "qwen2_5_vl"
        bounds = {key for key, value in config.data.mm_processor_kwargs.items() if value is not None}
        applied = {"glm4v": {"size"}, "glm4v_moe": {"size"}, "gemma4": {"max_soft_tokens"}}
        assert bounds == applied.get(family, {"min_pixels", "max_pixels"}), name
