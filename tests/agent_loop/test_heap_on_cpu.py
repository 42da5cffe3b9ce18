"""The heap trimmer (``agent_loop/heap.py``): glibc's real ``malloc_trim``, once every 8th processed image, on its own
thread. What it saves is measured in ``bench`` figure 4 (the worker sweep), not here."""

from __future__ import annotations

import threading

from verl_mm_tools.agent_loop.heap import TRIM_EVERY_IMAGES, HeapTrimmer, _malloc_trim


def test_the_heap_is_trimmed_once_every_eighth_image_on_the_trimming_thread():
    real = _malloc_trim()
    assert real is not None, "this machine's C library is glibc: malloc_trim exists"
    calls: list[str] = []
    trimmed = threading.Semaphore(0)

    def trim(pad: int) -> int:
        calls.append(threading.current_thread().name)
        result = real(pad)
        trimmed.release()
        return result

    trimmer = HeapTrimmer(trim)
    assert trimmer.every == TRIM_EVERY_IMAGES == 8
    for _ in range(7):
        trimmer.image_processed()
    assert calls == []
    trimmer.image_processed()
    assert trimmed.acquire(timeout=30)
    assert calls == ["verl-mm-tools-heap-trim"]
    for _ in range(16):  # two more requests; one made while a trim runs is served by the next
        trimmer.image_processed()
    assert trimmed.acquire(timeout=30)
    assert 2 <= len(calls) <= 3 and set(calls) == {"verl-mm-tools-heap-trim"}


def test_without_malloc_trim_no_thread_starts():
    trimmer = HeapTrimmer(None)
    for _ in range(3 * TRIM_EVERY_IMAGES):
        trimmer.image_processed()
    assert trimmer._thread is None and trimmer.trims == 0
