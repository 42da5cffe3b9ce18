"""The ``cpu_object_store`` checkpoint engine, driven the way verl's CheckpointEngineManager drives it (prepare ->
build_topology -> init_process_group -> send/receive -> finalize), each engine in its own Ray actor: the received
tensors equal the sent ones exactly, in order, with their dtypes."""

from __future__ import annotations

import pytest
import ray
import torch

from verl_mm_tools.cpu.checkpoint_engine import BACKEND_NAME, CPUObjectStoreCheckpointEngine, weight_mailbox

# Small buckets, so a sync takes several buckets and one tensor (4 KB) is larger than a bucket.
BUCKET_BYTES = 1024


@pytest.fixture(scope="module")
def local_ray(start_ray):
    start_ray(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def hosts(local_ray):
    """Two actor ranks (rank 0 the master, rank 1 only iterates its weights) and two rollout workers, shared by the
    tests: each Ray actor is a new process that imports verl (seconds on a busy machine)."""
    actors = [EngineHost.remote(is_master=True), EngineHost.remote(is_master=False)]
    rollouts = [EngineHost.remote(is_master=False), EngineHost.remote(is_master=False)]
    ray.get([host.call.remote("prepare") for host in actors + rollouts])  # wait until all have started
    return actors, rollouts


@ray.remote
class EngineHost:
    """Holds one engine in its own process, like an actor rank or a rollout worker."""

    def __init__(self, is_master: bool):
        self.engine = CPUObjectStoreCheckpointEngine(bucket_size=BUCKET_BYTES, is_master=is_master, timeout_s=60.0)

    def call(self, method: str, **kwargs):
        return getattr(self.engine, method)(**kwargs)

    async def send(self, weights: list[tuple[str, torch.Tensor]], global_steps: int) -> dict:
        return await self.engine.send_weights(iter(weights), global_steps=global_steps)

    async def receive(self, global_steps: int, timeout_s: float = 60.0) -> list[tuple[str, torch.Tensor]]:
        self.engine.timeout_s = timeout_s
        return [(name, tensor.clone()) async for name, tensor in self.engine.receive_weights(global_steps=global_steps)]


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(8, 16, generator=generator)),
        ("layer.0.weight", torch.randn(32, 32, generator=generator)),  # 4 KB: larger than a bucket
        ("layer.0.bias", torch.randn(32, generator=generator).to(torch.bfloat16)),
        ("layer.1.weight", torch.randn(4, 4, generator=generator).to(torch.float16)),
        ("position_ids", torch.arange(10, dtype=torch.int64) * (seed + 1)),
        ("scalar", torch.tensor(float(seed))),
    ]


def sync(actors, rollouts, sent, global_steps: int) -> tuple[list, list[dict]]:
    """One weight sync as CheckpointEngineManager.update_weights runs it; returns what each rollout received and
    what each actor's send returned."""
    metadata = ray.get([host.call.remote("prepare") for host in actors + rollouts])
    actor_kwargs, rollout_kwargs = CPUObjectStoreCheckpointEngine.build_topology(len(actors), len(rollouts), metadata)
    ray.get(
        [
            host.call.remote("init_process_group", **{key: values[rank] for key, values in actor_kwargs.items()})
            for rank, host in enumerate(actors)
        ]
        + [
            host.call.remote("init_process_group", **{key: values[rank] for key, values in rollout_kwargs.items()})
            for rank, host in enumerate(rollouts)
        ]
    )
    sends = [host.send.remote(sent, global_steps) for host in actors]
    received = ray.get([host.receive.remote(global_steps) for host in rollouts])
    results = ray.get(sends)
    ray.get([host.call.remote("finalize") for host in actors + rollouts])
    return received, results


def assert_exactly_equal(received, sent):
    assert [name for name, _ in received] == [name for name, _ in sent]
    for (name, got), (_, expected) in zip(received, sent, strict=True):
        assert got.dtype == expected.dtype, name
        assert got.shape == expected.shape, name
        assert torch.equal(got, expected), name


def test_two_receivers_get_exactly_the_sent_tensors_on_every_sync(hosts):
    actors, rollouts = hosts
    for step, seed in ((1, 0), (2, 1)):  # a second sync with other values: nothing of the first one is reused
        sent = weights(seed)
        received, results = sync(actors, rollouts, sent, global_steps=step)
        for tensors in received:
            assert_exactly_equal(tensors, sent)
        master, relay = results
        assert relay == {}
        assert master["cpu_object_store/sent_tensors"] == len(sent)
        assert master["cpu_object_store/weights_version"] == step
        assert master["cpu_object_store/sent_mb"] == sum(tensor.nbytes for _, tensor in sent) / 2**20


def test_finalize_releases_the_sync(local_ray):
    mailbox = weight_mailbox()
    ref = ray.put([("w", torch.ones(2))])
    ray.get(mailbox.post.remote("sync", 0, [ref], True))
    refs, is_last = ray.get(mailbox.take.remote("sync", 0, 5.0))
    assert is_last and torch.equal(ray.get(refs[0])[0][1], torch.ones(2))
    assert ray.get(mailbox.drop.remote("sync")) == 1
    assert ray.get(mailbox.drop.remote("sync")) == 0


def test_a_receiver_without_a_sender_fails_with_a_clear_error(hosts):
    receiver = hosts[1][0]
    ray.get(receiver.call.remote("init_process_group", role="receiver", mailbox=weight_mailbox(), sync_id="lost"))
    with pytest.raises(ray.exceptions.RayTaskError, match="bucket 0 of weight sync lost was not posted within"):
        ray.get(receiver.receive.remote(1, timeout_s=0.5))
    ray.get(receiver.call.remote("finalize"))


def test_the_topology_rejects_a_master_that_is_not_actor_rank_0():
    metadata = [{"is_master": False}, {"is_master": True}, {"is_master": False}]
    with pytest.raises(ValueError, match=r"masters at actor ranks \[1\] of 2"):
        CPUObjectStoreCheckpointEngine.build_topology(2, 1, metadata)


def test_the_backend_is_registered_with_verl():
    import verl  # noqa: F401  (loads the plugins)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    assert CheckpointEngineRegistry.get(BACKEND_NAME) is CPUObjectStoreCheckpointEngine


@ray.remote
def save_pi_old_then_step() -> dict[str, bool]:
    """In its own process (a gloo group of one, and the patch, stay there): an FSDP2 model, pi_old saved by verl's
    fsdp2_sharded_save_to_cpu before and after the CPU patch, then an update."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from verl.utils import fsdp_utils

    from verl_mm_tools.adaptations import guard
    from verl_mm_tools.adaptations.cpu import sharded_save_to_cpu

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 2)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        unpatched, _ = fsdp_utils.fsdp2_sharded_save_to_cpu(model)
        guard.apply(sharded_save_to_cpu.ADAPTATION)
        patched, _ = fsdp_utils.fsdp2_sharded_save_to_cpu(model)
        before = {name: param.full_tensor().clone() for name, param in model.named_parameters()}
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)  # an optimizer step
        return {
            "verl's save follows the update": all(torch.equal(unpatched[name][0], before[name] + 1) for name in before),
            "the patched save keeps pi_old": all(torch.equal(patched[name][0], before[name]) for name in before),
        }
    finally:
        dist.destroy_process_group()


def test_separate_async_keeps_a_real_copy_of_pi_old_on_cpu(local_ray):
    """DetachActorWorker saves pi_old with verl's fsdp2_sharded_save_to_cpu, whose ``.cpu()`` returns the live shard
    on CPU; with the CPU patch the saved state is a copy that the next update does not reach."""
    assert ray.get(save_pi_old_then_step.remote()) == {
        "verl's save follows the update": True,
        "the patched save keeps pi_old": True,
    }
