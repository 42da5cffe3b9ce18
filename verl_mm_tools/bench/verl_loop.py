"""Coroutines run to completion on verl's event loop (the one verl's workers and Ray pools capture), untimed or timed:
shared by the remote figures (``bench.remote``) and the cross-node ones (``bench.multi_node``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


def on_event_loop(coroutine: Awaitable[T]) -> T:
    from verl.utils.ray_utils import get_event_loop

    return get_event_loop().run_until_complete(coroutine)


def timed(coroutine: Awaitable[object]) -> float:
    """Seconds ``coroutine`` took to complete."""
    began = time.perf_counter()
    on_event_loop(coroutine)
    return time.perf_counter() - began
