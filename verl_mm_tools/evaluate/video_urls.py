"""A prompt video as vLLM's OpenAI-compatible chat API reads it: the frames the loop sampled, with their times.

vLLM 0.24 reads a ``video_url`` data URL of media type ``video/jpeg`` as a frame sequence, base64 frames separated by
commas (``VideoMediaIO.load_base64`` in ``vllm/multimodal/media/video.py``), and decodes each with
``ImageMediaIO.load_bytes``, that is PIL, which takes a frame's format from its bytes: PNG frames arrive as the loop's
pixels, no server reads a file of ours. Their metadata, the source's ``fps``, the sampled ``frames_indices`` and
``total_num_frames``, comes from the request's ``media_io_kwargs["video"]`` (``num_frames`` the count sent: vLLM keeps
the first 32 otherwise) and reaches the HF processor inside vLLM (Qwen2.5-VL through this package's vLLM plugin,
``adaptations/vllm_plugin/video_metadata.py``), which derives each frame's time (index / fps) and the video's
``second_per_grid_ts`` from it, as the trainer's processor does. Any other data-URL type is a video file that vLLM's
loader decodes and samples again itself, at times of its own choosing: never sent.

The frames arrive exact but as 8-bit pixels, where the trainer's processor gets qwen-vl-utils' float frames: where the
model's processor resizes them (qwen-vl-utils sampled them at another size than the processor's grid), it rounds the
8-bit resize and not the float one, and the endpoint's model would see other pixel values (up to 0.05 apart on the
tiny Qwen2.5-VL). ``check_endpoint_view`` compares both with the model's video processor and refuses such a video.

Refused by name (``ConfigError``): frames that are not whole numbers in 0..255 (PNG could not carry them), a video
without its metadata, videos of one prompt sampled differently (a request has one ``media_io_kwargs``), and frames
the processor resizes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from verl_mm_tools.errors import ConfigError

MEDIA_TYPE = "video/jpeg"  # vLLM's frame-sequence type; each frame's own bytes say PNG
METADATA_KEYS = ("fps", "frames_indices", "total_num_frames")  # what the processor reads of qwen-vl-utils' metadata


def video_data_url(video: Any) -> str:
    """The data URL of one of verl's videos, a ``(frames, metadata)`` pair (frames T x C x H x W): its frames as
    lossless PNG, in order."""
    frames = frame_array(video)
    parts = []
    for frame in frames:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="PNG")
        parts.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return f"data:{MEDIA_TYPE};base64," + ",".join(parts)


def frame_array(video: Any) -> np.ndarray:
    """A video's frames as uint8 T x H x W x 3, exactly; refused where they are not whole numbers in 0..255."""
    frames, _ = _pair(video)
    array = frames.numpy() if hasattr(frames, "numpy") else np.asarray(frames)
    if array.ndim != 4 or array.shape[1] != 3:
        raise ConfigError(f"a prompt video's frames must be T x 3 x H x W (RGB), got shape {array.shape}")
    if not np.array_equal(array, np.clip(np.round(array), 0, 255)):
        raise ConfigError(
            f"a prompt video's frames hold values other than whole numbers in 0..255 (min {array.min()}, max "
            f"{array.max()}): PNG cannot carry them exactly, so eval does not send them to an endpoint"
        )
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)).astype(np.uint8)


def check_endpoint_view(video_processor: Any, video: Any) -> None:
    """Refuses a video whose 8-bit frames, as an endpoint decodes them, give other pixel values in the model's
    ``video_processor`` than the loop's own frames give the trainer."""
    frames, metadata = _pair(video)
    settings = {"do_sample_frames": False, "return_tensors": "pt"}
    trainer = video_processor(videos=[frames], video_metadata=[dict(metadata)], **settings)
    sent = video_processor(videos=[frame_array(video)], video_metadata=[dict(metadata)], **settings)
    difference = float((trainer["pixel_values_videos"] - sent["pixel_values_videos"]).abs().max())
    if difference > 0:
        grid = trainer["video_grid_thw"][0].tolist()
        raise ConfigError(
            f"a prompt video's {tuple(frames.shape[-2:])} px frames (height, width) are resized by the model's "
            f"processor (to a grid of {grid} patches): from the 8-bit frames an endpoint decodes it computes other "
            f"pixel values than from the loop's float frames (up to {difference:.3g} apart), so the endpoint's model "
            "would not see what training sees. Sample the videos at the processor's size (the video entries' "
            "min_pixels / max_pixels, or resized_height / resized_width), or evaluate with --checkpoint"
        )


def video_io_kwargs(videos: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The request's ``media_io_kwargs`` for its videos: their frame count and sampling metadata, which must be one
    for all of them."""
    settings = [_settings(video, number) for number, video in enumerate(videos, start=1)]
    if any(each != settings[0] for each in settings[1:]):
        raise ConfigError(
            "vLLM's chat API takes one media_io_kwargs per request, for all its videos, and this prompt's videos were "
            f"sampled differently ({settings}): an endpoint would see other frame times than the loop; evaluate "
            "prompts with one video, or videos sampled alike, at an endpoint (or use --checkpoint)"
        )
    return {"video": settings[0]}


def _settings(video: Any, number: int) -> dict[str, Any]:
    frames, metadata = _pair(video)
    missing = [key for key in METADATA_KEYS if metadata.get(key) is None]
    if missing:
        raise ConfigError(
            f"prompt video {number}'s metadata lacks {missing} (got {sorted(metadata)}): without them an endpoint "
            "samples its own frame times; load videos as verl's dataset does (qwen-vl-utils with metadata)"
        )
    indices = [int(index) for index in metadata["frames_indices"]]
    if len(indices) != len(frames):
        raise ConfigError(
            f"prompt video {number} holds {len(frames)} frames but its metadata indexes {len(indices)}: {indices}"
        )
    return {
        "num_frames": len(indices),
        "fps": float(metadata["fps"]),
        "frames_indices": indices,
        "total_num_frames": int(metadata["total_num_frames"]),
    }


def _pair(video: Any) -> tuple[Any, dict[str, Any]]:
    if not (isinstance(video, (tuple, list)) and len(video) == 2 and isinstance(video[1], dict)):
        raise ConfigError(
            f"a prompt video reaches eval as verl's (frames, metadata) pair; got a {type(video).__name__}: load "
            "videos as verl's dataset does (qwen-vl-utils with return_video_metadata)"
        )
    return video[0], video[1]
