"""``bench --remote``, figure 7: tools on Ray actor pools (``verl_mm_tools.remote``), on a local Ray cluster.

a. Scaling: a tool that blocks its thread 0.5 s (``remote.probe.BlockingTool``), ``trajectories`` x 2 calls through
   verl's real AgentLoopWorker (scripted server): wall seconds in the worker's process (the baseline: a blocking tool
   stops the worker's event loop, so calls run one at a time) and on 1, 2 and 4 actors; the speed-up of 2 and 4
   actors over 1. Wall time, not CPU time: the tool sleeps.
b. Images crossing: one rotate call on a new image of 448 and 1024 px (square RGB) through a remote session (the image
   goes to the actor, the rotated one comes back) against the same call in process, in interleaved pairs: the
   milliseconds of each and the bytes each image weighs on the way (PIL pickles its raw pixels). Plus the round
   trip of a call that carries no image.
c. (``bench.multi_node``) the same image crossing Ray nodes against within a node, on two nodes started here.
"""

from __future__ import annotations

import pickle
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from PIL import Image

from verl_mm_tools.bench.verl_loop import on_event_loop, timed
from verl_mm_tools.handoff import SampleFields

if TYPE_CHECKING:
    from verl_mm_tools.bench.figures import Figure
    from verl_mm_tools.remote.tool import RemoteTool

ACTORS = (1, 2, 4)
BLOCK_S = 0.5


@contextmanager
def local_ray() -> Iterator[None]:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def remote_figures(model_dir: str, quick: bool = False) -> list[Figure]:
    from verl_mm_tools.bench.multi_node import cross_node_figures

    with local_ray():
        figures = scaling(model_dir, trajectories=16 if quick else 32) + image_crossing(repeats=5 if quick else 15)
    return figures + cross_node_figures(repeats=5 if quick else 15)  # c: its own 2-node cluster (bench.multi_node)


def scaling(model_dir: str, trajectories: int) -> list[Figure]:
    from verl.tools.tool_registry import load_all_tools

    from verl_mm_tools.bench.figures import figure
    from verl_mm_tools.runtime.batch import image_prompt
    from verl_mm_tools.runtime.rollout import LocalRollout
    from verl_mm_tools.runtime.scripted_client import tool_call_text

    turns = [tool_call_text("wait"), tool_call_text("wait"), "<answer>0</answer><|im_end|>"]
    prompts = [image_prompt("Wait twice.", [Image.new("RGB", (56, 56), (i, 0, 0))]) for i in range(trajectories)]
    seconds = {}
    with tempfile.TemporaryDirectory() as workdir:
        rollout = LocalRollout(model_dir, None, workdir)
        for actors in (0, *ACTORS):
            yaml = Path(workdir) / f"tools_{actors}.yaml"
            remote = f"    remote: {{actors: {actors}}}\n" if actors else ""
            yaml.write_text(
                "tools:\n  - class_name: verl_mm_tools.remote.probe.BlockingTool\n"
                f"    config: {{type: native, seconds: {BLOCK_S}}}\n" + remote
            )
            tools = load_all_tools(str(yaml), None)
            if actors:
                remote_tool = cast("RemoteTool", tools[0])  # the YAML above gives it a remote: block
                on_event_loop(remote_tool.pool.start())  # started outside the timing, as before a training step
            began = time.perf_counter()
            output, _, _ = rollout.run(turns, prompts, tools=tools)
            seconds[actors] = time.perf_counter() - began
            errors = [fields.error for fields in SampleFields.every_row(output.non_tensor_batch) if fields.masked]
            if errors:
                raise RuntimeError(f"a trajectory on {actors} actors was masked: {errors}")
    name = f"remote/{trajectories}x2_calls_of_{BLOCK_S:g}s"
    figures = [figure(f"{name}/in_process_s", [seconds[0]])]
    figures += [figure(f"{name}/{actors}_actors_s", [seconds[actors]]) for actors in ACTORS]
    figures.append(figure(f"{name}/speedup_2_actors", [seconds[1] / seconds[2]], ">= 1.6"))
    figures.append(figure(f"{name}/speedup_4_actors", [seconds[1] / seconds[4]], ">= 2.8"))
    return figures


def image_crossing(repeats: int) -> list[Figure]:
    from verl_mm_tools.bench.figures import figure
    from verl_mm_tools.files import FileRoots
    from verl_mm_tools.remote.spec import RemoteSpec
    from verl_mm_tools.remote.tool import RemoteTool
    from verl_mm_tools.tools import RotateTool
    from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

    local = RotateTool()
    remote = RemoteTool(RotateTool, {}, local.tool_schema, RemoteSpec(actors=1))
    on_event_loop(remote.start())
    figures = []
    for side in (448, 1024):
        image = Image.new("RGB", (side, side), (30, 90, 150))
        samples: dict[str, list[float]] = {"remote": [], "in_process": []}
        for _ in range(repeats + 1):  # the first pair warms up
            agent_data = SimpleNamespace(image_data=[image])
            attach_tool_context(agent_data, ToolContext(ImageWorkspace(agent_data.image_data), FileRoots()))
            samples["in_process"].append(timed(local.execute("", {"degrees": 90}, agent_data=agent_data)))
            key, _ = on_event_loop(remote.create())
            samples["remote"].append(timed(remote.execute(key, {"degrees": 90}, agent_data=agent_data)))
            on_event_loop(remote.release(key))
        for where, values in samples.items():
            figures.append(figure(f"remote/rotate_{side}px/{where}_ms", [v * 1e3 for v in values[1:]]))
        figures.append(figure(f"remote/rotate_{side}px/bytes_per_image", [len(pickle.dumps(image, protocol=5))]))
    slot = remote.pool.slots[0]
    round_trips = [timed(remote.pool.call(slot, "ping")) * 1e3 for _ in range(repeats)]
    figures.append(figure("remote/round_trip_without_images_ms", round_trips))
    return figures
