"""The generated site in a real headless Chromium, served on 127.0.0.1 by the viewer's server: the index lists every
trajectory, every image of every trajectory page loads, filters hide exactly the right rows, links work, and the page
loads nothing from anywhere else. Screenshots are kept as artifacts."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from verl_mm_tools.tiny.builder import BUILDER_VERSION
from verl_mm_tools.viewer.loading import load_trajectories

ROWS = "Array.from(document.querySelectorAll('#trajectories tbody tr'))"
VISIBLE_IDS = f"{ROWS}.filter(row => !row.hidden).map(row => row.dataset.id)"


@pytest.fixture(scope="module")
def trajectories(sample_dump):
    return {trajectory.id: trajectory for trajectory in load_trajectories(sample_dump)}


@pytest.fixture(scope="module")
def index(browser, site_url):
    return browser.open(site_url)


def set_control(page, control_id: str, value: str) -> None:
    """What a user's edit does to a filter control: a new value, then the input and change events."""
    page.evaluate(
        f"(() => {{ const control = document.getElementById({json.dumps(control_id)}); control.focus();"
        f" control.value = {json.dumps(value)};"
        " control.dispatchEvent(new Event('input', {bubbles: true}));"
        " control.dispatchEvent(new Event('change', {bubbles: true})); })()"
    )


def ids_where(trajectories, predicate) -> list[str]:
    return sorted(key for key, trajectory in trajectories.items() if predicate(trajectory.record))


def test_the_index_lists_every_trajectory_with_its_step_reward_and_link(index, trajectories, keep_screenshot):
    rows = index.evaluate(
        f"{ROWS}.map(row => [row.dataset.id, row.dataset.step, row.dataset.reward,"
        " row.querySelector('a').getAttribute('href'), row.hidden])"
    )
    assert sorted(row[0] for row in rows) == sorted(trajectories) and len(rows) == 8
    for trajectory_id, step, reward, link, hidden in rows:
        record = trajectories[trajectory_id].record
        assert (step, float(reward), link, hidden) == (
            str(record["step"]),
            record["reward"]["score"],
            f"t/{trajectory_id}.html",
            False,
        )
    assert index.evaluate("document.getElementById('shown').textContent") == "8"
    thumbnails = index.evaluate("Array.from(document.querySelectorAll('td.thumbs img')).map(img => img.naturalWidth)")
    assert len(thumbnails) == 2 * (1 + 1 + 1 + 3) and all(width > 0 for width in thumbnails)  # per step: 6 images
    keep_screenshot(index, "viewer-index.png")


def test_every_trajectory_page_shows_every_image_at_its_size(
    browser, site_url, trajectories, sample_site, keep_screenshot
):
    for trajectory_id, trajectory in trajectories.items():
        page = browser.open(f"{site_url}t/{trajectory_id}.html")
        shown = page.evaluate(
            "Array.from(document.querySelectorAll('#chat img')).map(img => "
            "[Number(img.dataset.imageId), img.complete, img.naturalWidth, img.naturalHeight])"
        )
        expected = [(image["id"], image["width"], image["height"]) for image in trajectory.record["images"]]
        assert [(image_id, width, height) for image_id, _, width, height in shown] == expected
        assert all(complete and width > 0 for _, complete, width, _ in shown)
        for image in trajectory.record["images"]:
            with Image.open(trajectory.folder / image["file"]) as png:
                assert png.size == (image["width"], image["height"])
        captions = page.evaluate("Array.from(document.querySelectorAll('#chat figcaption')).map(c => c.textContent)")
        assert [caption.split(" · ")[0] for caption in captions] == [f"Image {image_id}" for image_id, *_ in expected]
        if trajectory.record["tools_used"] == ["rotate"] and trajectory.record["step"] == 1:
            keep_screenshot(page, "viewer-trajectory.png")
            score = page.evaluate("document.getElementById('score').textContent")
            assert score == "1"
            turns = page.evaluate(
                "Array.from(document.querySelectorAll('#turns tbody tr')).map(row => row.cells[1].textContent)"
            )
            assert turns == [str(turn["trained_tokens"]) for turn in trajectory.record["turns"]]
            calls = page.evaluate("Array.from(document.querySelectorAll('.call b')).map(b => b.textContent)")
            assert calls == ["rotate", "rotate"]


@pytest.mark.parametrize(
    "control, value, predicate",
    [
        ("f-masked", "1", lambda record: record["masked"]),
        ("f-masked", "0", lambda record: not record["masked"]),
        ("f-step", "2", lambda record: record["step"] == 2),
        ("f-tool", "rotate", lambda record: "rotate" in record["tools_used"]),
        ("f-tool", "(none)", lambda record: not record["tools_used"]),
        ("f-reward-min", "0.5", lambda record: record["reward"]["score"] >= 0.5),
        ("f-reward-max", "0.5", lambda record: record["reward"]["score"] <= 0.5),
        ("f-turns-min", "2", lambda record: len(record["turns"]) >= 2),
        ("f-stop", "error", lambda record: record["stop_reason"] == "error"),
    ],
)
def test_each_filter_hides_exactly_the_rows_that_do_not_match(index, trajectories, control, value, predicate):
    index.click("#f-reset")
    set_control(index, control, value)
    expected = ids_where(trajectories, predicate)
    assert 0 < len(expected) < len(trajectories)  # the filter must discriminate in the sample
    assert sorted(index.evaluate(VISIBLE_IDS)) == expected
    assert index.evaluate("document.getElementById('shown').textContent") == str(len(expected))


def test_filters_combine_live_in_the_url_and_reset_by_a_click(browser, index, site_url, trajectories, keep_screenshot):
    index.click("#f-reset")
    set_control(index, "f-step", "1")
    set_control(index, "f-masked", "0")
    set_control(index, "f-turns-min", "2")
    expected = ids_where(trajectories, lambda r: r["step"] == 1 and not r["masked"] and len(r["turns"]) >= 2)
    assert len(expected) == 2 and sorted(index.evaluate(VISIBLE_IDS)) == expected
    keep_screenshot(index, "viewer-index-filtered.png")
    link = index.evaluate("location.href")
    assert link.endswith("#step=1&masked=0&tmin=2")

    reopened = browser.open(link)  # a shared link restores the filters
    assert sorted(reopened.evaluate(VISIBLE_IDS)) == expected
    assert reopened.evaluate("document.getElementById('f-masked').value") == "0"

    index.click("#f-reset")
    assert sorted(index.evaluate(VISIBLE_IDS)) == sorted(trajectories)


def test_clicking_a_row_opens_its_page_and_the_page_links_back(browser, site_url, trajectories):
    page = browser.open(site_url)
    first = page.evaluate(f"{ROWS}[0].dataset.id")
    name = page.evaluate(f"{ROWS}[0].querySelector('a').textContent")
    assert name == "step 1 · sample #0 · rollout 0"
    page.click("#trajectories tbody tr a", wait_for_load=True)
    assert page.evaluate("location.pathname") == f"/t/{first}.html"
    assert page.evaluate("document.querySelector('h1').textContent") == name  # one name in the index and the page
    model = f"model tiny-qwen2_5_vl-seed0-v{BUILDER_VERSION} (the embedded tiny VLM (~290k parameters"
    assert page.evaluate("document.querySelector('header .note').textContent").startswith(model)
    page.click("header nav a", wait_for_load=True)
    assert page.evaluate("location.pathname") in ("/", "/index.html")


def test_pages_load_nothing_from_outside_the_site(browser, site_url, trajectories):
    for path in ["", *[f"t/{trajectory_id}.html" for trajectory_id in list(trajectories)[:4]]]:
        page = browser.open(site_url + path)
        loaded = page.evaluate("performance.getEntriesByType('resource').map(entry => entry.name)")
        assert loaded and all(url.startswith(site_url) for url in loaded), loaded
