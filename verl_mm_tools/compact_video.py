"""A prompt video's compact form (issue #61; the images' is ``compact_image``): the frames its video processor was
called with, as uint8, in place of the float ``pixel_values_videos`` the call returned.

verl loads a prompt's videos with qwen-vl-utils, which decodes, samples and resizes the frames and hands them on as
float32 tensors of whole numbers (0-255); the agent-loop worker's processor pass then turns them into float32
``pixel_values_videos``, 4 bytes per frame byte on every family, which verl carries to the trainer. The output is a
pure function of the video processor's input and its call's keyword arguments (the frames' sampling metadata
included), so a sample can carry the frames as uint8 (1 byte per byte, exact: checked) and the call's arguments, and
the trainer's process runs the same video processor's call on them again: the same tensors
(``tests/test_compact_video_on_cpu.py``). ``VideoCallRecorder`` records the call inside the worker's own processor
pass (``adaptations/fixes/processed_images.py``); ``expanded_videos`` is the trainer's side
(``compact_image.expanded_inputs`` runs it first).

The compact form is carried only where it is smaller than the float output: a video processor that shrinks the
frames (a processor configured with smaller bounds than the dataset's video entries) makes the float output the
smaller, exact form. Frames that are not whole numbers in 0-255 (no qwen-vl-utils source) keep the float output too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl_mm_tools.compact_form import (
    VIDEO_PIXELS,
    CompactImageError,
    Expansions,
    ImageRef,
    NotCompactable,
    ProcessorSpec,
    Resolve,
    SharedPixels,
    carried_bytes,
    content_key,
    described,
    entries,
    entry_names,
    json_fields,
    json_tensor,
    resolved,
)

if TYPE_CHECKING:
    import torch

VIDEO_PREFIX = "vmt_video_"  # the keys of a sample's compact videos in its ``multi_modal_inputs``
VIDEO_HEADER_KEY = f"{VIDEO_PREFIX}header"
FRAMES_KEY = f"{VIDEO_PREFIX}frames_"  # + the video's index in the sample
REF_KEY = f"{VIDEO_PREFIX}ref_"  # + the video's index: where another sample carries it (``VideoRef``)

# the video processors whose call is rebuilt from their config in the trainer's process: a header is data from
# another process, never a way to import anything else
VIDEO_PROCESSORS = frozenset({"Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor", "Glm4vVideoProcessor"})
FRAME_DTYPES = ("torch.float32", "torch.uint8")  # what qwen-vl-utils hands the processor; what a caller may
GRID_KEY = "video_grid_thw"

SHARED_FRAMES = SharedPixels()  # a worker's trajectories of one prompt decode its video each: carried once


@dataclass
class VideoCall:
    """One call of a video processor: its frames (one tensor per video), its other keyword arguments and how many
    positional arguments it had besides the frames (a call with any is not rebuilt)."""

    videos: list[Any]
    arguments: dict[str, Any]
    positional: int = 0


class VideoCallRecorder:
    """A video processor that records the calls made to it and answers them as the processor does (its other
    attributes are the processor's)."""

    def __init__(self, video_processor: Any) -> None:
        self.video_processor = video_processor
        self.calls: list[VideoCall] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.video_processor, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        videos = kwargs["videos"] if "videos" in kwargs else args[0] if args else None
        arguments = {key: value for key, value in kwargs.items() if key != "videos"}
        positional = len(args) - (0 if "videos" in kwargs else 1)
        self.calls.append(
            VideoCall(list(videos) if isinstance(videos, list | tuple) else [videos], arguments, positional)
        )
        return self.video_processor(*args, **kwargs)


@dataclass(frozen=True)
class VideoHeader:
    """What a sample's compact videos share: the video processor, the call's other arguments, the frames' dtype
    when the processor saw them, and the sample's name (its row's index or uid, for errors)."""

    processor: ProcessorSpec
    arguments: Mapping[str, Any]
    dtype: str
    sample: str = "<unknown>"

    @functools.cached_property
    def tensor(self) -> torch.Tensor:
        fields = {"processor": self.processor.class_name, "config": self.processor.config, "dtype": self.dtype}
        try:
            return json_tensor({**fields, "arguments": dict(self.arguments), "sample": self.sample})
        except TypeError as error:
            raise NotCompactable(f"the video processor's arguments are not JSON ({error}): {self.arguments}") from error

    @classmethod
    def parse(cls, tensor: object) -> VideoHeader:
        kinds = {"processor": str, "config": str, "arguments": dict, "dtype": str, "sample": str}
        fields = json_fields(tensor, VIDEO_HEADER_KEY, kinds)
        if fields["dtype"] not in FRAME_DTYPES:
            raise CompactImageError(
                f"{VIDEO_HEADER_KEY}: the frames' dtype {fields['dtype']!r} is not one of {FRAME_DTYPES}"
            )
        spec = ProcessorSpec(fields["processor"], fields["config"])
        return cls(spec, fields["arguments"], fields["dtype"], fields["sample"])


class VideoRef(ImageRef):
    """A video a sample shows but does not carry: video ``image`` of the sample under ``key`` in TransferQueue's
    ``partition`` carries its frames (``agent_loop/shared_images.py``: a GRPO group's trajectories and per-turn
    samples show the same prompt video)."""

    def __str__(self) -> str:
        return f"video {self.image} of the sample {self.key!r} in TransferQueue's partition {self.partition!r}"


@dataclass(frozen=True)
class CompactVideos:
    """One training sample's videos, in order, each as its frames (frames, channels, height, width), uint8, or,
    where another sample carries them, as a ``VideoRef`` to it."""

    header: VideoHeader
    frames: tuple[torch.Tensor | VideoRef, ...]

    @property
    def nbytes(self) -> int:
        """The bytes of the frames it carries (a reference carries none)."""
        return carried_bytes(self.frames)

    def inputs(self) -> dict[str, torch.Tensor]:
        """The sample's ``multi_modal_inputs`` entries that carry them."""
        return {VIDEO_HEADER_KEY: self.header.tensor, **entries(self.frames, FRAMES_KEY, REF_KEY)}

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, Any]) -> CompactVideos | None:
        """The compact videos a sample's ``multi_modal_inputs`` carry; None where it carries none. Raises
        ``CompactImageError`` where they are malformed."""
        keys = sorted(key for key in inputs if isinstance(key, str) and key.startswith(VIDEO_PREFIX))
        if not keys:
            return None
        if VIDEO_HEADER_KEY not in inputs:
            raise CompactImageError(f"compact videos without their {VIDEO_HEADER_KEY}: {keys}")
        header = VideoHeader.parse(inputs[VIDEO_HEADER_KEY])
        names = entry_names(inputs, len(keys) - 1, FRAMES_KEY, REF_KEY)
        if not names or sorted(names) != [key for key in keys if key != VIDEO_HEADER_KEY]:
            raise CompactImageError(
                f"sample {header.sample}: its compact videos cannot be expanded: its keys are {keys}; expected "
                f"{VIDEO_HEADER_KEY} and, for each video i from 0, {FRAMES_KEY}i or {REF_KEY}i"
            )
        frames: list[torch.Tensor | VideoRef] = []
        for name in names:
            try:
                frames.append(
                    VideoRef.parse(inputs[name], name) if name.startswith(REF_KEY) else _checked(inputs[name], name)
                )
            except CompactImageError as error:
                raise CompactImageError(f"sample {header.sample}: {error}") from None
        return cls(header, tuple(frames))


def _checked(frames: object, name: str) -> torch.Tensor:
    problem = _malformed(frames)
    if problem:
        raise CompactImageError(f"{name} is {problem}")
    return frames  # type: ignore[return-value]  # a uint8 tensor: checked


def compacted(
    recorded: list[VideoCall], video_processor: Any, outputs: Mapping[str, Any], sample: str
) -> CompactVideos:
    """The compact form of the videos of one processor pass that made ``outputs``, its ``recorded`` video processor
    calls. Raises ``NotCompactable`` (keep the float output) where the call cannot be rebuilt exactly here or the
    compact form would not be smaller."""
    name = type(video_processor).__name__
    if name not in VIDEO_PROCESSORS:
        raise NotCompactable(
            f"the video processor {name} is not one this package rebuilds ({sorted(VIDEO_PROCESSORS)})"
        )
    if len(recorded) != 1:
        raise NotCompactable(f"{name} was called {len(recorded)} times in one processor pass")
    call = recorded[0]
    if call.positional or not call.videos:
        raise NotCompactable(
            f"{name} was called with {call.positional} positional arguments and {len(call.videos)} videos"
        )
    frames = tuple(SHARED_FRAMES.shared(_whole_bytes(each)) for each in call.videos)
    header = VideoHeader(ProcessorSpec.of(video_processor), call.arguments, str(call.videos[0].dtype), sample)
    if any(str(each.dtype) != header.dtype for each in call.videos):
        raise NotCompactable(f"{name} was called with frames of several dtypes")
    header.tensor  # noqa: B018  (raises NotCompactable for arguments that are not JSON)
    compact = CompactVideos(header, frames)
    carried = outputs[VIDEO_PIXELS]
    if compact.nbytes >= carried.numel() * carried.element_size():
        raise NotCompactable(f"the frames ({compact.nbytes} bytes) are no smaller than {name}'s output")
    return compact


def _whole_bytes(frames: object) -> torch.Tensor:
    """The frames as uint8 where that is exact (whole numbers in 0-255, (frames, channels, height, width))."""
    import torch

    if not isinstance(frames, torch.Tensor) or str(frames.dtype) not in FRAME_DTYPES or _malformed_shape(frames):
        raise NotCompactable(f"video frames of {described(frames)} are not (frames, channels, height, width) tensors")
    pixels = frames.to(torch.uint8)
    if frames.dtype != torch.uint8 and not torch.equal(pixels.to(frames.dtype), frames):
        raise NotCompactable("the video frames are not whole numbers in 0-255")
    return pixels.contiguous()


@functools.lru_cache(maxsize=8)
def video_processor(spec: ProcessorSpec) -> Any:
    """The video processor ``spec`` describes, built once per process (only the classes listed here)."""
    if spec.class_name not in VIDEO_PROCESSORS:
        raise CompactImageError(
            f"compact videos made by the video processor {spec.class_name!r}, which this package cannot rebuild "
            f"(known: {sorted(VIDEO_PROCESSORS)})"
        )
    import transformers

    return getattr(transformers, spec.class_name).from_dict(json.loads(spec.config))


def expanded_videos(
    inputs: Mapping[str, Any], expansions: Expansions | None = None, resolve: Resolve | None = None
) -> dict[str, Any]:
    """A sample's ``multi_modal_inputs`` with its compact videos expanded into ``pixel_values_videos`` as the worker's
    processor pass made it; inputs without compact videos as they are. ``expansions`` (shared by a batch's samples)
    expands the videos that several samples show (per-turn samples, a group's prompt) once; ``resolve`` gives the
    frames of a video the sample refers to (``VideoRef``). Raises ``CompactImageError`` (naming the sample) for a
    malformed form, a referred video that cannot be read or is another, or grids that disagree with the sample's."""
    compact = CompactVideos.from_inputs(inputs)
    rest = {key: value for key, value in inputs.items() if not str(key).startswith(VIDEO_PREFIX)}
    if compact is None:
        return rest
    sample = compact.header.sample
    if VIDEO_PIXELS in rest:
        raise CompactImageError(f"sample {sample}: it carries both compact videos and {VIDEO_PIXELS}")
    try:
        processor = video_processor(compact.header.processor)
    except CompactImageError as error:
        raise CompactImageError(f"sample {sample}: {error}") from None
    output = _expansion(processor, compact, {} if expansions is None else expansions, resolve)
    if GRID_KEY not in rest or not _equal(output.get(GRID_KEY), rest[GRID_KEY]):
        raise CompactImageError(
            f"sample {sample}: its compact videos expand to other {GRID_KEY} than its token ids were made with "
            f"({described(output.get(GRID_KEY))} against {described(rest.get(GRID_KEY))}); it is not trained on"
        )
    return {**rest, VIDEO_PIXELS: output[VIDEO_PIXELS]}


def _expansion(
    processor: Any, compact: CompactVideos, expansions: Expansions, resolve: Resolve | None
) -> dict[str, Any]:
    import torch

    arguments = json.dumps(dict(compact.header.arguments), sort_keys=True)
    contents = tuple(each.content if isinstance(each, VideoRef) else content_key(each) for each in compact.frames)
    key = (compact.header.processor, arguments, contents)
    if key not in expansions:
        dtype = getattr(torch, compact.header.dtype.removeprefix("torch."))
        sample = compact.header.sample
        frames = [resolved(each, resolve, sample) if isinstance(each, VideoRef) else each for each in compact.frames]
        videos = [each.to(dtype) for each in frames]
        try:
            output = processor(videos=videos, **compact.header.arguments)
        except Exception as error:  # the processor's own checks of arguments another process wrote
            raise CompactImageError(
                f"sample {compact.header.sample}: {type(processor).__name__} refused its compact videos' call: "
                f"{type(error).__name__}: {error}"
            ) from error
        expansions[key] = {name: value for name, value in output.items() if name in (VIDEO_PIXELS, GRID_KEY)}
    return expansions[key]


def _malformed(frames: object) -> str | None:
    import torch

    if not isinstance(frames, torch.Tensor) or frames.dtype != torch.uint8:
        return f"{described(frames)}, not a uint8 tensor (frames, channels, height, width)"
    return _malformed_shape(frames)


def _malformed_shape(frames: torch.Tensor) -> str | None:
    if frames.ndim != 4 or frames.shape[1] not in (1, 3) or min(frames.shape) < 1:
        return f"of shape {tuple(frames.shape)}; expected (frames >= 1, 1 or 3, height >= 1, width >= 1)"
    return None


def _equal(got: object, kept: object) -> bool:
    import torch

    return isinstance(got, torch.Tensor) and isinstance(kept, torch.Tensor) and torch.equal(got, kept.to(got.dtype))
