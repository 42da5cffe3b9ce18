"""The context window of ``keep_last_images``: which images a render leaves out, and the note in each one's place."""

from __future__ import annotations

import pytest

from verl_mm_tools.image_window import images_left_out, out_of_context_note, windowed

CONVERSATION = [
    {"role": "user", "content": [{"type": "image", "image": "a"}, {"type": "text", "text": "Click OK."}]},
    {"role": "assistant", "content": "click"},
    {"role": "tool", "content": [{"type": "image", "image": "b"}, {"type": "text", "text": "Image 2: the page."}]},
    {"role": "assistant", "content": "type"},
    {"role": "tool", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Images 3, 4."}]},
]


def test_images_left_out():
    assert [images_left_out(n, 2) for n in range(5)] == [0, 0, 0, 1, 2]
    assert images_left_out(9, None) == 0


def test_the_first_images_become_notes_in_the_templates_order():
    result = windowed(CONVERSATION, 3)
    assert result[0]["content"] == [
        {"type": "text", "text": "(Image 1 is no longer shown.)"},
        {"type": "text", "text": "Click OK."},
    ]
    assert result[2]["content"][0] == {"type": "text", "text": out_of_context_note(2)}
    assert result[4]["content"][:2] == [{"type": "text", "text": "(Image 3 is no longer shown.)"}, {"type": "image"}]
    assert result[1] is CONVERSATION[1] and CONVERSATION[0]["content"][0]["image"] == "a"  # the input is untouched


def test_nothing_left_out_is_the_conversation_itself_and_too_many_is_an_error():
    assert windowed(CONVERSATION, 0) is CONVERSATION
    with pytest.raises(ValueError, match="the conversation holds 4 images, fewer than the 5 to leave out"):
        windowed(CONVERSATION, 5)
