"""Every run with images whose family has a compact form (issue #59): a training sample carries its images as their
resized uint8 pixels (``compact_image.CompactImages``, under the ``vmt_compact_*`` keys of ``multi_modal_inputs``, 1
byte per byte) in place of the float ``pixel_values`` (4 to 8 bytes per byte), from the agent-loop worker
(``fixes/processed_images.py``) to the trainer. Every engine of verl 0.9.1 (FSDP, Megatron, TorchTitan, Automodel)
reads a micro-batch's ``multi_modal_inputs`` through ``verl.utils.model.extract_multi_modal_inputs``: the fix expands
each selected sample's compact images there, just before the forward, into what verl's own processor pass would have
given it (tensor for tensor), and verl's function then joins the micro-batch as before. A sample whose compact images
cannot be expanded exactly stops the step with ``CompactImageError`` naming it; samples without compact images pass
unchanged."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.compact_image import Expansions, expanded_inputs

if TYPE_CHECKING:
    import torch
    from tensordict.tensorclass import NonTensorData

TARGET = Target(
    "verl.utils.model",
    "extract_multi_modal_inputs",
    "8f1bc620119164af23603de01e8b5a677fa0c5d76629334078788004e3464691",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="expands each selected sample's compact images (`compact_image.expanded_inputs`: the image processor's own "
    "pipeline after its resize, on the resized uint8 pixels) into the pixel values verl's own processor pass gives, "
    "then runs verl's function; a compact form that is malformed or expands to other grids than the sample's stops "
    "the step naming the sample",
    why="verl carries every image from the rollout to the trainer as float processor outputs: 8x its bytes for "
    "Qwen-VL and GLM-V (two float32 frames), in the worker, through TransferQueue or the DataProto, and in the "
    "trainer's batch; the float values are a pure function of the resized pixels (issue #59)",
    applies_to=VERL,
    proof="`tests/agent_loop/test_image_features_on_cpu.py::"
    "test_per_turn_samples_take_verls_inputs_with_each_image_processed_once` (every family: what the fixed "
    "function gives equals verl's own pass through verl's own function, tensor for tensor); "
    "`tests/test_compact_image_on_cpu.py::test_verls_function_cannot_read_compact_images`",
)


@ADAPTATION.replaces(TARGET)
def extract_multi_modal_inputs(
    extract: Callable[..., dict[str, torch.Tensor | list[torch.Tensor]]],
    batch_data: Sequence[Mapping[str, object] | NonTensorData | None],
    indices: list[int] | None = None,
) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    selected = batch_data if indices is None else [batch_data[i] for i in indices if i < len(batch_data)]
    expansions: Expansions = {}  # an image that several of the micro-batch's samples show is expanded once
    return extract([_expanded(inputs, expansions) for inputs in selected])


def _expanded(inputs: Mapping[str, object] | NonTensorData | None, expansions: Expansions) -> dict[str, object] | None:
    from tensordict.tensorclass import NonTensorData

    inputs = inputs.data if isinstance(inputs, NonTensorData) else inputs
    return None if inputs is None else expanded_inputs(inputs, expansions)
