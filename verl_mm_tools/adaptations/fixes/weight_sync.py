"""A weight sync into vLLM that fails hangs the trainer. verl's ``BucketedWeightSender`` (trainer side) waits for each
bucket's acknowledgement with a blocking ``recv()`` and no timeout; when vLLM's side (``BucketedWeightReceiver``, in
vLLM's worker process) fails to load a bucket, nothing ever answers. The receiver then fails a second time: the failed
bucket's tensors still view its shared memory, so closing it raises ``BufferError: cannot close exported pointers
exist``, which replaces the real error. Fixed: the receiver answers the pending bucket with its error
(``ERROR_REPLY``) and keeps its original exception; the sender raises ``WeightSyncError`` with that error, or after
``WEIGHT_SYNC_TIMEOUT_ENV`` seconds without an answer (an engine process that died). Normal syncs are unchanged (the
acknowledgement stays an empty message)."""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.errors import VerlMMToolsError

if TYPE_CHECKING:
    import torch
    import zmq
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import (
        BucketedWeightReceiver,
        BucketedWeightSender,
    )

    # what the receiver hands its callback: one bucket's (name, tensor) pairs, and whether it is the sync's last
    OnBucket = Callable[[list[tuple[str, torch.Tensor]], bool], None]

logger = logging.getLogger(__name__)

BUCKETED_MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
RECEIVE = Target(
    BUCKETED_MODULE,
    "BucketedWeightReceiver.receive_weights",
    "229fcae433aeb2ae7a1a914c18a9cf44ec3fa9dd11b569295ac9ce4c254c9b53",
)
CLEANUP = Target(
    BUCKETED_MODULE,
    "BucketedWeightReceiver._cleanup",
    "6befe44421ad98c88358e6402b3a2e84cb287861bfa9daa541de1e20db61932e",
)
INIT_SOCKET = Target(
    BUCKETED_MODULE,
    "BucketedWeightSender._init_socket",
    "acd9dd63022ee7d05e4c571d31901eabe1d4fc93fc6e1d009174bb515dc9edb9",
)
WEIGHT_SYNC_TIMEOUT_ENV = "VERL_MM_TOOLS_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_WEIGHT_SYNC_TIMEOUT_S = 600.0
ERROR_REPLY = "verl_mm_tools_weight_sync_error"
_FAILURE = "_verl_mm_tools_failure"
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(RECEIVE, CLEANUP, INIT_SOCKET),
    what="a bucket vLLM fails to load is answered with its error, the sender raises `WeightSyncError` with it, or "
    f"after `{WEIGHT_SYNC_TIMEOUT_ENV}` (default 600 s) without an answer",
    why="verl's sender waits with a blocking `recv()` and no timeout for an answer a failed receiver never sends (the "
    "trainer hangs), and the receiver's `BufferError` on cleanup replaces the real error",
    applies_to=VERL,
    proof="`tests/adaptations/test_weight_sync_fix_on_cpu.py::test_verls_original_hangs_the_sender_and_loses_the_error`",
)


@ADAPTATION.replaces(RECEIVE)
def receive_weights(receive: Callable[..., None], self: BucketedWeightReceiver, on_bucket_received: OnBucket) -> None:
    def load_bucket(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
        try:
            on_bucket_received(weights, is_last)
        except BaseException as error:
            setattr(self, _FAILURE, error)
            raise

    return receive(self, load_bucket)


@ADAPTATION.replaces(CLEANUP)
def _cleanup(cleanup: Callable[..., None], self: BucketedWeightReceiver) -> None:
    failure = getattr(self, _FAILURE, None)
    if failure is None:
        return cleanup(self)
    answer_failed_bucket(self, failure)


@ADAPTATION.replaces(INIT_SOCKET)
def _init_socket(init_socket: Callable[..., None], self: BucketedWeightSender) -> None:
    init_socket(self)
    self.socket = CheckedReplies(self.socket, weight_sync_timeout_s())  # type: ignore[assignment, arg-type, unused-ignore]  # verl's attribute is typed by its None default; a zmq socket by now


class WeightSyncError(VerlMMToolsError, RuntimeError):
    """The rollout engine did not take the trainer's weights."""


@ADAPTATION.implements
def answer_failed_bucket(receiver: BucketedWeightReceiver, failure: BaseException) -> None:
    """Release what the receiver holds and answer the bucket it failed on with the error (the sender waits for it)."""
    receiver.buffer = None
    if receiver.shm is not None:
        try:
            receiver.shm.close()
        except BufferError:  # the failed bucket's tensors, held by the traceback, still view it; freed with them
            logger.debug("weight-sync shared memory stays mapped until the failed bucket's tensors are freed")
        receiver.shm = None
    if receiver.socket is not None:
        receiver.socket.send_pyobj({ERROR_REPLY: f"{type(failure).__name__}: {failure}"})
        receiver.socket.close()
        receiver.socket = None


def weight_sync_timeout_s() -> float:
    value = os.environ.get(WEIGHT_SYNC_TIMEOUT_ENV, "")
    try:
        return float(value) if value else DEFAULT_WEIGHT_SYNC_TIMEOUT_S
    except ValueError:
        raise WeightSyncError(f"{WEIGHT_SYNC_TIMEOUT_ENV} must be a number of seconds, got {value!r}") from None


@ADAPTATION.implements
class CheckedReplies:
    """The sender's ZMQ socket: ``send_pyobj`` and ``recv`` raise ``WeightSyncError`` when the engine does not take
    the message in time (a REQ socket blocks on send until a receiver connects), ``recv`` also on an error answer."""

    def __init__(self, socket: zmq.Socket, timeout_s: float) -> None:
        self._socket, self._timeout_s = socket, timeout_s

    def __getattr__(self, name: str) -> object:
        return getattr(self._socket, name)

    def _wait(self, event: int, what: str) -> None:
        if not self._socket.poll(int(self._timeout_s * 1000), event):
            raise WeightSyncError(
                f"the rollout engine {what} within {self._timeout_s:.0f} s: its worker process died or hangs (see "
                f"its log). Raise {WEIGHT_SYNC_TIMEOUT_ENV} if loading a bucket really takes longer."
            )

    def send_pyobj(self, *args: Any, **kwargs: Any) -> zmq.MessageTracker | None:
        import zmq

        self._wait(zmq.POLLOUT, "did not connect to take the weights")
        return self._socket.send_pyobj(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        import zmq

        self._wait(zmq.POLLIN, "took no weight bucket")
        reply = self._socket.recv(*args, **kwargs)
        if reply:
            error = pickle.loads(reply).get(ERROR_REPLY, reply)
            raise WeightSyncError(f"the rollout engine failed to load the trainer's weights: {error}")
        return reply
