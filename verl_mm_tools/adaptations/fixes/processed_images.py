"""Every run with images: verl's agent-loop worker computes each training sample's ``multi_modal_inputs`` (and from
them its position ids) by running the HF processor over the sample's text and every one of its images
(``AgentLoopWorker._compute_multi_modal_inputs``, on both trainers, and again in ``_compute_score`` for a streamed
reward). The mm_tool loop has processed each image already, once, in the render that admitted it
(``agent_loop/image_features.py``). Fixed: for an output the loop tied its ``ImageFeatureStore`` to, verl's method
runs as it is on the store's copy of the same processor, whose image processor returns the kept outputs (bit for bit
the real one's); any other output (another loop's, an image the store has not seen) takes verl's path unchanged."""

from __future__ import annotations

import functools

from verl_mm_tools.adaptations.guard import checked, install_method
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.agent_loop.image_features import attached_store

TARGET = Target(
    "verl.experimental.agent_loop.agent_loop",
    "AgentLoopWorker._compute_multi_modal_inputs",
    "c1bf0d04b7399d10ea9cbc6a6e0beb7f708a40e90ee8ee19d2b582cae235f410",
)
ADAPTATION = Adaptation(
    row=38,
    section=Section.REPLACEMENTS,
    where="`adaptations/fixes/processed_images.py` (every run)",
    targets=(TARGET,),
    what="runs verl's method on the trajectory's `ImageFeatureStore` processor (`agent_loop/image_features.py`): "
    "the text is processed as before, each image's pixel values and grid are the ones kept from the render that "
    "admitted it; outputs without a store take verl's path",
    why="verl runs the image processor again over every image of every training sample (with `export: per_turn`, "
    "1 + 2 + ... + n images for n turns): the largest CPU cost of the rollout outside generation (issue #49)",
    applies_to=VERL,
    proof="`tests/agent_loop/test_image_features_on_cpu.py::"
    "test_verls_postprocess_runs_the_image_processor_again_and_the_fix_gives_the_same_inputs_without`",
)


def apply(_module=None) -> None:
    found = checked(ADAPTATION)
    if found is None:
        return
    (original,) = found

    @functools.wraps(original)
    def _compute_multi_modal_inputs(self, output, input_ids):
        store = attached_store(output)
        if store is None or store.source is not self.processor:
            return original(self, output, input_ids)
        processor = self.processor
        self.processor = store.processor  # synchronous: no other coroutine of the worker runs meanwhile
        try:
            return original(self, output, input_ids)
        finally:
            self.processor = processor

    install_method(TARGET, _compute_multi_modal_inputs)
