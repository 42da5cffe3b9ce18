"""The mailbox of ``cpu_object_store`` weight syncs (``checkpoint_engine``): a Ray actor holding the object
references of the buckets in flight.

It imports neither torch nor verl: Ray starts the actor in a fresh worker process, which imports this module to
rebuild the class, and the trainer's first weight sync waits for it. Beside ``checkpoint_engine`` (torch, verl) the
actor was ready 8.6 s after it was asked for on an idle machine (31-35 s in a loaded CI); from this module, 0.7 s.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class _Bucket:
    """One posted bucket: the object's reference (inside a list, so Ray hands it on instead of resolving it)."""

    refs: list
    is_last: bool


class WeightMailbox:
    """Ray actor (async) holding the bucket references of the syncs in flight, keyed by sync id and bucket index.

    Receivers may ask for a bucket before the sender posts it; they wait on an event, up to ``timeout_s``.
    """

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, int], _Bucket] = {}
        self._posted: dict[tuple[str, int], asyncio.Event] = {}

    def _event(self, key: tuple[str, int]) -> asyncio.Event:
        return self._posted.setdefault(key, asyncio.Event())

    async def post(self, sync_id: str, index: int, refs: list, is_last: bool) -> None:
        self._buckets[(sync_id, index)] = _Bucket(refs, is_last)
        self._event((sync_id, index)).set()

    async def take(self, sync_id: str, index: int, timeout_s: float) -> tuple[list, bool]:
        try:
            await asyncio.wait_for(self._event((sync_id, index)).wait(), timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"cpu_object_store: bucket {index} of weight sync {sync_id} was not posted within {timeout_s:.0f} s. "
                f"Buckets posted so far: {sorted(self._buckets)}. The actor's rank 0 (the sender) probably failed or "
                "is stuck; see its log. Raise engine_kwargs.cpu_object_store.timeout_s if it is just slow."
            ) from None
        bucket = self._buckets[(sync_id, index)]
        return bucket.refs, bucket.is_last

    async def drop(self, sync_id: str) -> int:
        """Forget a finished sync, releasing its objects; returns how many buckets it had."""
        keys = [key for key in self._posted if key[0] == sync_id]
        for key in keys:
            self._buckets.pop(key, None)
            self._posted.pop(key, None)
        return len(keys)
