"""Figure 4 of ``verl-mm-tools bench``: the bytes a finished trajectory holds, counted (a 448 px one as the trainer
gets it, and a 1024 px one part by part: workspace, processor outputs, sample); and Pillow's block reuse while the
loop figures are timed. The worker sweep, peak RSS over 1-64 trajectories at once, is ``bench.worker_memory``."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FunctionType, ModuleType
from typing import TYPE_CHECKING

from PIL import Image

from verl_mm_tools.agent_loop.loop_output import image_store
from verl_mm_tools.bench.figures import Figure, figure
from verl_mm_tools.bench.loop import distinct_script, loop_factory, noise_image, one_trajectory, output_images
from verl_mm_tools.compact_form import ProcessorSpec
from verl_mm_tools.compact_image import CompactHeader, CompactImages, compact_image, expanded_inputs

if TYPE_CHECKING:
    from transformers import BaseImageProcessor, PreTrainedTokenizerBase
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from verl_mm_tools.agent_loop.image_features import ImageFeatureStore
    from verl_mm_tools.bench.loop import MakeLoop


def trajectory_memory(model_dir: str, images: int = 16, side: int = 448, resident_side: int = 1024) -> list[Figure]:
    """What one finished 16-image mm_tool trajectory holds, counted by ``held_bytes``, over its images' raw bytes;
    then ``resident_memory`` of a trajectory of ``resident_side`` px images (one loop set-up for both: the
    processor's pixel limit is the larger side's, under which a 448 px image is processed as before)."""
    from verl.utils.ray_utils import get_event_loop

    loop = get_event_loop()
    with tempfile.TemporaryDirectory() as workdir:
        make, tokenizer, worker = loop_factory(model_dir, Path(workdir), max(side, resident_side), images)
        image, script = noise_image(side), distinct_script(images)
        _, _, (output,) = one_trajectory(make, tokenizer, "mm_tool", images, side, loop, image, script)
        held, raw = held_bytes(output), sum(each.width * each.height * 3 for each in output_images(output))
        figures = [
            figure(f"memory/{images}_images_held_MB", [held / 2**20]),
            figure("memory/held_over_raw_image_bytes", [held / raw], "<= 2"),
        ]
        figures += resident_memory(make, tokenizer, worker, images, resident_side, loop)
        return figures + expansion_cost(worker.processor.image_processor, resident_side)


def expansion_cost(image_processor: BaseImageProcessor, side: int, repeats: int = 9) -> list[Figure]:
    """What the trainer pays per image for compact images (issue #59): ``expanded_inputs`` of a sample of one
    ``side`` px image (the image processor's pipeline after its resize, on the uint8 pixels), CPU ms per image, and
    over the full processor pass verl's worker would run on the same image (resize included), in interleaved pairs."""
    import numpy as np

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    arguments = {"return_tensors": "pt", "max_pixels": side * side, "min_pixels": 784}
    compact, _ = compact_image(image_processor, image, **arguments)
    header = CompactHeader(ProcessorSpec.of(image_processor), arguments, "bench")
    inputs = CompactImages(header, (compact.pixels,)).inputs()
    expanded_inputs(inputs)  # builds the trainer's processor once, as the first micro-batch does
    expansions, passes = [], []
    for _ in range(repeats):
        started = time.process_time()
        expanded_inputs(inputs)
        between = time.process_time()
        image_processor(images=[image], **arguments)
        expansions.append(between - started)
        passes.append(time.process_time() - between)
    name = f"expansion/{side}px"
    return [
        figure(f"{name}/cpu_ms_per_image", [seconds * 1000 for seconds in expansions]),
        figure(f"{name}/over_processor_pass", [a / b for a, b in zip(expansions, passes)], "<= 1"),
    ]


def resident_memory(
    make: MakeLoop,
    tokenizer: PreTrainedTokenizerBase,
    worker: AgentLoopWorker,
    turns: int,
    side: int,
    loop: asyncio.AbstractEventLoop,
) -> list[Figure]:
    """What one mm_tool trajectory of ``turns`` images holds once verl's worker has made its training sample,
    counted, over its images' raw bytes (3 per pixel, each image as the trajectory holds it): its image workspace
    (Pillow's pixels), its processor outputs (the trajectory's ``ImageFeatureStore``: token keys and each image's
    compact form, the resized uint8 pixels, issue #59) and the sample verl sends to the trainer
    (``_agent_loop_postprocess``: ``multi_modal_inputs`` with the compact images, padded ids and masks; the images it
    carries are the workspace's, counted there). Then what the store still keeps once verl has let go of the
    output."""
    image, script = noise_image(side), distinct_script(turns)
    _, _, (output,) = one_trajectory(make, tokenizer, "mm_tool", turns, side, loop, image, script)
    images, store = output_images(output), image_store(output)
    assert store is not None, "an mm_tool trajectory's outputs carry its image store"
    sample = loop.run_until_complete(worker._agent_loop_postprocess(output, False, raw_prompt=[]))
    raw = sum(image.width * image.height * 3 for image in images)
    parts = {
        "workspace": held_bytes(images),
        "processor_outputs": _kept_bytes(store),
        "trainer_output": held_bytes((images, sample)) - held_bytes((images,)),
    }
    del output  # as verl's worker does once it has the sample: the store lets go of its outputs
    name = f"memory/{turns}x{side}px"
    figures = [figure(f"{name}/raw_image_MB", [raw / 2**20])]
    targets = {"processor_outputs": "<= 1.25", "trainer_output": "<= 1.25"}
    figures += [
        figure(f"{name}/{part}_over_raw", [held / raw], targets.get(part, "<= 2")) for part, held in parts.items()
    ]
    kept = _kept_bytes(store)
    return figures + [figure(f"{name}/processor_outputs_kept_after_the_sample_MB", [kept / 2**20], "<= 0")]


def _kept_bytes(store: ImageFeatureStore) -> int:
    return sum(held_bytes(features) for features in store.kept)


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
def pillow_reusing_image_memory(blocks: int = 64) -> Iterator[None]:
    """Let Pillow keep freed image blocks for reuse (the loop figures). By default it returns them, and whether an
    image then lands in fresh pages (page faults: ~0.2 ms for a 1024x1024 image) depended on the process's allocation
    history: two runs' timings differed by up to 16 %, with it by up to 5 %."""
    previous = Image.core.get_blocks_max()
    Image.core.set_blocks_max(blocks)
    try:
        yield
    finally:
        Image.core.set_blocks_max(previous)
