"""Every run with images: verl's agent-loop worker computes each training sample's ``multi_modal_inputs`` (and from them
its position ids) by running the HF processor over the sample's text and every one of its images
(``AgentLoopWorker._compute_multi_modal_inputs``, on both trainers, and again in ``_compute_score`` for a streamed
reward). The mm_tool loop has processed each image already, once, in the render that admitted it
(``agent_loop/image_features.py``). Fixed: for an output that hands it its trajectory's ``ImageFeatureStore``
(``agent_loop/loop_output.py``, its adaptation), verl's method runs as it is on the store's copy of the same
processor, whose image processor returns the kept outputs (bit for bit the real one's) without pixel values, and the
sample carries its images' compact forms instead (``compact_image.CompactImages.inputs``; the trainer expands them:
``fixes/compact_images.py``). A family without a compact form gets the kept float pixel values. A prompt's videos
go as the frames the video processor was called with, where that is exact and smaller than its float output
(``compact_video``). Any other output (another loop's, an image the store has not seen) takes verl's path
unchanged."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.compact_form import VIDEO_PIXELS, NotCompactable
from verl_mm_tools.compact_image import CompactImages, is_image_pixels
from verl_mm_tools.compact_video import VideoCallRecorder, compacted
from verl_mm_tools.handoff import SampleFields

if TYPE_CHECKING:
    import torch
    from transformers import ProcessorMixin
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker

logger = logging.getLogger(__name__)

TARGET = Target(
    "verl.experimental.agent_loop.agent_loop",
    "AgentLoopWorker._compute_multi_modal_inputs",
    "c1bf0d04b7399d10ea9cbc6a6e0beb7f708a40e90ee8ee19d2b582cae235f410",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="runs verl's method on the trajectory's `ImageFeatureStore` processor (`agent_loop/image_features.py`): "
    "the text is processed as before, each image's grid is the one kept from the render that admitted it, and its "
    "pixels go as their compact form (the `vmt_compact_*` keys of `multi_modal_inputs`, expanded by the compact "
    "images' fix, `adaptations/fixes/compact_images.py`) or, for a family without one, as the kept float pixel "
    "values; a prompt's videos go as the uint8 frames their video processor was called with (`compact_video`, the "
    "`vmt_video_*` keys) where that is exact and smaller than its float output; outputs without a store take "
    "verl's path",
    why="verl runs the image processor again over every image of every training sample (with `export: per_turn`, "
    "1 + 2 + ... + n images for n turns): the largest CPU cost of the rollout outside generation (issue #49)",
    applies_to=VERL,
    proof="`tests/agent_loop/test_image_features_on_cpu.py::"
    "test_verls_postprocess_runs_the_image_processor_again_and_the_fix_gives_the_same_inputs_without`",
)


@ADAPTATION.replaces(TARGET)
def _compute_multi_modal_inputs(
    original: Callable[..., dict[str, torch.Tensor]],
    self: AgentLoopWorker,
    output: AgentLoopOutput,
    input_ids: torch.Tensor,
) -> dict[str, torch.Tensor]:
    # imported at the call, once verl's agent-loop module (which it extends) is: not at plugin load (~2 s of every
    # import verl), nor at install: loop_output's own import of verl's module installs this, before it is finished.
    from verl_mm_tools.agent_loop import loop_output

    store = loop_output.image_store(output)
    if store is None or store.source is not self.processor:
        return original(self, output, input_ids)
    images = (output.multi_modal_data or {}).get("images") or []
    compact = store.compact_images(images) if images else None
    videos = VideoCallRecorder(store.processor.video_processor) if _has_videos(output, store.processor) else None
    processor = self.processor
    self.processor = store.processor  # synchronous: no other coroutine of the worker runs meanwhile
    try:
        # compact images: the store's processor gives no pixel values outside with_pixels
        with store.with_pixels() if compact is None else contextlib.nullcontext(), _recording(store.processor, videos):
            inputs = original(self, output, input_ids)
    finally:
        self.processor = processor
    if compact is not None and not any(is_image_pixels(key) for key in inputs):
        inputs.update(_referring(output, compact).inputs())
    if videos is not None and VIDEO_PIXELS in inputs:
        _compact_videos(output, inputs, videos, store.sample)
    return inputs


def _has_videos(output: AgentLoopOutput, processor: ProcessorMixin) -> bool:
    return (
        bool((output.multi_modal_data or {}).get("videos")) and getattr(processor, "video_processor", None) is not None
    )


@contextlib.contextmanager
def _recording(processor: ProcessorMixin, recorder: VideoCallRecorder | None) -> Iterator[None]:
    """The processor's video processor records its calls meanwhile (``compact_video``)."""
    if recorder is None:
        yield
        return
    processor.video_processor = recorder
    try:
        yield
    finally:
        processor.video_processor = recorder.video_processor


def _compact_videos(
    output: AgentLoopOutput, inputs: dict[str, torch.Tensor], recorder: VideoCallRecorder, sample: str
) -> None:
    """The sample's prompt videos go as the frames their processor saw (uint8) where that is exact and smaller; within
    verl's v1 put, as references to the sample of their group that carries them (``shared_images.py``)."""
    from verl_mm_tools.agent_loop.shared_images import CURRENT_PUT

    try:
        compact = compacted(recorder.calls, recorder.video_processor, inputs, sample)
    except NotCompactable as reason:
        logger.debug("sample %s: its videos go as float pixel values: %s", sample, reason)
        return
    put = CURRENT_PUT.get()
    del inputs[VIDEO_PIXELS]
    inputs.update((compact if put is None else put.referring_videos(output, compact)).inputs())


def _referring(output: AgentLoopOutput, compact: CompactImages) -> CompactImages:
    """Within verl's v1 put (``shared_images.py``): the sample refers to the images another sample of its group
    carries, and its hand-off counts the bytes it carries."""
    from verl_mm_tools.agent_loop.shared_images import CURRENT_PUT

    put = CURRENT_PUT.get()
    if put is None:
        return compact
    compact = put.referring(output, compact)
    image_bytes = SampleFields.key("image_bytes")
    if image_bytes in output.extra_fields:
        output.extra_fields[image_bytes] = compact.nbytes
    return compact
