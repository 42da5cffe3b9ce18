"""The images a conversation keeps in the model's context (the mm_tool option ``keep_last_images``).

Screenshots and crops pile up over a long trajectory. With ``keep_last_images: K`` the chat template renders only
the trajectory's last K images; each earlier one becomes a short text note naming its id in its place, so the model
still knows it existed (and a tool can still take it by id: it stays in the trajectory's workspace). The loop, the
record and ``rescore`` apply the same rewrite (``windowed``), so each training sample is the context the model saw.
Pure: no verl, no PIL.
"""

from __future__ import annotations


def out_of_context_note(image_id: int) -> str:
    """What stands in the context where image ``image_id`` (1-based, the id tools use) was."""
    return f"(Image {image_id} is no longer shown.)"


def images_left_out(images: int, keep_last: int | None) -> int:
    """How many of a conversation's first ``images`` the window leaves out (0 without a window)."""
    return max(0, images - keep_last) if keep_last else 0


def windowed(messages: list[dict], left_out: int) -> list[dict]:
    """``messages`` with their first ``left_out`` image parts, in the order the chat template renders them (the
    order of the trajectory's images), replaced by a text note each; the messages themselves are not changed."""
    if left_out <= 0:
        return messages
    seen = 0
    result = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            result.append(message)
            continue
        parts = []
        for part in content:
            if _is_image_part(part):
                seen += 1
                if seen <= left_out:
                    part = {"type": "text", "text": out_of_context_note(seen)}
            parts.append(part)
        result.append({**message, "content": parts})
    if seen < left_out:
        raise ValueError(f"the conversation holds {seen} images, fewer than the {left_out} to leave out")
    return result


def _is_image_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"
