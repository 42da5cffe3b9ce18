"""verl's bucketed weight transfer into vLLM (``adaptations/fixes/weight_sync.py``), with verl's real sender and
receiver over a real ZMQ socket and shared memory, as a CPU run uses them: a bucket vLLM fails to load stops the sync
with vLLM's error, on both sides, instead of hanging the trainer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import verl_mm_tools.plugin  # noqa: F401  (applies the fixes when verl imports the modules they fix)
from verl_mm_tools.adaptations.fixes.weight_sync import WEIGHT_SYNC_TIMEOUT_ENV, WeightSyncError

pytestmark = pytest.mark.integration  # verl's weight-sync sender and receiver, in processes

WEIGHTS = [("layer.weight", torch.arange(96 * 32, dtype=torch.float32).reshape(96, 32)), ("layer.bias", torch.ones(96))]
LOAD_ERROR = "Attempted to load weight (torch.Size([96, 32])) into parameter (torch.Size([0]))"


@pytest.fixture
def transfer(tmp_path, monkeypatch):
    from verl.plugin.platform import platform_manager
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as module

    from verl_mm_tools.cpu.platform import PlatformCPU

    monkeypatch.setattr(platform_manager, "_current_platform", PlatformCPU())  # as VERL_PLATFORM=cpu selects
    monkeypatch.setenv(WEIGHT_SYNC_TIMEOUT_ENV, "20")  # a regression fails the test instead of hanging it
    return module, f"ipc://{tmp_path}/weights.sock"


def sync(module, handle, load, timeout_s: float = 20.0):
    """One weight sync: verl's receiver in a thread (vLLM's worker side) calling ``load`` per bucket, verl's sender
    here (the trainer side). Returns (sender's exception, receiver's exception, receiver thread still alive)."""
    outcome = {}

    def receive():
        receiver = module.BucketedWeightReceiver(zmq_handle=handle, device=torch.device("cpu"), use_shm=True)
        try:
            receiver.receive_weights(on_bucket_received=load)
        except BaseException as error:  # noqa: BLE001 (the test reads what was raised)
            outcome["receiver"] = error

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sender = module.BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)
    try:
        asyncio.run(sender.async_send_weights(iter(WEIGHTS)))
    except BaseException as error:  # noqa: BLE001
        outcome["sender"] = error
    thread.join(timeout_s)
    return outcome.get("sender"), outcome.get("receiver"), thread.is_alive()


def failing_load(weights, is_last):
    raise AssertionError(LOAD_ERROR)


def test_a_sync_delivers_every_tensor(transfer):
    module, handle = transfer
    received = {}
    sender_error, receiver_error, alive = sync(
        module, handle, lambda weights, is_last: received.update((name, tensor.clone()) for name, tensor in weights)
    )
    assert (sender_error, receiver_error, alive) == (None, None, False)
    assert sorted(received) == ["layer.bias", "layer.weight"]
    assert all(torch.equal(received[name], tensor) for name, tensor in WEIGHTS)


def test_a_failed_load_stops_both_sides_with_vllms_error(transfer):
    module, handle = transfer
    sender_error, receiver_error, alive = sync(module, handle, failing_load)
    assert isinstance(receiver_error, AssertionError) and str(receiver_error) == LOAD_ERROR
    assert isinstance(sender_error, WeightSyncError)
    assert str(sender_error) == f"the rollout engine failed to load the trainer's weights: AssertionError: {LOAD_ERROR}"
    assert not alive


# verl's own classes (the fix undone), in a process of their own: their sender never returns.
ORIGINAL_SCENARIO = textwrap.dedent("""
    import asyncio, os, tempfile, threading, torch
    import verl_mm_tools.plugin
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as module
    for cls, name in ((module.BucketedWeightReceiver, "receive_weights"),
                      (module.BucketedWeightReceiver, "_cleanup"), (module.BucketedWeightSender, "_init_socket")):
        setattr(cls, name, getattr(cls, name).__wrapped__)
    handle = f"ipc://{tempfile.mkdtemp()}/weights.sock"
    def fail(weights, is_last):
        raise AssertionError("load failed")
    def receive():
        receiver = module.BucketedWeightReceiver(zmq_handle=handle, device=torch.device("cpu"), use_shm=True)
        try:
            receiver.receive_weights(on_bucket_received=fail)
        except BaseException as error:
            print("receiver", type(error).__name__, type(error.__context__).__name__, flush=True)
    threading.Thread(target=receive, daemon=True).start()
    sender = module.BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)
    weights = iter([("w", torch.ones(96, 32))])
    threading.Thread(target=lambda: asyncio.run(sender.async_send_weights(weights)), daemon=True).start()
    threading.Event().wait(5)
    print("sender still waiting after 5 s", flush=True)
    os._exit(0)
""")


def test_verls_original_hangs_the_sender_and_loses_the_error():
    """The bug. When this stops failing, verl fixed it: drop the fix."""
    done = subprocess.run(
        [sys.executable, "-c", ORIGINAL_SCENARIO],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VERL_PLATFORM": "cpu"},
    )
    lines = done.stdout.splitlines()
    # the receiver's error is "cannot close exported pointers exist", raised while handling the real one
    assert "receiver BufferError AssertionError" in lines, done.stderr[-2000:]
    assert lines[-1] == "sender still waiting after 5 s"


def test_a_dead_engine_is_a_timeout_not_a_hang(transfer, monkeypatch):
    module, handle = transfer
    monkeypatch.setenv(WEIGHT_SYNC_TIMEOUT_ENV, "1")
    sender = module.BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)
    with pytest.raises(WeightSyncError, match=r"did not connect to take the weights within 1 s: its worker process "):
        asyncio.run(sender.async_send_weights(iter(WEIGHTS)))  # no receiver at all


def test_an_engine_that_stops_answering_is_a_timeout_not_a_hang(transfer, monkeypatch):
    module, handle = transfer
    monkeypatch.setenv(WEIGHT_SYNC_TIMEOUT_ENV, "2")
    sender_error, _, _ = sync(module, handle, lambda weights, is_last: threading.Event().wait(4), timeout_s=10)
    assert isinstance(sender_error, WeightSyncError)
    assert str(sender_error).startswith("the rollout engine took no weight bucket within 2 s")
