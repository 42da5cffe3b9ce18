"""The ``remote:`` block and the tool YAML key, without Ray: parsing, errors, and what verl's loader builds."""

from __future__ import annotations

import pytest

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.remote.spec import RemoteSpec


def test_defaults_and_true():
    assert RemoteSpec.from_config(True, "tool x") == RemoteSpec()
    assert RemoteSpec().actor_options() == {"max_concurrency": 1, "max_restarts": 3}
    spec = RemoteSpec.from_config({"actors": 4, "num_cpus": 0.5, "num_gpus": 0.25, "max_concurrency": 2}, "tool x")
    assert spec.actor_options() == {"max_concurrency": 2, "max_restarts": 3, "num_gpus": 0.25, "num_cpus": 0.5}


@pytest.mark.parametrize(
    "config, message",
    [
        ({"actor": 2}, "tool x: unknown remote option 'actor'. Did you mean 'actors'?"),
        ({"actors": 0}, "tool x: remote actors must be an integer >= 1, got 0"),
        ({"actors": 1.5}, "tool x: remote actors must be an integer >= 1, got 1.5"),
        ({"num_gpus": -1}, "tool x: remote num_gpus must be a number >= 0 (a fraction shares a GPU), got -1"),
        ({"timeout_s": 0}, "tool x: remote timeout_s must be a number of seconds > 0 or null, got 0"),
        ({"max_concurrency": True}, "tool x: remote max_concurrency must be an integer >= 1, got True"),
        (
            "yes",
            "tool x: remote must be a mapping such as {actors: 2, max_concurrency: 1} (or true for one actor), "
            "got 'yes'",
        ),
    ],
)
def test_bad_options_name_the_owner_and_what_was_received(config, message):
    with pytest.raises(ConfigError) as caught:
        RemoteSpec.from_config(config, "tool x")
    assert str(caught.value).startswith(message)


def write_yaml(tmp_path, text: str):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return str(path)


MIXED_YAML = """tools:
  - class_name: verl_mm_tools.tools.FlipTool
    config: {type: native}
  - class_name: verl_mm_tools.tools.RotateTool
    config: {type: native, max_pixels: 200000}
    remote: {actors: 2, timeout_s: 5}
  - class_name: verl.tools.base_tool.BaseTool
    config: {type: native}
    remote: true
    tool_schema:
      type: function
      function: {name: plain, description: a plain verl tool, parameters: {type: object, properties: {}}}
"""


def test_verls_loader_builds_remote_tools_in_yaml_order_without_starting_ray(tmp_path):
    import ray
    from verl.tools.tool_registry import load_all_tools

    from verl_mm_tools.remote.tool import RemoteTool
    from verl_mm_tools.tools import FlipTool, RotateTool

    tools = load_all_tools(write_yaml(tmp_path, MIXED_YAML), None)
    assert [tool.name for tool in tools] == ["flip", "rotate", "plain"]
    assert type(tools[0]) is FlipTool
    assert [type(tool) for tool in tools[1:]] == [RemoteTool, RemoteTool]
    rotate, plain = tools[1], tools[2]
    assert rotate.tool_class is RotateTool and rotate.config == {"type": "native", "max_pixels": 200000}
    assert rotate.spec == RemoteSpec(actors=2, timeout_s=5)
    assert rotate.tool_schema == RotateTool().tool_schema  # from its schema_fn: the class is not built here
    assert plain.tool_schema.function.description == "a plain verl tool" and plain.spec == RemoteSpec()
    assert not ray.is_initialized()  # the dataset reads schemas through this loader: no actor may start


def test_a_remote_class_without_a_schema_needs_tool_schema(tmp_path):
    from verl.tools.tool_registry import load_all_tools

    yaml = "tools:\n  - class_name: verl.tools.base_tool.BaseTool\n    config: {type: native}\n    remote: true\n"
    with pytest.raises(
        ConfigError,
        match="runs remotely, so it is not built here to ask for its schema: give its tool_schema in the YAML entry",
    ):
        load_all_tools(write_yaml(tmp_path, yaml), None)


def test_an_unimportable_remote_class_is_a_config_error(tmp_path):
    from verl.tools.tool_registry import load_all_tools

    yaml = "tools:\n  - class_name: no_such_pkg.Tool\n    config: {type: native}\n    remote: true\n"
    with pytest.raises(ConfigError, match="tool no_such_pkg.Tool: cannot import the class"):
        load_all_tools(write_yaml(tmp_path, yaml), None)


def test_without_remote_keeps_the_tools_and_drops_only_remote():
    from omegaconf import OmegaConf

    from verl_mm_tools.remote.tool import without_remote
    from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

    assert without_remote(ROTATE_TOOLS_YAML) is ROTATE_TOOLS_YAML  # warm-start caches keyed on it stay valid
    local = OmegaConf.create(without_remote(MIXED_YAML))
    expected = OmegaConf.create(MIXED_YAML)
    for entry in expected.tools:
        entry.pop("remote", None)
    assert local == expected


def test_a_remote_environment_checks_its_arguments_here():
    from verl_mm_tools.envs import make_environment
    from verl_mm_tools.remote.env import RemoteEnvironment

    environment = make_environment({"name": "answer_feedback", "remote": {"actors": 2}})
    assert isinstance(environment, RemoteEnvironment) and environment.spec == RemoteSpec(actors=2)
    with pytest.raises(ConfigError, match="environment 'answer_feedback' does not accept \\['colour'\\]"):
        make_environment({"name": "answer_feedback", "colour": 1, "remote": True})
    with pytest.raises(ConfigError, match="environment 'answer_feedback': unknown remote option 'actor'"):
        make_environment({"name": "answer_feedback", "remote": {"actor": 1}})
