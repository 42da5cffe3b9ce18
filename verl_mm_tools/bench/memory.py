"""Figure 4 of ``verl-mm-tools bench``: the bytes a finished trajectory holds, counted; and Pillow's block reuse
while the loop figures are timed."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from types import FunctionType, ModuleType

from PIL import Image

from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.bench.loop import loop_factory, one_trajectory


def trajectory_memory(model_dir: str, images: int = 16, side: int = 448) -> list[Figure]:
    """What one finished 16-image mm_tool trajectory holds, counted by ``held_bytes``, over its images' raw bytes."""
    from verl.utils.ray_utils import get_event_loop

    with tempfile.TemporaryDirectory() as workdir:
        make, tokenizer, _ = loop_factory(model_dir, Path(workdir), side, images)
        _, _, (output,) = one_trajectory(make, tokenizer, "mm_tool", images, side, get_event_loop())
    held, raw = held_bytes(output), images * side * side * 3
    return [
        figure(f"memory/{images}_images_held_MB", [held / 2**20]),
        figure("memory/held_over_raw_image_bytes", [held / raw], "<= 2"),
    ]


def held_bytes(root: object) -> int:
    """The bytes ``root`` holds, counted rather than measured (the same on every run): each object by
    ``sys.getsizeof`` plus the buffer it keeps outside Python (``_buffer_bytes``); containers and plain objects
    (dataclasses, pydantic models) are followed, each object counted once; classes, modules and functions are not."""
    counted, total, pending = set(), 0, [root]
    while pending:
        item = pending.pop()
        if id(item) in counted or isinstance(item, (type, ModuleType, FunctionType)):
            continue
        counted.add(id(item))
        total += sys.getsizeof(item) + _buffer_bytes(item, counted)
        pending.extend(_held_objects(item))
    return total


def _pixel_bytes(mode: str) -> int:
    """Bytes per pixel as Pillow stores them: 1 for 1-bit, grey and palette images, 2 for 16-bit ones, else 4 (RGB
    included: Pillow pads it to 32 bits)."""
    return 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4


def _buffer_bytes(item: object, counted: set) -> int:
    """What ``sys.getsizeof`` does not see: an image's pixels, a tensor's storage (once: views share it). A numpy
    array's own data it does see."""
    if isinstance(item, Image.Image):
        return item.width * item.height * _pixel_bytes(item.mode)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor):
        storage = item.untyped_storage()
        if ("storage", storage.data_ptr()) in counted:
            return 0
        counted.add(("storage", storage.data_ptr()))
        return storage.nbytes()
    return 0


def _held_objects(item: object) -> list:
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    if isinstance(item, (list, tuple, set, frozenset)):
        return list(item)
    if isinstance(item, (str, bytes, int, float, complex, bool, Image.Image)) or not hasattr(item, "__dict__"):
        return []
    return list(vars(item).values())


@contextlib.contextmanager
def pillow_reusing_image_memory(blocks: int = 64):
    """Let Pillow keep freed image blocks for reuse (the loop figures). By default it returns them, and whether an
    image then lands in fresh pages (page faults: ~0.2 ms for a 1024x1024 image) depended on the process's allocation
    history: two runs' timings differed by up to 16 %, with it by up to 5 %."""
    previous = Image.core.get_blocks_max()
    Image.core.set_blocks_max(blocks)
    try:
        yield
    finally:
        Image.core.set_blocks_max(previous)
