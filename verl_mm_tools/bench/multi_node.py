"""``bench --remote``, figure 7c: an image crossing Ray nodes, against the same call within a node.

Two Ray nodes started on this machine (``runtime.cluster.local_cluster``); the driver attaches to node_a. A rotate
call on a new square RGB image (448 and 1024 px) goes to a remote session on node_a (within the node: the image goes
through node_a's object store, shared memory) and on node_b (across nodes: node_b's object manager pulls it from
node_a's store over TCP, and the rotated image comes back the same way), in interleaved pairs. Figures: the
milliseconds of each call, and the cost per MB of image moved (both ways), the slope between the two sizes, which
cancels the fixed cost of a call. On one machine "across" is loopback TCP between two object stores: a real network
adds the transfer time of its bandwidth (about 0.8 ms per MB at 10 Gb/s).
"""

from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace
from typing import TYPE_CHECKING

from PIL import Image

from verl_mm_tools.bench.verl_loop import on_event_loop, timed

if TYPE_CHECKING:
    from verl_mm_tools.bench.figures import Figure

logger = logging.getLogger(__name__)

SIDES = (448, 1024)
WHERE = {"within_node": "node_a", "across_nodes": "node_b"}


def cross_node_figures(repeats: int = 5) -> list[Figure]:
    """Start a 2-node cluster, measure, stop it. Empty (with a warning) when this process already has Ray running:
    the measurement needs its own driver of the 2-node cluster."""
    import ray

    from verl_mm_tools.runtime.cluster import local_cluster

    if ray.is_initialized():
        logger.warning("bench: the cross-node figure needs its own Ray driver; Ray already runs here, skipped")
        return []
    with local_cluster(nodes=2, num_cpus=4, num_gpus=0) as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            return measure(repeats)
        finally:
            ray.shutdown()


def measure(repeats: int) -> list[Figure]:
    """The figures, on a running cluster with nodes offering node_a (where this driver runs) and node_b."""
    from statistics import median

    from verl_mm_tools.bench.figures import figure
    from verl_mm_tools.files import FileRoots
    from verl_mm_tools.remote.spec import RemoteSpec
    from verl_mm_tools.remote.tool import RemoteTool
    from verl_mm_tools.tools import RotateTool
    from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

    schema = RotateTool().tool_schema
    tools = {
        where: RemoteTool(RotateTool, {}, schema, RemoteSpec(resources={node: 1}))  # the spec keys the pool
        for where, node in WHERE.items()
    }
    for tool in tools.values():
        on_event_loop(tool.start())
    figures, medians, megabytes = [], {}, {}
    for side in SIDES:
        image = Image.new("RGB", (side, side), (30, 90, 150))
        megabytes[side] = len(pickle.dumps(image, protocol=5)) / 1e6
        samples: dict[str, list[float]] = {where: [] for where in tools}
        for _ in range(repeats + 1):  # the first round warms up
            for where, tool in tools.items():
                agent_data = SimpleNamespace(image_data=[image])
                attach_tool_context(agent_data, ToolContext(ImageWorkspace(agent_data.image_data), FileRoots()))
                key, _ = on_event_loop(tool.create())
                samples[where].append(timed(tool.execute(key, {"degrees": 90}, agent_data=agent_data)) * 1e3)
                on_event_loop(tool.release(key))
        for where, values in samples.items():
            figures.append(figure(f"remote/nodes/rotate_{side}px/{where}_ms", values[1:]))
            medians[where, side] = median(values[1:])
    small, large = SIDES
    moved_mb = 2 * (megabytes[large] - megabytes[small])  # the image there and the rotated one back
    per_mb = {where: (medians[where, large] - medians[where, small]) / moved_mb for where in tools}
    figures += [figure(f"remote/nodes/{where}_ms_per_mb", [value]) for where, value in per_mb.items()]
    extra = medians["across_nodes", large] - medians["within_node", large]
    figures.append(figure(f"remote/nodes/rotate_{large}px/extra_across_ms", [extra]))
    return figures
