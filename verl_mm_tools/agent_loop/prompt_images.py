"""The prompt's images (and, through ``prompt_videos``, its videos), made safe before verl reads them.

verl hands a sample's messages to qwen_vl_utils, which opens any local path or fetches any URL it finds, decodes
without a size limit, and fails mid-batch on a truncated file or an aspect ratio over 200 with an error naming
neither the sample nor the image. Here each image entry (a PIL image, maybe lazily opened from the dataset's bytes; a
path or ``file://`` URL, read through the configured file roots; a ``data:`` URI; raw ``bytes``) becomes a decoded
RGB image (``verl_mm_tools.files.to_rgb``), or the sample is refused with an ``ImageInputError`` (or
``FileAccessError``) that names it and the image. verl then sizes the images as always (smart_resize).
"""

from __future__ import annotations

import base64
import binascii

from PIL import Image

from verl_mm_tools.agent_loop.prompt_videos import safe_video_item
from verl_mm_tools.errors import FileAccessError, ImageInputError
from verl_mm_tools.files import FileRoots, decode_image, loaded_rgb
from verl_mm_tools.video import is_video_entry

MAX_ASPECT_RATIO = 200
"""Qwen-VL processors (transformers and qwen_vl_utils) refuse more elongated images."""
INLINE_MAX_PIXELS = 512 * 512
"""Prompts whose images are all PIL images of at most this many pixels in total are checked on the event loop: a
worker-thread hop costs more than checking them (~0.2 ms per trajectory, see ``verl-mm-tools bench``)."""


def safe_messages(messages: list[dict], files: FileRoots, sample: str) -> list[dict]:
    """Copies of the messages whose image entries hold checked RGB images and whose video entries are checked
    (``prompt_videos``); the dataset's own are left untouched."""
    safe, number, videos = [], 0, 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            safe.append(message)
            continue
        items = []
        for item in content:
            if _is_image(item):
                number += 1
                item = _safe_item(item, files, f"sample {sample}, prompt image {number}")
            elif is_video_entry(item):
                videos += 1
                item = safe_video_item(
                    item,
                    files,
                    f"sample {sample}, prompt video {videos}",
                    lambda frame, name: safe_image(frame, files, name),
                )
            items.append(item)
        safe.append({**message, "content": items})
    return safe


def cheap_to_check(messages: list[dict]) -> bool:
    """Whether ``safe_messages`` may run on the event loop: no video, every image a PIL image, INLINE_MAX_PIXELS in
    all."""
    pixels = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for item in content if isinstance(content, list) else ():
            if is_video_entry(item):
                return False
            if _is_image(item):
                source = item.get("image")
                if not isinstance(source, Image.Image):
                    return False
                pixels += source.width * source.height
    return pixels <= INLINE_MAX_PIXELS


def _is_image(item: object) -> bool:
    """What qwen_vl_utils takes for an image entry."""
    if not isinstance(item, dict) or is_video_entry(item):
        return False
    return "image" in item or "image_url" in item or item.get("type") in ("image", "image_url")


def _safe_item(item: dict, files: FileRoots, name: str) -> dict:
    source = item.get("image", item.get("image_url"))
    if isinstance(source, dict):  # OpenAI style {"url": ...} or verl's {"bytes": ...}
        source = source.get("url", source.get("bytes"))
    if source is None:
        source = item.get("bytes")
    safe = {key: value for key, value in item.items() if key not in ("image_url", "bytes")}
    return {**safe, "type": "image", "image": safe_image(source, files, name)}


def safe_image(source: object, files: FileRoots, name: str) -> Image.Image:
    """An image, path or bytes as a decoded RGB image the Qwen-VL processors accept."""
    image = _decoded(source, files, name)
    width, height = image.size
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageInputError(
            f"{name}: {width}x{height} px is more elongated than the {MAX_ASPECT_RATIO}:1 Qwen-VL "
            "processors accept; crop or pad it in the dataset"
        )
    return image


def _decoded(source: object, files: FileRoots, name: str) -> Image.Image:
    if isinstance(source, Image.Image):
        return loaded_rgb(source, source=name)
    if isinstance(source, (bytes, bytearray)):
        return decode_image(bytes(source), source=name)
    if isinstance(source, str) and source.startswith("data:image"):
        return decode_image(_data_uri_bytes(source, name), source=name)
    if isinstance(source, str):
        try:
            return files.open_image(source)
        except FileAccessError as error:
            raise FileAccessError(f"{name}: {error}") from None
        except ImageInputError as error:
            raise ImageInputError(f"{name}: {error}") from None
    raise ImageInputError(f"{name}: expected an image, a path or bytes, got {type(source).__name__}")


def _data_uri_bytes(uri: str, name: str) -> bytes:
    header, _, data = uri.partition(",")
    if ";base64" not in header:
        raise ImageInputError(f"{name}: only base64 data: URIs are supported, got {header[:60]!r}")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImageInputError(f"{name}: the data: URI is not valid base64 ({error})") from None
