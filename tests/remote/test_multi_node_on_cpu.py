"""``remote:`` pools on a two-node Ray cluster started on this machine (``runtime.cluster``): the driver (verl's
AgentLoopWorker, in this process) attaches to node_a, the pools are placed on node_b through its custom resource.
Images cross nodes through Ray's object store and come back pixel for pixel (dataset images given as paths too, with
an environment's pool on node_a beside the tool's on node_b); a user's tool module reaches node_b
through ``runtime_env`` (and its absence is an error naming the node and the module); a killed actor on node_b masks
only its trajectory; a lost node_b fails the pool's calls with a message naming it, and no process is left behind."""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest
from PIL import Image

from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text

pytestmark = pytest.mark.integration  # Ray nodes

# The tests that start actors on the cluster are marked slow, so they run on the serial line, never beside a trainer
# run: beside one (and a second 2-node cluster, the separate_async demo's), their actors missed their start-up time.

ANSWER = "<answer>90</answer><|im_end|>"
# Two user packages only this driver's sys.path holds (a module on the head's PYTHONPATH only); the job's runtime_env
# ships the first (py_modules), not the second.
SHIPPED, NOT_SHIPPED = "mmn_shipped_tools", "mmn_head_only_tools"
USER_TOOL = """
import os
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class WhereTool(BaseTool):
    def __init__(self, config=None, tool_schema=None):
        self.config, self.tool_schema = dict(config or {}), tool_schema

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=__file__ + "|" + os.getcwd()), 0.0, {}
"""


def write_user_package(root, name: str) -> str:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(USER_TOOL)
    return str(package)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray

    from verl_mm_tools.runtime.cluster import local_cluster

    packages = tmp_path_factory.mktemp("user_code")
    shipped = write_user_package(packages, SHIPPED)
    write_user_package(packages, NOT_SHIPPED)
    sys.path.insert(0, str(packages))
    with local_cluster(nodes=2, num_cpus=4, num_gpus=1, root=tmp_path_factory.mktemp("nodes")) as running:
        # local paths in py_modules / working_dir are uploaded only from the job's runtime_env (Ray refuses them in
        # an actor's options): verl's ray_kwargs.ray_init.runtime_env
        ray.init(address=running.address, log_to_driver=False, runtime_env={"py_modules": [shipped]})
        try:
            yield running
        finally:
            ray.shutdown()
            sys.path.remove(str(packages))
            for name in (SHIPPED, NOT_SHIPPED):
                sys.modules.pop(name, None)
    assert running.processes() == []  # local_cluster raised already if one survived SIGKILL


@pytest.fixture(scope="module")
def node_ids(cluster) -> dict[str, str]:
    import ray

    ids = {}
    for node in ray.nodes():
        for name in ("node_a", "node_b"):
            if name in node["Resources"]:
                ids[name] = node["NodeID"]
    return ids


@pytest.fixture
def rollout(tiny_model_dir, tmp_path):
    return LocalRollout(tiny_model_dir, None, tmp_path)


def load_tools(tmp_path, entries: str) -> list:
    from verl.tools.tool_registry import load_all_tools

    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n" + entries)
    return load_all_tools(str(path), None)


def on_event_loop(coroutine):
    from verl.utils.ray_utils import get_event_loop

    return get_event_loop().run_until_complete(coroutine)


def pictures(count: int) -> list[list[dict]]:
    images = [Image.new("RGB", (56 + 28 * (i % 3), 56), (40 * i % 256, 90, 200)) for i in range(count)]
    for index, image in enumerate(images):
        image.putpixel((index, 3), (255, 0, 0))  # asymmetric: a rotation shows in the pixels
    return [image_prompt("By how many degrees is it rotated?", [image]) for image in images]


def images_by_prompt(server) -> dict:
    """Each request's images (size and pixels) by its prompt: trajectories run side by side, so requests arrive in
    any order."""
    return {
        tuple(request["prompt_ids"]): [(image.size, image.tobytes()) for image in request["images"]]
        for request in server.requests
    }


@pytest.mark.slow
def test_a_pool_on_node_b_gives_the_same_tokens_and_images_as_in_process(cluster, node_ids, rollout, tmp_path):
    from verl_mm_tools.remote.nodes import this_node_id

    assert this_node_id() == node_ids["node_a"]  # the driver (the agent-loop worker here) runs on the head
    rotate = "  - class_name: verl_mm_tools.tools.RotateTool\n    config: {type: native}\n"
    turns = [tool_call_text("rotate", degrees=90), tool_call_text("rotate", degrees=-45, image_id=1), ANSWER]
    prompts = pictures(3)
    local, local_server, _ = rollout.run(turns, prompts, tools=load_tools(tmp_path, rotate))
    remote_tools = load_tools(tmp_path, rotate + "    remote: {actors: 1, resources: {node_b: 1}}\n")
    remote, remote_server, _ = rollout.run(turns, prompts, tools=remote_tools)

    pool = remote_tools[0].pool
    assert [slot.node_id for slot in pool.slots] == [node_ids["node_b"]]
    assert list(remote.non_tensor_batch["mm_tool/error"]) == [""] * 3
    for index in range(3):
        assert unpadded_row(remote, index) == unpadded_row(local, index)  # tokens, image ids in the tool texts

    assert sorted(len(request["images"]) for request in remote_server.requests) == [1] * 3 + [2] * 3 + [3] * 3
    assert images_by_prompt(remote_server) == images_by_prompt(local_server)  # pixels back from node_b intact
    assert pool.sessions == {}


@pytest.mark.slow
def test_a_tool_pool_on_node_b_and_an_environment_pool_on_node_a_take_dataset_images_given_as_paths(
    cluster, node_ids, rollout, tmp_path
):
    """The dataset's pictures given as file paths under ``file_roots``, the rotate tool's pool on node_b (the
    rollout's node in a 2-node run) and the environment's on node_a: the loop reads the files where it runs, the
    pixels reach node_b through Ray, and the trajectory is token for token the in-process one."""
    from verl_mm_tools.envs import ENVIRONMENTS
    from verl_mm_tools.remote.pool import pool_for
    from verl_mm_tools.remote.spec import RemoteSpec

    folder = tmp_path / "pictures"
    folder.mkdir()
    paths = []
    for index, prompt in enumerate(pictures(2)):
        paths.append(str(folder / f"{index}.png"))
        prompt[0]["content"][0]["image"].save(paths[-1])
    prompts = [image_prompt("By how many degrees is it rotated?", [path]) for path in paths]
    env = {"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 3}
    columns = {
        "data_source": ["verl_mm_tools/rotation"] * 2,
        "reward_model": [{"style": "rule", "ground_truth": "90"}] * 2,
    }
    rotate = "  - class_name: verl_mm_tools.tools.RotateTool\n    config: {type: native}\n"
    turns = [tool_call_text("rotate", degrees=90), "<answer>45</answer><|im_end|>", ANSWER]
    files = {"loop_options": {"file_roots": [str(folder)]}}

    def run(tools_yaml: str, environment: dict):
        tools = load_tools(tmp_path, tools_yaml)
        extra_info = {"extra_info": [{"env": environment}] * 2}
        output, server, _ = rollout.run(turns, prompts, tools=tools, columns={**columns, **extra_info}, **files)
        return output, server, tools

    local, local_server, _ = run(rotate, env)
    on_node_a = {**env, "remote": {"actors": 1, "resources": {"node_a": 1}}}
    remote, remote_server, tools = run(rotate + "    remote: {actors: 1, resources: {node_b: 1}}\n", on_node_a)

    assert list(remote.non_tensor_batch["mm_tool/error"]) == ["", ""]
    for index in range(2):
        assert unpadded_row(remote, index) == unpadded_row(local, index)
    assert list(remote.non_tensor_batch["mm_tool/turn_rewards"]) == [[0.0, 0.0, 1.0]] * 2

    assert images_by_prompt(remote_server) == images_by_prompt(local_server)  # the files' pixels, node_b's rotations
    assert [slot.node_id for slot in tools[0].pool.slots] == [node_ids["node_b"]]
    environments = pool_for(
        "environment", "answer_feedback", ENVIRONMENTS["answer_feedback"], {}, RemoteSpec(resources={"node_a": 1})
    )
    assert [slot.node_id for slot in environments.slots] == [node_ids["node_a"]]


def user_pool(package: str):
    import importlib

    from verl_mm_tools.remote.host import TOOL
    from verl_mm_tools.remote.pool import pool_for
    from verl_mm_tools.remote.spec import RemoteSpec

    tool_class = importlib.import_module(package).WhereTool
    spec = RemoteSpec(resources={"node_b": 1}, startup_timeout_s=60)
    return pool_for(TOOL, "where", tool_class, {"config": {"package": package}}, spec)


@pytest.mark.slow
def test_a_user_module_reaches_node_b_through_runtime_env_and_its_absence_names_node_and_module(cluster, node_ids):
    from verl_mm_tools.errors import RemoteError
    from verl_mm_tools.files import FileRoots
    from verl_mm_tools.remote.host import class_reference

    missing = user_pool(NOT_SHIPPED)
    assert class_reference(missing.target) == f"{NOT_SHIPPED}:WhereTool"
    with pytest.raises(RemoteError) as error:
        on_event_loop(missing.start())
    message = str(error.value)
    assert f"class {NOT_SHIPPED}.WhereTool cannot be imported on Ray node {node_ids['node_b'][:8]} (" in message
    assert "resources node_b" in message and f"No module named '{NOT_SHIPPED}'" in message
    assert "ship it with the job's Ray runtime_env (py_modules or working_dir" in message

    shipped = user_pool(SHIPPED)
    on_event_loop(shipped.start())
    slot = shipped.open("session")
    on_event_loop(shipped.call(slot, "create", "session", {}))
    response, _, _ = on_event_loop(shipped.call(slot, "execute", "session", {}, 0, [], FileRoots()))
    on_event_loop(shipped.call(slot, "release", "session", {}))
    shipped.close("session")
    # imported from node_b's own copy, unpacked under its temp dir, not from the driver's directory; the actor runs
    # in node_b's working directory (a relative path in a config resolves there, not in the driver's)
    module_file, cwd = response.text.split("|")
    assert module_file.startswith(str(cluster.node("node_b").temp_dir) + "/")
    assert module_file.endswith(f"/{SHIPPED}/__init__.py")
    assert cwd == str(cluster.node("node_b").work_dir)
    assert slot.node_id == node_ids["node_b"]


def kill_once_executing(ray, victim, pool) -> None:
    """Kill the actor once both trajectories' executes were sent (2 creates + 2 executes)."""
    deadline = time.monotonic() + 60
    while pool.counts["calls"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # inside the 2 s execute
    ray.kill(victim, no_restart=False)


@pytest.fixture(scope="module")
def blocking_tools(cluster, tmp_path_factory) -> list:
    """Two actors on node_b of a tool blocking 10 s (the lost-node test kills node_b during a call: 2 s ended before
    the kill on a loaded machine): the killed-actor test, then the lost-node test (its second actor, still running:
    one actor start less)."""
    entry = (
        "  - class_name: verl_mm_tools.remote.probe.BlockingTool\n"
        "    config: {type: native, seconds: 10.0, tag: multi_node_kill}\n"
        "    remote: {actors: 2, max_concurrency: 2, resources: {node_b: 1}, startup_timeout_s: 60}\n"
    )
    return load_tools(tmp_path_factory.mktemp("blocking"), entry)


@pytest.mark.slow
def test_a_killed_actor_on_node_b_masks_only_its_trajectory(cluster, node_ids, rollout, blocking_tools):
    import ray

    tools = blocking_tools
    pool = tools[0].pool
    on_event_loop(pool.start())
    victim = ray.get_actor(pool.slots[0].name)
    killer = threading.Thread(target=kill_once_executing, args=(ray, victim, pool))
    killer.start()
    output, _, _ = rollout.run([tool_call_text("wait"), ANSWER], pictures(2), tools=tools)
    killer.join()

    errors = list(output.non_tensor_batch["mm_tool/error"])
    masked = [index for index, error in enumerate(errors) if error]
    assert len(masked) == 1, errors
    lost = f"tool 'wait': actor {pool.slots[0].name} was lost during execute on node {node_ids['node_b'][:8]} ("
    assert lost in errors[masked[0]]
    assert output.non_tensor_batch["mm_tool/stop_reason"][1 - masked[0]] == "answered"
    assert pool.counts["lost"] == 1 and pool.sessions == {}


@pytest.mark.slow
def test_losing_node_b_fails_its_pools_calls_naming_the_node_and_never_hangs(cluster, node_ids, blocking_tools):
    """The raylet of node_b is SIGKILLed during a call: the call fails naming node_b; an actor asking for node_b
    cannot start any more (no live node offers it) and says so after startup_timeout_s. The last test: node_b is
    gone."""
    from verl_mm_tools.errors import RemoteError
    from verl_mm_tools.files import FileRoots
    from verl_mm_tools.remote.host import TOOL
    from verl_mm_tools.remote.pool import pool_for
    from verl_mm_tools.remote.probe import BlockingTool
    from verl_mm_tools.remote.spec import RemoteSpec

    pool = blocking_tools[0].pool
    slot = pool.slots[1]  # the actor the previous test did not kill
    on_event_loop(pool.call(slot, "create", "a", {}))
    sent = pool.counts["calls"]
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["value"] = on_event_loop(pool.call(slot, "execute", "a", {}, 0, [], FileRoots()))
        except RemoteError as error:
            outcome["error"] = str(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 30
    while pool.counts["calls"] == sent and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # inside the 10 s execute
    assert cluster.node("node_b").node_id() == node_ids["node_b"]
    cluster.kill_raylet("node_b")
    assert cluster.node("node_b").node_id() is None
    caller.join(timeout=120)
    assert not caller.is_alive(), "the call on the lost node hung"
    assert "value" not in outcome
    assert re.search(
        rf"tool 'wait': actor {re.escape(slot.name)} was lost during execute on node {node_ids['node_b'][:8]} "
        r"\([^)]*resources node_b\), a node Ray reports dead \((ActorDiedError|ActorUnavailableError): ",
        outcome["error"],
    ), outcome["error"]
    quick = RemoteSpec(resources={"node_b": 1}, startup_timeout_s=3)
    late = pool_for(TOOL, "wait", BlockingTool, {"config": {"tag": "after"}}, quick)
    with pytest.raises(RemoteError) as unplaced:
        on_event_loop(late.start())
    assert f"actor {late.slots[0].name} did not start within 3 s" in str(unplaced.value)
    assert "No live Ray node offers 'node_b' (was its node lost?)" in str(unplaced.value)


@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({"node_b": -1}, "remote resources must be a mapping of Ray resource names to numbers >= 0"),
        ([1], "remote resources must be a mapping"),
        ({"GPU": 1}, "remote resources must be free of CPU and GPU (use num_cpus / num_gpus), got {'GPU': 1}"),
    ],
)
def test_resources_are_checked_where_the_yaml_is_read(resources, error):
    from verl_mm_tools.errors import ConfigError
    from verl_mm_tools.remote.spec import RemoteSpec

    with pytest.raises(ConfigError) as raised:
        RemoteSpec.from_config({"resources": resources}, "tool my_pkg.Ocr")
    assert str(raised.value).startswith("tool my_pkg.Ocr: ") and error in str(raised.value)
    spec = RemoteSpec.from_config({"actors": 2, "resources": {"node_b": 0.5}}, "tool my_pkg.Ocr")
    assert spec.actor_options() == {"max_concurrency": 1, "max_restarts": 3, "resources": {"node_b": 0.5}}
    assert hash(spec) == hash(RemoteSpec(actors=2)) and spec != RemoteSpec(actors=2)


def test_a_cluster_that_cannot_start_says_why_and_leaves_nothing(tmp_path):
    from verl_mm_tools.runtime.cluster import ClusterError, local_cluster

    with pytest.raises(ClusterError) as too_many, local_cluster(nodes=5):
        pass
    assert str(too_many.value) == "nodes must be between 1 and 4, got 5"
    with pytest.raises(ClusterError) as refused, local_cluster(nodes=1, num_cpus=-1, root=tmp_path):
        pass
    message = str(refused.value)
    assert message.startswith("node_a: `") and "ray start" in message and "--num-cpus=-1" in message
    assert "failed (exit 1):" in message
    assert not any(tmp_path.glob("*/work/*"))


def test_the_heads_ports_are_free_and_never_ones_the_kernel_hands_to_outgoing_connections(monkeypatch):
    from verl_mm_tools.runtime import cluster

    ephemeral = cluster._ephemeral_ports()
    ports = [cluster._free_port() for _ in range(200)]
    assert all(port in cluster.LISTEN_PORTS and port not in ephemeral and port >= 20000 for port in ports)
    assert len(set(ports)) > 150  # drawn at random, not one fixed port shared by two runs on one machine
    monkeypatch.setattr(cluster, "LISTEN_PORTS", range(32768, 32770))  # ephemeral on Linux: none to give
    with pytest.raises(cluster.ClusterError) as none_free:
        cluster._free_port()
    expected = f"no free port in range(32768, 32770) outside the kernel's ephemeral ports {ephemeral} (0 tried)"
    assert str(none_free.value).startswith(expected)
