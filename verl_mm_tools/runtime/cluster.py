"""Several Ray nodes on one machine: a head (``ray start --head``) and more raylets (``ray start --address``), each
with its own custom resource (``node_a``, ``node_b``, ...), its own temporary directory and its own working
directory, so ``demo --nodes 2``, the benchmarks and the tests run what a multi-node cluster does without a second
machine::

    with local_cluster(nodes=2, num_gpus=1) as cluster:
        ray.init(address=cluster.address)
        ray.get(task.options(resources={"node_b": 1}).remote())   # runs on the second raylet
        cluster.kill_raylet("node_b")                             # a lost node, as when a machine dies

What Ray allows: every node keeps its files under its own ``--temp-dir``, but all nodes share the head's session
name (``session_<date>_<pid>``): one session per cluster is Ray's rule. A worker process starts in its raylet's
working directory (``node.work_dir``); the driver's working directory is still added to every worker's ``sys.path``
(Ray's ``py_driver_sys_path``), which on one machine resolves, so a test that must prove a module is *not* found on a
node removes it from disk after the driver imported it.

The cluster runs without Ray's token authentication (``RAY_AUTH_MODE=disabled`` for its processes): ``ray start
--head`` turns it on when ``~/.ray/auth_token`` exists, but ``ray start --address`` and a driver connecting to an
address do not, and both fail with ``InvalidAuthToken``. A real cluster should set ``RAY_AUTH_MODE=token`` on every
node and every driver, with the token on each machine.

Stopping: only this cluster's processes (marked by ``NODE_MARKER`` in their environment), never ``ray stop`` (it
stops every Ray instance of the machine). ``local_cluster`` always stops, and raises ``ClusterError`` naming any
process that survived SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from verl_mm_tools.errors import VerlMMToolsError
from verl_mm_tools.supervise import processes_with_environ

logger = logging.getLogger(__name__)

NODE_NAMES = ("node_a", "node_b", "node_c", "node_d")
NODE_RESOURCE_UNITS = 100  # each node's own resource: an actor asking {node_b: 1} lands on node_b
START_TIMEOUT_S = 120.0
LISTEN_PORTS = range(20000, 65536)  # the head's listening ports: below 20000 are Ray's worker ports (10002-19999)
STOP_GRACE_S = 5.0
# A lost raylet is declared dead after health_check_period_ms * failure_threshold (Ray's default 3 s * 5).
FAST_HEALTH_CHECK = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
NODE_MARKER = "VERL_MM_TOOLS_RAY_NODE"  # set to the node's temp dir in the environment of its every process
# Ray starts an idle worker per logical CPU when the first driver connects: on 2 cores, 2 nodes x 16 logical CPUs of
# Python processes importing Ray slow everything else down for a minute. Workers start when an actor needs one.
NO_PRESTART = {"RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}


class ClusterError(VerlMMToolsError, RuntimeError):
    """A node did not start, or a process of the cluster did not stop."""


@dataclasses.dataclass
class RayNode:
    """One raylet: its name (also its custom resource), directories and logical resources."""

    name: str
    temp_dir: Path
    work_dir: Path
    num_cpus: int
    num_gpus: int
    head: bool = False

    @property
    def resources(self) -> dict[str, int]:
        return {self.name: NODE_RESOURCE_UNITS}

    def processes(self) -> list[psutil.Process]:
        """This node's Ray processes: every descendant of its ``ray start``, which all inherit ``NODE_MARKER``. (Not
        the command lines naming the temp dir: a worker retitles itself ``ray::...``, and one whose raylet was
        killed is no longer its child.)"""
        return [process for process in processes_with_environ(NODE_MARKER, str(self.temp_dir)) if _alive(process)]

    def raylet(self) -> psutil.Process | None:
        return next((process for process in self.processes() if _is_raylet(process)), None)

    def node_id(self) -> str | None:
        """Ray's id of this node (what Ray's errors name: "Node Id: ..."), from its raylet's command line; None when
        the raylet is gone."""
        raylet = self.raylet()
        flags = _cmdline(raylet) if raylet is not None else []
        return next((flag.split("=", 1)[1] for flag in flags if flag.startswith("--node_id=")), None)


@dataclasses.dataclass
class LocalCluster:
    """A running cluster: its GCS address, its nodes (the head first), its root directory."""

    address: str
    nodes: list[RayNode]
    root: Path

    def node(self, name: str) -> RayNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ClusterError(f"no node {name!r} in this cluster; its nodes are {[n.name for n in self.nodes]}")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a driver of this cluster (``RAY_ADDRESS`` set; what verl's ``ray.init`` reads)."""
        env = dict(os.environ if base is None else base)
        env["RAY_ADDRESS"] = self.address
        env["RAY_AUTH_MODE"] = "disabled"
        return env

    def processes(self) -> list[psutil.Process]:
        """Every node's processes, in one pass over the machine's processes (the demo asks at each 0.2 s poll)."""
        marked = processes_with_environ(NODE_MARKER, *(str(node.temp_dir) for node in self.nodes))
        return [process for process in marked if _alive(process)]

    def kill_raylet(self, name: str) -> int:
        """SIGKILL the node's raylet (its workers exit with it): the node is lost, as when its machine dies.
        Returns the raylet's pid."""
        node = self.node(name)
        if node.head:
            raise ClusterError("kill_raylet: the head's raylet takes the cluster down; kill a worker node's")
        raylet = node.raylet()
        if raylet is None:
            raise ClusterError(f"{name}: no raylet running under {node.temp_dir}")
        raylet.kill()
        raylet.wait(timeout=10)
        return raylet.pid

    def stop(self) -> None:
        """Stop this cluster's processes: raylets (and their workers) first, the GCS last, as ``ray stop`` orders
        them; SIGTERM, then SIGKILL after a grace period. Raises ClusterError naming any survivor."""
        raylets = [process for process in self.processes() if _is_raylet(process)]
        workers = [child for raylet in raylets for child in _children(raylet)]
        _terminate(raylets + workers)
        _terminate([process for process in self.processes() if not _is_gcs(process)])
        _terminate(self.processes())
        left = self.processes()
        if left:
            raise ClusterError(
                "processes of the local Ray cluster survived SIGKILL: "
                + ", ".join(f"{process.pid} ({_name(process)})" for process in left)
            )


@contextlib.contextmanager
def local_cluster(
    nodes: int = 2,
    *,
    num_cpus: int = 8,
    num_gpus: int = 1,
    object_store_mb: int = 200,
    root: Path | None = None,
    fast_health_check: bool = True,
    env: Mapping[str, str] | None = None,
) -> Iterator[LocalCluster]:
    """Start ``nodes`` Ray nodes on this machine (the head first), yield the cluster, and always stop it.

    num_cpus / num_gpus: each node's logical resources (a GPU here is a placement token: verl's resource pools ask
    for GPUs, and the CPU backend reports Ray's ``GPU`` as its resource). ``root`` holds each node's working
    directory (default: a new temporary directory, removed afterwards); temp dirs always go under a short
    ``/tmp`` path (Unix socket paths are limited to 108 bytes). ``env``: the environment the raylets start with
    (default this process's), which is what their workers inherit: a driver's own environment does not reach a
    cluster it connects to (only its runtime_env's env_vars do).
    """
    if not 1 <= nodes <= len(NODE_NAMES):
        raise ClusterError(f"nodes must be between 1 and {len(NODE_NAMES)}, got {nodes}")
    temp_root = Path(tempfile.mkdtemp(prefix="vmtn-", dir="/tmp"))
    own_root = root is None
    root = Path(tempfile.mkdtemp(prefix="vmt-cluster-")) if root is None else Path(root)
    cluster = LocalCluster(address="", nodes=[], root=root)
    try:
        cluster.address = f"{_node_ip()}:{_free_port()}"
        for index in range(nodes):
            name = NODE_NAMES[index]
            node = RayNode(
                name=name,
                temp_dir=temp_root / name[-1],
                work_dir=root / name / "work",
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                head=index == 0,
            )
            node.work_dir.mkdir(parents=True, exist_ok=True)
            cluster.nodes.append(node)
        # all at once: `ray start --address` retries until the head's GCS answers (saves ~10 s a node)
        base = dict(os.environ if env is None else env)
        starts = [_start(node, cluster, base, fast_health_check, object_store_mb) for node in cluster.nodes]
        for node, start in zip(cluster.nodes, starts):
            _wait_started(node, start)
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(temp_root, ignore_errors=True)
            if own_root:
                shutil.rmtree(root, ignore_errors=True)


def _start(
    node: RayNode, cluster: LocalCluster, base_env: dict[str, str], fast_health_check: bool, object_store_mb: int
) -> _Start:
    import json

    command = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        f"--temp-dir={node.temp_dir}",
        f"--num-cpus={node.num_cpus}",
        f"--num-gpus={node.num_gpus}",
        f"--resources={json.dumps(node.resources)}",
        "--disable-usage-stats",
        f"--object-store-memory={object_store_mb * 1024 * 1024}",
    ]
    if node.head:
        command += [
            "--head",
            f"--port={cluster.address.rsplit(':', 1)[1]}",
            f"--ray-client-server-port={_free_port()}",
            f"--dashboard-port={_free_port()}",
            "--include-dashboard=false",
        ]
    else:
        command.append(f"--address={cluster.address}")
    env = {**base_env, **NO_PRESTART, "RAY_AUTH_MODE": "disabled", NODE_MARKER: str(node.temp_dir)}
    env.pop("RAY_ADDRESS", None)
    if fast_health_check:
        env.update(FAST_HEALTH_CHECK)
    log = open(node.temp_dir.parent / f"ray_start_{node.name}.log", "w+")  # closed in _wait_started
    process = subprocess.Popen(command, cwd=node.work_dir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    return _Start(command, process, log)


@dataclasses.dataclass
class _Start:
    command: list[str]
    process: subprocess.Popen
    log: Any


def _wait_started(node: RayNode, start: _Start) -> None:
    try:
        code = start.process.wait(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        start.process.kill()
        raise ClusterError(f"{node.name}: `ray start` did not finish within {START_TIMEOUT_S:g} s") from error
    finally:
        start.log.seek(0)
        output = start.log.read()
        start.log.close()
    if code != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise ClusterError(f"{node.name}: `{' '.join(start.command)}` failed (exit {code}):\n{tail}")
    logger.info("started Ray %s in %s", node.name, node.work_dir)


def _node_ip() -> str:
    from ray._private.services import get_node_ip_address

    return str(get_node_ip_address())


def _free_port() -> int:
    """A port free now, drawn outside the kernel's ephemeral range and Ray's worker ports. A port the kernel hands
    out (bind to 0) may go to the next outgoing connection of any process before `ray start` binds it: in CI the
    head's GCS port was taken so ("Failed to start the grpc server ... Address already in use")."""
    ephemeral = _ephemeral_ports()
    candidates = [port for port in LISTEN_PORTS if port not in ephemeral]
    tried = random.sample(candidates, min(len(candidates), 64))
    for port in tried:
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise ClusterError(
        f"no free port in {LISTEN_PORTS} outside the kernel's ephemeral ports {ephemeral} ({len(tried)} tried): "
        "stop the processes that hold them"
    )


def _ephemeral_ports() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(process: psutil.Process) -> str:
    return " ".join(_cmdline(process))[:120] or "?"


def _is_raylet(process: psutil.Process) -> bool:
    return _name(process).split(" ")[0].endswith("/raylet")


def _is_gcs(process: psutil.Process) -> bool:
    return _name(process).split(" ")[0].endswith("/gcs_server")


def _terminate(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=STOP_GRACE_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)
