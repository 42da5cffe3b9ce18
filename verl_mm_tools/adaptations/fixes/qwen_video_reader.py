"""qwen-vl-utils reads no video file here. verl loads a prompt's videos through qwen-vl-utils' ``fetch_video``, whose
readers are decord, torchcodec or torchvision: decord is unmaintained and not installed, torchcodec needs FFmpeg's
shared libraries on the system (none here, and none in a slim image), and torchvision 0.26 removed the
``torchvision.io.read_video`` its reader calls, so every video path fails ("module 'torchvision.io' has no attribute
'read_video'", after a warning that hides the first reader's error). Fixed: a PyAV reader (``verl_mm_tools.video``:
PyAV's wheels carry FFmpeg) is registered as ``pyav`` and chosen where qwen-vl-utils would fall back to a torchvision
without ``read_video``; it also answers that fallback, so a bad file's error is ours, naming the file.
``FORCE_QWENVL_VIDEO_READER`` still chooses."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from verl_mm_tools.adaptations.record import Adaptation, Section, Target

MODULE = "qwen_vl_utils.vision_process"
BACKEND_CHOICE = Target(
    MODULE, "get_video_reader_backend", "8c49357873dc0fe20e90ba2cc093356b522d4df01dc6ef08f2ef2bfb4890c299"
)
# checked only: its reader table and its fallback to "torchvision" on a reader's error are what the fix relies on
FETCH = Target(MODULE, "fetch_video", "09ca3d3322041fb41fc49dea6fea7c6156675cbadefedc4ae8aa71ae72e47cc4")
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(BACKEND_CHOICE, FETCH),
    what="a PyAV video reader registered as `pyav`, chosen instead of a torchvision without `read_video` and "
    "answering the fallback to it",
    why="with torchvision 0.26, no torchcodec FFmpeg libraries and no decord, qwen-vl-utils (and so verl) cannot "
    "read any video file: every video prompt fails with an AttributeError",
    applies_to="qwen-vl-utils 0.0.14 with torchvision 0.26 (verl 0.9.1's video prompts)",
    proof="`tests/adaptations/test_qwen_video_reader_on_cpu.py::"
    "test_qwen_vl_utils_reads_no_video_without_the_fix_and_the_pyav_reader_with_it`",
)


def torchvision_reads_video() -> bool:
    import torchvision.io

    return hasattr(torchvision.io, "read_video")


@ADAPTATION.replaces(BACKEND_CHOICE)
def get_video_reader_backend(choose: Callable[[], str]) -> str:
    """qwen-vl-utils' choice, unless it would be a torchvision that cannot read (asked before it prints its choice)."""
    module: Any = importlib.import_module(MODULE)
    cannot_read = not (module.is_torchcodec_available() or module.is_decord_available() or torchvision_reads_video())
    if module.FORCE_QWENVL_VIDEO_READER is None and cannot_read:
        from verl_mm_tools.video import BACKEND

        return BACKEND
    return choose()


@ADAPTATION.installs
def register_reader(_choose: Callable[[], str], _fetch: Callable[..., Any]) -> None:
    """``pyav`` in the reader table, and in torchvision's place where torchvision cannot read."""
    from verl_mm_tools.video import BACKEND, read_video_sampled

    module: Any = importlib.import_module(MODULE)
    module.VIDEO_READER_BACKENDS[BACKEND] = read_video_sampled
    if not torchvision_reads_video():
        module.VIDEO_READER_BACKENDS["torchvision"] = read_video_sampled
