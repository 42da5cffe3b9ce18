"""GUI actions drawn on the screenshot they acted on: a dump of a MiniWoB-shaped conversation (168x224 screenshots,
``click``/``type``/``press``/``scroll`` calls, records made by the real ``build_record``) through the real site
builder; the exact HTML of each marker and caption, hostile arguments escaped or left undrawn, and in headless Chromium
each marker's rendered centre on its click point within 1 px at several display sizes."""

from __future__ import annotations

import json
import math
import threading

import pytest
from PIL import Image, ImageDraw

from verl_mm_tools.record import RECORD_FILE, build_record, sample_ids
from verl_mm_tools.viewer.gui_actions import acted_on_images
from verl_mm_tools.viewer.html import trajectory_page
from verl_mm_tools.viewer.site import build_site, make_server

SCREEN = (168, 224)  # the tiny model's screenshot size
HOSTILE = "</div><script>alert(1)</script>\"'&"
HOSTILE_SHOWN = "&lt;/div&gt;&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27;&amp;"
# (message position, call position, image, x, y): the markers the dump's page must draw
MARKERS = [(1, 0, 1, 84, 56), (7, 0, 3, 10, 20), (7, 1, 4, 30.5, 200)]


def screenshot(button: tuple[int, int]) -> Image.Image:
    """A white page with a black 3x3 px button centred on ``button``."""
    image = Image.new("RGB", SCREEN, (255, 255, 255))
    ImageDraw.Draw(image).rectangle([button[0] - 1, button[1] - 1, button[0] + 1, button[1] + 1], fill=(0, 0, 0))
    return image


def call(name: str, **arguments: object) -> dict:
    """An assistant tool call as the loop's messages hold it: arguments as the JSON text the model wrote."""
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def answer(text: str, image: Image.Image | None = None) -> dict:
    content = [{"type": "image", "image": image}, {"type": "text", "text": text}] if image else text
    return {"role": "tool", "content": content}


def gui_conversation() -> list[dict]:
    """Reset screenshot (Image 1); click on it; type; an off-image click; press; then two calls in one turn, the
    second acting on the screenshot the first one's answer brought (Image 4)."""
    pages = [screenshot(point) for point in [(84, 56), (90, 100), (10, 20), (30, 200), (120, 60)]]
    return [
        {"role": "user", "content": [{"type": "image", "image": pages[0]}, {"type": "text", "text": "Task: click"}]},
        {"role": "assistant", "content": "", "tool_calls": [call("click", x=84, y=56)]},
        answer("Image 2: the page after clicking at (84, 56).", pages[1]),
        {"role": "assistant", "content": "", "tool_calls": [call("type", text=HOSTILE)]},
        answer("Image 3: the page after typing '...'.", pages[2]),
        {"role": "assistant", "content": "", "tool_calls": [call("click", x=200, y=12)]},
        answer("Error from click: the point (200, 12) is off the screenshot, which is 168x224 px"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("click", x=10, y=20), call("scroll", x=30.5, y=200, direction="down")],
        },
        answer("Image 4: the page after clicking at (10, 20).", pages[3]),
        answer("Image 5: the page after scrolling down at (30.5, 200).", pages[4]),
        {"role": "assistant", "content": "", "tool_calls": [call("press", key="Enter")]},
        answer("The task is over after pressing Enter: done (reward 1)."),
    ]


def write_record(dump_dir, *, sizes: bool = True) -> dict:
    """One published trajectory (``step_000001/<id>/``: the record and its image files); ``sizes=False`` drops the
    images' sizes from the record (optional there), so the site reads them from the files."""
    record, pixels = build_record(
        messages=gui_conversation(), images=[], samples=[], turns=[], extra_fields={}, sample=sample_ids({"index": 0})
    )
    record["step"] = 1
    folder = dump_dir / "step_000001" / record["id"]
    (folder / "images").mkdir(parents=True)
    for entry, image in zip(record["images"], pixels, strict=True):
        entry["file"] = f"images/{entry['id']}.png"
        image.save(folder / entry["file"])
        if not sizes:
            entry["width"] = entry["height"] = None
    (folder / RECORD_FILE).write_text(json.dumps(record), encoding="utf-8")
    return record


@pytest.fixture(scope="module")
def gui_site(tmp_path_factory):
    """The site of a dump with the GUI trajectory twice: with image sizes in the record, and without."""
    dump = tmp_path_factory.mktemp("gui") / "dump"
    sized, unsized = write_record(dump), write_record(dump, sizes=False)
    site = build_site(dump)
    return site, sized, unsized


def marker_html(trajectory_id: str, image_id: int, left: str, top: str, caption: str) -> str:
    src = f"../img/{trajectory_id}/images/{image_id}.png"
    name = caption.split()[0]
    return (
        f'<div class="action"><div class="shot"><img src="{src}" alt="Image {image_id}: the {name} point">'
        f'<span class="marker {name}" style="left:{left}%;top:{top}%"></span></div>'
        f'<div class="action-note">{caption}</div></div>'
    )


def test_the_record_holds_the_calls_the_model_wrote(gui_site):
    _, record, _ = gui_site
    calls = [(call["name"], call["arguments"]) for call in record["tool_calls"]]
    assert calls[0] == ("click", {"x": 84, "y": 56}) and calls[1] == ("type", {"text": HOSTILE})
    assert [image["width"] for image in record["images"]] == [168] * 5


def test_each_call_acts_on_the_latest_image_before_it_an_earlier_calls_answer_included(gui_site):
    _, record, _ = gui_site
    assert acted_on_images(record["messages"]) == {1: {0: 1}, 3: {0: 2}, 5: {0: 3}, 7: {0: 3, 1: 4}, 10: {0: 5}}


@pytest.mark.parametrize("which", [1, 2], ids=["sizes-in-record", "sizes-from-files"])
def test_a_click_or_scroll_is_a_marker_at_its_point_in_percent_of_the_image(gui_site, which):
    site = gui_site[0]
    trajectory_id = gui_site[which]["id"]
    html = site.pages[trajectory_id].read_text(encoding="utf-8")
    assert marker_html(trajectory_id, 1, "50", "25", "click at (84, 56) on Image 1") in html
    assert marker_html(trajectory_id, 3, "5.952", "8.929", "click at (10, 20) on Image 3") in html
    assert marker_html(trajectory_id, 4, "18.155", "89.286", "scroll down at (30.5, 200) on Image 4") in html
    assert html.count('class="marker ') == 3


def test_a_point_off_the_image_is_said_in_words_never_drawn(gui_site):
    site, record, _ = gui_site
    html = site.pages[record["id"]].read_text(encoding="utf-8")
    off = (
        '<div class="action off-image"><div class="action-note">click at (200, 12): off the image (Image 3 is '
        "168×224 px)</div></div>"
    )
    assert off in html and html.count("off the image") == 1


def test_typed_text_and_pressed_keys_are_shown_under_their_screenshot_escaped(gui_site):
    site, record, _ = gui_site
    trajectory_id = record["id"]
    html = site.pages[trajectory_id].read_text(encoding="utf-8")
    typed = (
        f'<div class="action"><div class="shot"><img src="../img/{trajectory_id}/images/2.png" alt="Image 2: what '
        f'type acted on"></div><div class="action-note">typed <code>{HOSTILE_SHOWN}</code> on Image 2</div></div>'
    )
    pressed = '<div class="action-note">pressed <kbd>Enter</kbd> on Image 5</div>'
    assert typed in html and pressed in html
    assert "<script>alert(1)" not in html and html.count("<script") == 0  # the trajectory page runs no script


def page_of(messages: list[dict], images: list[dict], image_base: str | None = "img") -> str:
    record = {"id": "abc", "messages": messages, "images": images}
    return trajectory_page(record, image_base, "index.html", (None, None))


def clicked(arguments: object, name: object = "click") -> str:
    """The page of one call on one 168x224 image."""
    messages = [
        {"role": "user", "turn": 0, "text": "Task", "image_ids": [1]},
        {
            "role": "assistant",
            "turn": 1,
            "text": "",
            "image_ids": [],
            "tool_calls": [{"name": name, "arguments": arguments}],
        },
    ]
    image = {"id": 1, "source": "prompt", "turn": 0, "width": SCREEN[0], "height": SCREEN[1], "file": "images/1.png"}
    return page_of(messages, [image])


@pytest.mark.parametrize(
    "arguments",
    [
        {"x": math.nan, "y": 5},
        {"x": math.inf, "y": 5},
        {"x": True, "y": 5},
        {"x": "84", "y": "56"},
        {"x": None, "y": 5},
        {"x": [1], "y": 5},
        {"y": 5},
        '{"x": 84, "y": 56',  # not JSON: the raw text the model wrote
        None,
    ],
    ids=["nan", "inf", "bool", "strings", "null", "list", "missing", "raw-text", "none"],
)
def test_a_point_that_is_no_finite_number_is_never_drawn(arguments):
    html = clicked(arguments)
    assert 'class="action' not in html and 'class="marker' not in html


@pytest.mark.parametrize(
    ("x", "y", "shown"),
    [(-1, 5, "(-1, 5)"), (168, 5, "(168, 5)"), (5, 224, "(5, 224)"), (10**30, 5, "(10000000000…, 5)")],
    ids=["negative", "right-edge", "bottom-edge", "huge"],
)
def test_points_off_the_image_by_the_tools_own_bounds(x, y, shown):
    html = clicked({"x": x, "y": y})
    assert f"click at {shown}: off the image (Image 1 is 168×224 px)" in html and 'class="marker' not in html


def test_the_last_pixel_is_on_the_image():
    assert 'style="left:99.94%;top:99.955%"' in clicked({"x": 167.9, "y": 223.9})


def test_a_hostile_direction_or_key_is_escaped():
    assert "scroll &lt;b&gt; at (1, 2) on Image 1" in clicked({"x": 1, "y": 2, "direction": "<b>"}, "scroll")
    assert "pressed <kbd>&lt;/kbd&gt;&lt;img src=x&gt;</kbd> on Image 1" in clicked(
        {"key": "</kbd><img src=x>"}, "press"
    )


def test_other_tools_and_calls_with_no_image_before_them_draw_nothing():
    assert 'class="action' not in clicked({"x": 1, "y": 2}, "rotate")
    assert 'class="action' not in clicked({"x": 1, "y": 2}, ["click"])  # a name that is no string
    assert 'class="action' not in clicked({"text": 5}, "type")  # typed text must be a string
    no_image = [{"role": "assistant", "turn": 1, "text": "", "tool_calls": [{"name": "click", "arguments": {"x": 1}}]}]
    assert 'class="action' not in page_of(no_image, [])


def test_without_pixels_or_size_the_action_is_words_only():
    messages = [
        {"role": "user", "turn": 0, "text": "Task", "image_ids": [1]},
        {"role": "assistant", "turn": 1, "text": "", "tool_calls": [{"name": "click", "arguments": {"x": 1, "y": 2}}]},
    ]
    image = {"id": 1, "source": "prompt", "turn": 0, "width": 168, "height": 224, "file": "images/1.png"}
    assert "click at (1, 2) on Image 1 (pixels not dumped)</div>" in page_of(messages, [image], None)
    unsized = {**image, "width": None, "height": None}
    assert "click at (1, 2) on Image 1 (its size is unknown)</div>" in page_of(messages, [unsized])


def test_a_lone_surrogate_in_typed_text_does_not_break_the_site(tmp_path):
    record = write_record(tmp_path / "dump")
    path = next((tmp_path / "dump").glob(f"step_000001/*/{RECORD_FILE}"))
    path.write_text(path.read_text(encoding="utf-8").replace(json.dumps(HOSTILE)[1:-1], "\\ud800"), encoding="utf-8")
    site = build_site(tmp_path / "dump", tmp_path / "site")
    assert "typed <code>?</code> on Image 2" in site.pages[record["id"]].read_text(encoding="utf-8")


# ----- in a real browser ----------------------------------------------------------------------------------------

MARKER_OFFSETS = """
Array.from(document.querySelectorAll('.action .shot')).filter(shot => shot.querySelector('.marker')).map(shot => {
  const img = shot.querySelector('img'), box = img.getBoundingClientRect();
  const mark = shot.querySelector('.marker').getBoundingClientRect();
  return [img.complete && img.naturalWidth, img.naturalHeight, box.width, box.height,
          mark.x + mark.width / 2 - box.x, mark.y + mark.height / 2 - box.y];
})
"""


@pytest.fixture(scope="module")
def gui_site_url(gui_site):
    server = make_server(gui_site[0].index.parent, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("display_width", [None, 336, 100], ids=["natural", "twice", "shrunk"])
def test_each_marker_is_drawn_on_its_click_point_within_a_pixel(browser, gui_site_url, gui_site, display_width):
    trajectory_id = gui_site[1]["id"]
    page = browser.open(f"{gui_site_url}t/{trajectory_id}.html")
    if display_width is not None:  # the picture shown at another size: the markers must follow it
        page.evaluate(
            "document.querySelectorAll('.action .shot img').forEach(img => {"
            f" img.style.maxWidth = 'none'; img.style.maxHeight = 'none'; img.style.width = '{display_width}px'; }})"
        )
    found = page.evaluate(MARKER_OFFSETS)
    assert len(found) == len(MARKERS)
    for (natural_width, natural_height, width, height, left, top), (*_, x, y) in zip(found, MARKERS, strict=True):
        assert (natural_width, natural_height) == SCREEN
        assert width == pytest.approx(display_width or SCREEN[0], abs=0.01)
        assert abs(left - x * width / natural_width) <= 1 and abs(top - y * height / natural_height) <= 1


def test_the_gui_trajectory_page_screenshot(browser, gui_site_url, gui_site, keep_screenshot):
    page = browser.open(f"{gui_site_url}t/{gui_site[1]['id']}.html")
    loaded = page.evaluate("Array.from(document.querySelectorAll('.action img')).map(img => img.naturalWidth)")
    assert loaded == [168] * 5  # click, type, the two calls of one turn, press (the off-image click: words only)
    keep_screenshot(page, "viewer-gui-actions.png")
