"""``demo --nodes 2``: the option's checks and the trainer command that joins a running Ray cluster (no trainer is
started here: the 2-node trainer run is measured by hand, docs/multi_node.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_mm_tools.demo.options import DemoOptions
from verl_mm_tools.demo.overrides import ray_sizes, trainer_command
from verl_mm_tools.demo.prepare import DemoPaths
from verl_mm_tools.errors import ConfigError


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
