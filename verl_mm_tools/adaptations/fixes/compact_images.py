"""Every run with images whose family has a compact form (issue #59): a training sample carries its images as their
resized uint8 pixels (``compact_image.CompactImages``, under the ``vmt_compact_*`` keys of ``multi_modal_inputs``, 1
byte per byte) in place of the float ``pixel_values`` (4 to 8 bytes per byte), from the agent-loop worker
(``fixes/processed_images.py``) to the trainer. Every engine of verl 0.9.1 (FSDP, Megatron, TorchTitan, Automodel)
reads a micro-batch's ``multi_modal_inputs`` through ``verl.utils.model.extract_multi_modal_inputs``: the fix expands
each selected sample's compact images there, just before the forward, into what verl's own processor pass would have
given it (tensor for tensor), and verl's function then joins the micro-batch as before. An image that several samples
of the micro-batch show is expanded once (by content). On the v1 trainer a sample may refer to an image another sample
of its prompt group carries (``compact_image.ImageRef``, ``fixes/shared_images.py``): ``ReferredImages`` reads those
its micro-batch does not carry from TransferQueue, in one read. A prompt video's compact form (``compact_video``:
its uint8 frames, or a ``VideoRef`` to the sample of its group that carries them) is expanded there too. A sample
whose compact images cannot be expanded exactly, or whose referred image cannot be read or is another, stops the
step with ``CompactImageError`` naming it; samples without compact images pass unchanged."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.compact_form import CompactImageError, Content, Expansions, ImageRef, content_key
from verl_mm_tools.compact_image import CompactImages, expanded_inputs
from verl_mm_tools.compact_video import CompactVideos, VideoRef

# the images read from TransferQueue kept in a trainer worker (1 byte a pixel: 350 images of 1024 px), so the step's
# later forwards (old log-probs, reference, update) read none again
READ_BUDGET_BYTES = 1 << 30

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
    "then runs verl's function (each distinct image once per micro-batch; an image a sample refers to, "
    "`compact_image.ImageRef`, read from the sample of its group that carries it in TransferQueue); a compact form "
    "that is malformed, refers to an image that cannot be read, or expands to other grids than the sample's stops "
    "the step naming the sample; prompt videos' compact forms (`compact_video`: uint8 frames, the video processor's "
    "call again) likewise",
    why="verl carries every image from the rollout to the trainer as float processor outputs: 8x its bytes for "
    "Qwen-VL and GLM-V (two float32 frames), in the worker, through TransferQueue or the DataProto, and in the "
    "trainer's batch; the float values are a pure function of the resized pixels (issue #59)",
    applies_to=VERL,
    proof="`tests/agent_loop/test_image_features_on_cpu.py::"
    "test_per_turn_samples_take_verls_inputs_with_each_image_processed_once` (every family: what the fixed "
    "function gives equals verl's own pass through verl's own function, tensor for tensor); "
    "`tests/test_compact_image_on_cpu.py::test_verls_function_cannot_read_compact_images`; "
    "`tests/adaptations/test_shared_images_on_cpu.py` (referred images read from a real TransferQueue)",
)


@ADAPTATION.replaces(TARGET)
def extract_multi_modal_inputs(
    extract: Callable[..., dict[str, torch.Tensor | list[torch.Tensor]]],
    batch_data: Sequence[Mapping[str, object] | NonTensorData | None],
    indices: list[int] | None = None,
) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    selected = batch_data if indices is None else [batch_data[i] for i in indices if i < len(batch_data)]
    samples = [_plain(inputs) for inputs in selected]
    REFERRED.read_for(samples)
    expansions: Expansions = {}  # an image that several of the micro-batch's samples show is expanded once
    return extract([None if each is None else expanded_inputs(each, expansions, REFERRED) for each in samples])


def _plain(inputs: Mapping[str, object] | NonTensorData | None) -> Mapping[str, object] | None:
    from tensordict.tensorclass import NonTensorData

    return inputs.data if isinstance(inputs, NonTensorData) else inputs


class ReferredImages:
    """The images samples refer to (``compact_image.ImageRef``: the v1 trainer's samples, ``shared_images.py``), in
    the trainer worker's process: those its samples carried (held weakly: the batch holds them) and those read from
    the samples that carry them in TransferQueue (one read per partition and micro-batch; the latest kept up to
    ``budget`` bytes, so a later forward of the step reads none again)."""

    def __init__(self, budget: int = READ_BUDGET_BYTES) -> None:
        self._carried: weakref.WeakValueDictionary[Content, torch.Tensor] = weakref.WeakValueDictionary()
        self._read: OrderedDict[Content, torch.Tensor] = OrderedDict()
        self._budget = budget
        self.reads = 0  # TransferQueue reads, and the images they gave
        self.images_read = 0

    def read_for(self, samples: list[Mapping[str, object] | None]) -> None:
        """Note the images (and videos' frames) ``samples`` carry; read those they refer to that this process has not
        seen."""
        missing: dict[Content, tuple[ImageRef, str]] = {}
        for inputs in samples:
            for sample, tensors in _carried_and_referred(inputs):
                for each in tensors:
                    if isinstance(each, ImageRef):
                        missing.setdefault(each.content, (each, sample))
                    else:
                        self._carried[content_key(each)] = each
        wanted = [pair for content, pair in missing.items() if self._held(content) is None]
        for partition in sorted({ref.partition for ref, _ in wanted}):
            self._read_from(partition, [pair for pair in wanted if pair[0].partition == partition])

    def _read_from(self, partition: str, wanted: list[tuple[ImageRef, str]]) -> None:
        import transfer_queue as tq

        keys = sorted({ref.key for ref, _ in wanted})
        try:
            data = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["multi_modal_inputs"])
        except Exception as error:  # TransferQueue's own errors: a key it does not hold, no client, a dead unit
            samples = sorted({sample for _, sample in wanted})
            raise CompactImageError(
                f"samples {samples} refer to images of the samples {keys} in TransferQueue's partition "
                f"{partition!r}, which could not be read ({type(error).__name__}: {error}); they are not trained on"
            ) from error
        self.reads += 1
        carriers = dict(zip(keys, (_plain(each) for each in data["multi_modal_inputs"]), strict=True))
        for ref, sample in wanted:
            pixels = _carried_by(carriers[ref.key], ref)
            if pixels is None or content_key(pixels) != ref.content:
                raise CompactImageError(f"sample {sample} refers to {ref}, which does not carry that image")
            self._keep(ref.content, pixels)

    def _keep(self, content: Content, pixels: torch.Tensor) -> None:
        self.images_read += 1
        self._read[content] = pixels
        while sum(each.numel() for each in self._read.values()) > self._budget and len(self._read) > 1:
            self._read.popitem(last=False)

    def _held(self, content: Content) -> torch.Tensor | None:
        pixels = self._carried.get(content)
        if pixels is None and content in self._read:
            self._read.move_to_end(content)
            pixels = self._read[content]
        return pixels

    def __call__(self, ref: ImageRef) -> torch.Tensor:
        pixels = self._held(ref.content)
        if pixels is None:
            raise CompactImageError(f"{ref} was not read with the micro-batch that refers to it")
        return pixels


REFERRED = ReferredImages()  # one per trainer worker process


def _carried_and_referred(inputs: Mapping[str, object] | None) -> list[tuple[str, Sequence[torch.Tensor | ImageRef]]]:
    """A sample's compact images and videos' frames, each carried (a tensor) or referred to, with its name."""
    images = None if inputs is None else CompactImages.from_inputs(inputs)
    videos = None if inputs is None else CompactVideos.from_inputs(inputs)
    found: list[tuple[str, Sequence[torch.Tensor | ImageRef]]] = []
    if images is not None:
        found.append((images.header.sample, images.pixels))
    if videos is not None:
        found.append((videos.header.sample, videos.frames))
    return found


def _carried_by(carrier: Mapping[str, object] | None, ref: ImageRef) -> torch.Tensor | None:
    """The tensor ``ref`` names in the carrier's inputs: its image, or its video's frames (``VideoRef``)."""
    tensors: Sequence[torch.Tensor | ImageRef] = ()
    if carrier is not None and isinstance(ref, VideoRef):
        videos = CompactVideos.from_inputs(carrier)
        tensors = () if videos is None else videos.frames
    elif carrier is not None:
        images = CompactImages.from_inputs(carrier)
        tensors = () if images is None else images.pixels
    found = tensors[ref.image] if ref.image < len(tensors) else None
    return None if isinstance(found, ImageRef) else found
