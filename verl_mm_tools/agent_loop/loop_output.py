"""``MMToolOutput``: the mm_tool loop's ``AgentLoopOutput``, which hands verl's postprocess the trajectory's images
as the image processor saw them.

The image's path, one direction: a tool's answer adds a ``PIL.Image`` to the trajectory's workspace; the render that
admits it runs the image processor once, through the trajectory's ``ImageFeatureStore``, which keeps the image's token
keys and compact form; each training sample is an ``MMToolOutput`` that holds the store (``image_store``, a typed
private attribute, never dumped into the sample's fields); verl's worker postprocess (``fixes/processed_images.py``)
reads it from the output it is given, and the sample's ``multi_modal_inputs`` carry the compact forms to the trainer,
which expands them just before the forward (``fixes/compact_images.py``). No table keyed by ``id()``, no lookup from
outside: an output that is not an ``MMToolOutput`` (another loop's) has no store and takes verl's path.

The store lets go of its kept images once every output it was handed to is gone (``ImageFeatureStore.tie``). An
output pickled to another process goes without its store (its images are processed there as verl does).
"""

from __future__ import annotations

from typing import Any

from pydantic import PrivateAttr
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.agent_loop.image_features import ImageFeatureStore

ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopOutput",
            "33447ecd3e119b3576b3488c74cf687679c6547e55fbc912c5f59e0414b645c7",
        ),
    ),
    what="adds one private attribute to verl's output model: the trajectory's `ImageFeatureStore`, which the "
    "processed images' fix (`adaptations/fixes/processed_images.py`) reads in verl's worker postprocess; pydantic "
    "leaves it out of `model_dump` (so out of the sample's fields, TransferQueue and the DataProto), and a pickled "
    "output goes without it",
    why="verl's postprocess gets the output alone: without a field on it, the store reached the postprocess "
    "through a module-global table keyed by `id(output)` (issue #59, item 5)",
    applies_to=VERL,
    proof="none (an extension of verl's data model); its use: `tests/agent_loop/test_image_features_on_cpu.py::"
    "test_an_output_hands_its_store_to_verls_postprocess_and_never_into_a_pickle_or_its_fields`",
)


@ADAPTATION.implements
class MMToolOutput(AgentLoopOutput):
    """verl's ``AgentLoopOutput`` with the trajectory's image store (see the module docstring)."""

    _images: ImageFeatureStore | None = PrivateAttr(default=None)

    @property
    def image_store(self) -> ImageFeatureStore | None:
        return self._images

    def hand_images(self, store: ImageFeatureStore) -> None:
        """Give verl's postprocess of this output the trajectory's kept images."""
        self._images = store
        store.tie(self)

    def __getstate__(self) -> dict[Any, Any]:
        """Pickled without the store: its processor and kept tensors belong to this worker."""
        state = super().__getstate__()
        return {**state, "__pydantic_private__": {**(state.get("__pydantic_private__") or {}), "_images": None}}


def image_store(output: object) -> ImageFeatureStore | None:
    """The image store an output hands to verl's postprocess; None for any other loop's output."""
    return output.image_store if isinstance(output, MMToolOutput) else None
