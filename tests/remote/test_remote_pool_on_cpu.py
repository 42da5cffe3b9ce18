"""Tools and environments on Ray actor pools, through verl's real AgentLoopWorker and a local Ray cluster: the same
tokens and images as in-process, session affinity, no leaked sessions, timeouts answered as text, a killed actor
masking only its trajectory, and blocking calls running side by side."""

from __future__ import annotations

import re
import threading
import time

import pytest
from PIL import Image

from verl_mm_tools.runtime.batch import image_prompt, unpadded_row
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.runtime.scripted_client import tool_call_text
from verl_mm_tools.testkit.rows import marked_image

ANSWER = "<answer>90</answer><|im_end|>"


@pytest.fixture(scope="module")
def ray_cluster(start_ray):
    import ray

    start_ray(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=False)  # a logical GPU: placement only
    yield ray
    ray.shutdown()


@pytest.fixture
def rollout(tiny_model_dir, tmp_path):
    return LocalRollout(tiny_model_dir, None, tmp_path)


def load_tools(tmp_path, entries: str) -> list:
    from verl.tools.tool_registry import load_all_tools

    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n" + entries)
    return load_all_tools(str(path), None)


def rotate_entry(remote: str = "") -> str:
    entry = "  - class_name: verl_mm_tools.tools.RotateTool\n    config: {type: native}\n"
    return entry + (f"    remote: {remote}\n" if remote else "")


def wait_entry(remote: str, seconds: float, tag: str) -> str:
    """The blocking tool; ``tag`` gives each test its own pool (the config is part of the pool's identity)."""
    entry = (
        f"  - class_name: verl_mm_tools.remote.probe.BlockingTool\n"
        f"    config: {{type: native, seconds: {seconds}, tag: {tag}}}\n"
    )
    return entry + (f"    remote: {remote}\n" if remote else "")


# One pool of two blocking actors for the affinity and the side-by-side tests (each actor is a process importing
# verl: seconds of CPU); the side-by-side test counts the sessions its own run assigned.
TWO_WAITERS = wait_entry("{actors: 2}", 0.3, "two_actors")


def pictures(count: int) -> list[list[dict]]:
    images = [Image.new("RGB", (56 + 28 * (i % 3), 56), (40 * i % 256, 90, 200)) for i in range(count)]
    return [image_prompt("By how many degrees is it rotated?", [image]) for image in images]


def tool_texts(output, worker, index: int) -> list[str]:
    row = unpadded_row(output, index)
    text = worker.tokenizer.decode(row["response_ids"])
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, flags=re.S)


def on_event_loop(coroutine):
    from verl.utils.ray_utils import get_event_loop

    return get_event_loop().run_until_complete(coroutine)


def start(tools) -> None:
    """Start every actor of the tools' pools before the timed part of a test."""
    for tool in tools:
        on_event_loop(tool.pool.start())


def open_sessions(pool) -> list[int]:
    import ray

    return [ray.get(ray.get_actor(slot.name).open_sessions.remote()) for slot in pool.slots]


def test_the_python_tool_on_an_actor_keeps_one_kernel_per_trajectory_and_answers_as_in_process(
    ray_cluster, rollout, tmp_path
):
    """The sandboxed python tool with ``remote:``: its kernels run in the actor's sandbox; the trajectory's second
    call reads what its first defined (one kernel per trajectory, on its actor), and the model gets the tokens and
    images it gets in-process."""
    entry = "  - class_name: verl_mm_tools.tools.PythonTool\n    config: {type: native}\n"
    first = "crop = images[1].crop((0, 0, 28, 28))\ncrop.save('corner.png')"
    turns = [tool_call_text("python", code=first), tool_call_text("python", code="print(crop.getpixel((3, 3)))")]
    prompts = [image_prompt("What color is the top-left corner?", [marked_image()])]
    local, local_server, _ = rollout.run([*turns, ANSWER], prompts, tools=load_tools(tmp_path, entry))
    remote_tools = load_tools(tmp_path, entry + "    remote: {actors: 1}\n")
    remote, remote_server, worker = rollout.run([*turns, ANSWER], prompts, tools=remote_tools)

    assert list(remote.non_tensor_batch["mm_tool/error"]) == [""]
    assert remote.non_tensor_batch["mm_tool/per_tool"][0]["python"]["remote_calls"] == 2
    assert unpadded_row(remote, 0) == unpadded_row(local, 0)
    assert tool_texts(remote, worker, 0)[1].endswith("Output:\n(255, 0, 0)")
    corner = [[image.tobytes() for image in request["images"]] for request in remote_server.requests]
    assert corner == [[image.tobytes() for image in request["images"]] for request in local_server.requests]
    assert [len(images) for images in corner] == [1, 2, 2]
    assert open_sessions(remote_tools[0].pool) == [0]  # released with the trajectory


def test_a_remote_tool_gives_the_same_tokens_and_images_as_in_process(ray_cluster, rollout, tmp_path):
    turns = [tool_call_text("rotate", degrees=90), tool_call_text("rotate", degrees=-45, image_id=1), ANSWER]
    prompts = pictures(3)
    local, local_server, _ = rollout.run(turns, prompts, tools=load_tools(tmp_path, rotate_entry()))
    remote_tools = load_tools(tmp_path, rotate_entry("{actors: 2}"))
    remote, remote_server, _ = rollout.run(turns, prompts, tools=remote_tools)

    assert list(remote.non_tensor_batch["mm_tool/error"]) == [""] * 3
    for index in range(3):
        assert unpadded_row(remote, index) == unpadded_row(local, index)

    def images_by_prompt(server) -> dict:
        return {
            tuple(request["prompt_ids"]): [image.tobytes() for image in request["images"]]
            for request in server.requests
        }

    assert sorted(len(request["images"]) for request in remote_server.requests) == [1] * 3 + [2] * 3 + [3] * 3
    assert images_by_prompt(remote_server) == images_by_prompt(local_server)
    assert (remote.batch["input_ids"] == local.batch["input_ids"]).all()
    pool = remote_tools[0].pool
    assert pool.sessions == {} and open_sessions(pool) == [0, 0]
    assert sorted(slot.assigned for slot in pool.slots) == [1, 2]  # 3 trajectories over 2 actors


def test_a_session_stays_on_its_actor_and_sees_the_trajectorys_images(ray_cluster, rollout, tmp_path):
    tools = load_tools(tmp_path, rotate_entry("{actors: 2}") + TWO_WAITERS)
    turns = [
        tool_call_text("wait", note="a"),
        tool_call_text("rotate", degrees=90),
        tool_call_text("wait", note="b"),
        ANSWER,
    ]
    output, _, worker = rollout.run(turns, pictures(4), tools=tools, max_turns=4)

    pids = set()
    for index in range(4):
        first, rotated, second = tool_texts(output, worker, index)
        assert "<|vision_end|>Image 2: Image 1 rotated by 90 degrees counter-clockwise" in rotated
        pid = re.search(r"in pid (\d+)", first).group(1)
        assert re.search(r"in pid (\d+)", second).group(1) == pid  # affinity: both calls on one actor
        assert "; 1 images;" in first and "; 2 images;" in second  # the rotated image crossed before the 2nd call
        pids.add(pid)
    assert len(pids) == 2  # four trajectories spread over both actors
    for tool in tools:
        assert tool.pool.sessions == {} and tool.sent_images == {} and open_sessions(tool.pool) == [0, 0]


def test_a_call_past_timeout_s_is_answered_as_text_and_the_trajectory_goes_on(ray_cluster, rollout, tmp_path):
    tools = load_tools(tmp_path, wait_entry("{actors: 1, timeout_s: 0.5}", 1.0, "timeout"))
    start(tools)
    output, _, worker = rollout.run([tool_call_text("wait"), ANSWER], pictures(1), tools=tools)

    pool = tools[0].pool
    (text,) = tool_texts(output, worker, 0)
    assert text == (
        f"Error: tool 'wait': execute on actor {pool.slots[0].name} took longer than 0.5 s and was cancelled"
    )
    assert output.non_tensor_batch["mm_tool/stop_reason"][0] == "answered"
    assert output.non_tensor_batch["mm_tool/error"][0] == ""
    assert output.non_tensor_batch["mm_tool/tool_errors"][0] == 1
    assert pool.counts["timeouts"] >= 1 and pool.sessions == {}
    deadline = time.monotonic() + 10  # the release waits behind the blocked call (1 s) on the actor, then runs
    while open_sessions(pool) != [0] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert open_sessions(pool) == [0]


def kill_once_executing(ray, victim, pool) -> None:
    """Kill the actor once both trajectories' executes were sent (2 creates + 2 executes), not after a fixed delay:
    on a loaded machine the rollout may still be creating sessions a second in."""
    deadline = time.monotonic() + 60
    while pool.counts["calls"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # inside the 2 s execute
    ray.kill(victim, no_restart=False)


def test_a_killed_actor_masks_only_its_trajectory_and_is_restarted(ray_cluster, rollout, tmp_path):
    tools = load_tools(tmp_path, wait_entry("{actors: 2, max_concurrency: 2}", 2.0, "kill"))
    start(tools)
    pool = tools[0].pool
    victim = ray_cluster.get_actor(pool.slots[0].name)
    killer = threading.Thread(target=kill_once_executing, args=(ray_cluster, victim, pool))
    killer.start()
    output, _, worker = rollout.run([tool_call_text("wait"), ANSWER], pictures(2), tools=tools)
    killer.join()

    errors = list(output.non_tensor_batch["mm_tool/error"])
    masked = [index for index, error in enumerate(errors) if error]
    assert len(masked) == 1, errors
    assert f"tool 'wait': actor {pool.slots[0].name} was lost during execute" in errors[masked[0]]
    assert output.non_tensor_batch["mm_tool/stop_reason"][1 - masked[0]] == "answered"
    assert pool.counts["lost"] == 1 and pool.sessions == {}

    again, _, _ = rollout.run([tool_call_text("wait"), ANSWER], pictures(2), tools=tools)
    assert list(again.non_tensor_batch["mm_tool/error"]) == ["", ""]
    assert pool.counts["restarted"] == 1
    assert open_sessions(pool) == [0, 0]


def overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(begin, 1) for begin, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def call_intervals(output, worker, count: int) -> list[tuple[float, float]]:
    spans = []
    for index in range(count):
        for text in tool_texts(output, worker, index):
            begin, end = re.search(r"from ([\d.]+) to ([\d.]+)", text).groups()
            spans.append((float(begin), float(end)))
    return spans


def test_blocking_calls_run_side_by_side_on_actors_and_one_at_a_time_in_process(ray_cluster, rollout, tmp_path):
    """4 trajectories x 2 calls of a tool that blocks 0.3 s: in the worker's process the calls run one at a time
    (the event loop is blocked: every other trajectory waits); on 2 actors 2 run at once while the worker goes on.
    (The affinity test's 2 actors, TWO_WAITERS, not 4 of its own: 2 at once is already side by side.)"""
    turns = [tool_call_text("wait"), tool_call_text("wait"), ANSWER]
    local, _, worker = rollout.run(turns, pictures(4), tools=load_tools(tmp_path, wait_entry("", 0.3, "local")))
    tools = load_tools(tmp_path, TWO_WAITERS)
    start(tools)
    assigned_before = [slot.assigned for slot in tools[0].pool.slots]
    remote, _, _ = rollout.run(turns, pictures(4), tools=tools)

    assert overlap(call_intervals(local, worker, 4)) == 1
    spans = call_intervals(remote, worker, 4)
    assert len(spans) == 8 and overlap(spans) == 2
    assert sorted(slot.assigned - before for slot, before in zip(tools[0].pool.slots, assigned_before)) == [2, 2]


def test_a_remote_environment_answers_as_the_local_one(ray_cluster, rollout, tmp_path):
    env = {"name": "answer_feedback", "reward_fn": "rotation_reward_45", "max_attempts": 3}
    columns = {
        "data_source": ["verl_mm_tools/rotation"] * 2,
        "reward_model": [{"style": "rule", "ground_truth": "90"}] * 2,
    }
    turns = ["<answer>45</answer><|im_end|>", ANSWER]
    local, _, _ = rollout.run(turns, pictures(2), columns={**columns, "extra_info": [{"env": env}] * 2})
    remote_env = {**env, "remote": {"actors": 2}}
    remote, _, _ = rollout.run(turns, pictures(2), columns={**columns, "extra_info": [{"env": remote_env}] * 2})

    assert list(remote.non_tensor_batch["mm_tool/error"]) == ["", ""]
    for index in range(2):
        assert unpadded_row(remote, index) == unpadded_row(local, index)
    assert list(remote.non_tensor_batch["mm_tool/turn_rewards"]) == [[0.0, 1.0], [0.0, 1.0]]
    assert list(remote.non_tensor_batch["attempts"]) == [2, 2]
    from verl_mm_tools.envs import ENVIRONMENTS
    from verl_mm_tools.remote.pool import pool_for
    from verl_mm_tools.remote.spec import RemoteSpec

    pool = pool_for("environment", "answer_feedback", ENVIRONMENTS["answer_feedback"], {}, RemoteSpec(actors=2))
    assert pool.sessions == {} and open_sessions(pool) == [0, 0]
    assert sorted(slot.assigned for slot in pool.slots) == [1, 1]


def test_fractional_gpus_share_a_gpu_and_an_actor_ray_cannot_place_says_why(ray_cluster, rollout, tmp_path):
    """Resource requests reach Ray: two actors asking half a GPU each share GPU 0 (CUDA_VISIBLE_DEVICES set by Ray);
    one asking a whole GPU more than is free is not left pending: its trajectory is masked with what it asked."""
    shared = load_tools(tmp_path, wait_entry("{actors: 2, num_gpus: 0.5, num_cpus: 0.5}", 0.01, "gpu"))
    infos = on_event_loop(shared[0].pool.ping_all())
    assert [(info["gpu_ids"], info["cuda_visible_devices"]) for info in infos] == [(["0"], "0"), (["0"], "0")]
    assert ray_cluster.available_resources().get("GPU", 0) == 0

    unplaceable = load_tools(tmp_path, wait_entry("{num_gpus: 1, startup_timeout_s: 3}", 0.01, "no_gpu_left"))
    output, _, _ = rollout.run([tool_call_text("wait"), ANSWER], pictures(1), tools=unplaceable)
    error = output.non_tensor_batch["mm_tool/error"][0]
    assert (
        f"tool 'wait': actor {unplaceable[0].pool.slots[0].name} did not start within 3 s; it asks Ray for "
        "{'max_concurrency': 1, 'max_restarts': 3, 'num_gpus': 1} and Ray has" in error
    )
    assert "Lower num_cpus / num_gpus, give Ray more resources, or raise startup_timeout_s" in error
    for actor in shared[0].pool.slots:
        ray_cluster.kill(ray_cluster.get_actor(actor.name))  # the logical GPU back for the tests after this one


def test_a_remote_gui_environment_acts_as_the_local_one(ray_cluster, tiny_model_dir, tmp_path):
    """miniwob on an actor: its browser runs there, the GUI tools' actions go there, its screenshots come back; the
    trajectory's tokens equal the local run's."""
    import asyncio
    from pathlib import Path

    from verl_mm_tools.envs import Sample
    from verl_mm_tools.envs.gui.miniwob_env import MiniWoBEnv
    from verl_mm_tools.runtime.miniwob_oracle import oracle_action

    async def button_point() -> tuple[int, int]:  # click-test, seed 0: the button, in the shown 168x224 pixels
        env = MiniWoBEnv("click-test")
        await env.reset(Sample(data_source=None, ground_truth=None, extra_info={"seed": 0}))
        _, point = oracle_action("click-test", env.observation)
        await env.close()
        return int(point["x"] * 168 / 160), int(point["y"] * 224 / 210)

    x, y = asyncio.run(button_point())
    gui_tools = Path(__file__).parents[2] / "examples" / "tools" / "gui_tools.yaml"
    rollout = LocalRollout(tiny_model_dir, gui_tools, tmp_path)
    turns = [tool_call_text("click", x=x, y=y), "Done.<|im_end|>"]
    reward = ["reward.reward_manager.name=mm_turn_discount", "+reward.reward_kwargs.gamma=1.0"]
    outputs = []
    for env in ({"name": "miniwob", "task": "click-test"}, {"name": "miniwob", "task": "click-test", "remote": {}}):
        columns = {
            "data_source": ["miniwob/click-test"],
            "reward_model": [{"style": "rule", "ground_truth": ""}],
            "extra_info": [{"seed": 0, "env": env, "reward_fn": "environment_reward"}],
        }
        prompt = [[{"role": "user", "content": [{"type": "text", "text": "Do the task."}]}]]
        output, _, _ = rollout.run(turns, prompt, columns=columns, score=True, extra=reward)
        outputs.append(output)
    local, remote = outputs
    assert list(remote.non_tensor_batch["mm_tool/stop_reason"]) == ["episode_done"]
    assert unpadded_row(remote) == unpadded_row(local)
    assert remote.batch["rm_scores"].sum().item() == local.batch["rm_scores"].sum().item() == 1.0
