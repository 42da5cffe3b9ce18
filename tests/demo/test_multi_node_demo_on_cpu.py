"""``demo --nodes 2``: the option's checks, the trainer command that joins a running Ray cluster, and a node lost
mid-run (the 2-node run to its end: tests/demo/test_demo_e2e_on_cpu.py, separate_async)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.overrides import ray_sizes, trainer_command
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.demo.watch import run_processes
from verl_mm_tools.errors import ConfigError

# Liveness bounds, not timings: the first step comes ~2-4 min after the start on 2 cores (far more on a loaded
# machine); the run usually stopped 13 s after the kill (Ray declares the node dead after 1.5 s, verl's trainer then
# fails on its next call to an actor of node_b), but a driver waiting on an object of node_b never fails (CI: still
# running 300 s after): the demo stops it NODE_LOST_GRACE_S (60 s) after it saw the node gone, SIGKILL 60 s later.
FIRST_STEP_S, STOPPED_S = 900, 300


@pytest.mark.parametrize(
    ("nodes", "trainer", "error"),
    [
        (3, "separate_async", "--nodes must be 1 or 2 (Ray nodes started on this machine), got 3"),
        (2, "sync", "a resource pool for each: --trainer separate_async or fully_async (got sync)"),
        (2, "classic", "(got classic)"),
    ],
)
def test_nodes_other_than_one_or_two_or_without_separate_pools_are_refused(tmp_path, nodes, trainer, error):
    with pytest.raises(ConfigError) as raised:
        DemoOptions(out=tmp_path, task="rotation", trainer=trainer, nodes=nodes, rollout="hf")
    assert error in str(raised.value)


@pytest.mark.parametrize("trainer", ["separate_async", "fully_async"])
def test_the_command_joins_the_cluster_without_sizing_one(tmp_path, trainer):
    options = DemoOptions(out=tmp_path, task="rotation", trainer=trainer, nodes=2, rollout="hf")
    paths = DemoPaths(out=tmp_path, model=Path("/model"), train=tmp_path / "t.parquet", val=tmp_path / "v.parquet")
    alone = trainer_command(options, paths)
    joined = trainer_command(options, paths, address="10.0.0.1:6379")

    assert ray_sizes(alone) == ((16, 2) if trainer == "separate_async" else (48, 2))
    sizes = [item for item in joined if "ray_kwargs.ray_init.num_" in item]
    assert sizes == ["ray_kwargs.ray_init.num_cpus=null"]  # ray.init refuses sizes when it joins a cluster
    assert joined[-2:] == ["+ray_kwargs.ray_init.address=10.0.0.1:6379", "ray_kwargs.ray_init.num_cpus=null"]
    assert [item for item in alone if "ray_kwargs" not in item] == [item for item in joined if "ray_kwargs" not in item]


def node_b_raylet(metrics: Path) -> psutil.Process | None:
    """The run's raylet of node_b (its workers inherit the run's environment, and so does the raylet)."""
    for process in run_processes(metrics):
        try:
            if process.name() == "raylet" and any(
                a.startswith("--static_resource_list=node_b,") for a in process.cmdline()
            ):
                return process
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
def test_losing_node_b_mid_run_stops_the_demo_naming_the_node_and_leaves_nothing(tmp_path):
    """node_b's raylet SIGKILLed once the trainer logged its first step, as when that machine dies: the demo stops
    with a failure that names node_b (and not node_a) by Ray's node id, and no process of the run survives."""
    out = tmp_path / "lost_node"
    command = [sys.executable, "-m", "verl_mm_tools.cli", "demo", "--out", str(out), "--task", "rotation"]
    command += [
        "--steps",
        "30",
        "--nodes",
        "2",
        "--trainer",
        "separate_async",
        "--rollout",
        "hf",
        "trainer.save_freq=-1",
    ]
    metrics, log = out / "logs" / "metrics.jsonl", tmp_path / "demo.log"
    with log.open("w") as stdout:
        demo = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + FIRST_STEP_S
    while not (metrics.exists() and metrics.read_text().strip()):  # mid-run: the trainer has logged a step
        assert demo.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    raylet = node_b_raylet(metrics)
    assert raylet is not None, [process.name() for process in run_processes(metrics)]
    node_id = next(flag.split("=", 1)[1] for flag in raylet.cmdline() if flag.startswith("--node_id="))
    raylet.kill()
    try:
        returncode = demo.wait(timeout=STOPPED_S)
    finally:
        demo.kill()
    said = log.read_text()
    assert returncode != 0, said[-3000:]
    assert f"Ray node node_b died during the run (Node Id {node_id})" in said, said[-3000:]
    assert "Ray node node_a died" not in said
    assert "left running by the trainer" not in said  # the cluster's processes are the cluster's to stop
    gone = time.monotonic() + 10  # SIGKILLed processes are reaped by their parents
    while run_processes(metrics) and time.monotonic() < gone:
        time.sleep(1)
    assert [process.name() for process in run_processes(metrics)] == []
