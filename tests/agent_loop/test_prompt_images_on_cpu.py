"""Which prompts are checked on the event loop (few small PIL images) and which in a worker thread (anything to
decode or read, or many pixels); both give the same safe messages."""

from __future__ import annotations

from PIL import Image

from verl_mm_tools.agent_loop.prompt_images import INLINE_MAX_PIXELS, cheap_to_check, safe_messages
from verl_mm_tools.data.common import png_bytes
from verl_mm_tools.files import FileRoots


def prompt(*images) -> list[dict]:
    content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": "what is it?"}]
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]


def test_small_pil_images_are_cheap_anything_else_is_not():
    side = int(INLINE_MAX_PIXELS**0.5)
    assert INLINE_MAX_PIXELS == 512 * 512
    assert cheap_to_check(prompt()) and cheap_to_check(prompt(Image.new("RGB", (side, side))))
    assert cheap_to_check(prompt(Image.new("L", (256, 512)), Image.new("RGB", (256, 512))))  # 512*512 in all
    assert not cheap_to_check(prompt(Image.new("RGB", (256, 512)), Image.new("RGB", (257, 512))))
    assert not cheap_to_check(prompt(png_bytes(Image.new("RGB", (8, 8)))))  # bytes to decode
    assert not cheap_to_check(prompt("/data/picture.png"))  # a file to read


def test_both_paths_give_rgb_images_of_the_same_pixels():
    gray = Image.new("L", (30, 20), 77)
    inline = safe_messages(prompt(gray), FileRoots(()), "0")
    decoded = safe_messages(prompt(png_bytes(gray)), FileRoots(()), "0")
    for messages in (inline, decoded):
        image = messages[1]["content"][0]["image"]
        assert image.mode == "RGB" and image.size == (30, 20) and image.getpixel((3, 4)) == (77, 77, 77)
    assert inline[0] == {"role": "system", "content": "be brief"}
