"""``verl-mm-tools view``: a static site from trajectory records, and a localhost server for it.

Layout of a site: ``index.html``, ``t/<id>.html`` per trajectory, ``img/<id>/images/*`` (hard links to the dump's
files when the file system allows, else copies). The site is self-contained: it can be opened from disk or copied.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from PIL import Image

from verl_mm_tools.record import SITE_DIR, tools_used, trajectory_name
from verl_mm_tools.trajectories.read import SITE_MARKER, BadRecord
from verl_mm_tools.viewer.curve import CURVE_PICTURE
from verl_mm_tools.viewer.html import IndexRow, index_page, trajectory_page
from verl_mm_tools.viewer.loading import Trajectory, ViewerError, load_trajectory_set

logger = logging.getLogger(__name__)

# SITE_MARKER (read.py) lets a rebuild replace a site it made, and nothing else, and keeps readers out of it
QUESTION_CHARS = 120


@dataclass(frozen=True)
class Site:
    index: Path
    pages: dict[str, Path]  # trajectory id -> page
    bad: list[BadRecord]  # the records that could not be shown, listed on the index page


def default_site_dir(dump_dir: str | os.PathLike) -> Path:
    return Path(dump_dir) / SITE_DIR


def build_site(dump_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Site:
    """Write the site for every good trajectory under ``dump_dir`` into ``out`` (default ``<dump_dir>/_site``), the
    bad records listed on its index page."""
    loaded = load_trajectory_set(dump_dir)
    trajectories = loaded.trajectories
    out = Path(out) if out is not None else default_site_dir(dump_dir)
    _prepare(out)
    pages = {trajectory.id: f"t/{trajectory.id}.html" for trajectory in trajectories}
    links = [pages[trajectory.id] for trajectory in trajectories]
    for position, trajectory in enumerate(trajectories):
        image_base = _copy_images(trajectory, out)
        neighbours = (
            _sibling(links, position - 1),
            _sibling(links, position + 1),
        )
        record = _with_image_sizes(trajectory)
        html = trajectory_page(record, image_base and f"../{image_base}", "../index.html", neighbours)
        _write_page(out / pages[trajectory.id], html)
    rows = [_index_row(trajectory, pages[trajectory.id]) for trajectory in trajectories]
    curve = _copy_learning_curve(Path(dump_dir), out)
    bad_lines = [item.line() for item in loaded.bad]
    _write_page(out / "index.html", index_page(rows, str(dump_dir), curve, bad_lines))
    logger.info("wrote %d trajectory pages to %s", len(trajectories), out)
    return Site(index=out / "index.html", pages={key: out / value for key, value in pages.items()}, bad=loaded.bad)


def _write_page(path: Path, html: str) -> None:
    # A record's JSON may hold a lone surrogate (an escaped \ud800), which UTF-8 cannot encode: "?", not a failed build.
    path.write_text(html, encoding="utf-8", errors="replace")


def _with_image_sizes(trajectory: Trajectory) -> dict:
    """The record, each image's size read from its file where the record lacks it (sizes are optional in a record;
    the page needs them to place a GUI action's point on its screenshot)."""
    record = trajectory.record
    images = record.get("images") or []
    if all(image.get("width") for image in images):
        return record
    return {**record, "images": [_sized(image, trajectory.files.get(image.get("file") or "")) for image in images]}


def _sized(image: dict, file: Path | None) -> dict:
    if image.get("width") or file is None:
        return image
    with Image.open(file) as opened:  # checked by the reader: a readable PNG of bounded size; reads the header only
        width, height = opened.size
    return {**image, "width": width, "height": height}


def _copy_learning_curve(dump_dir: Path, out: Path) -> str | None:
    """The demo's learning-curve picture (in the run folder, above ``trajectories/``) copied into the site."""
    picture = dump_dir.resolve().parent / CURVE_PICTURE
    if not picture.is_file():
        return None
    shutil.copyfile(picture, out / CURVE_PICTURE)
    return CURVE_PICTURE


def _sibling(links: list[str], position: int) -> str | None:
    # Pages live side by side in t/, so a neighbour is linked by its file name.
    return Path(links[position]).name if 0 <= position < len(links) else None


def _prepare(out: Path) -> None:
    """Replace a site this viewer wrote; refuse to write into any other non-empty directory."""
    if out.exists() and any(out.iterdir()):
        if not (out / SITE_MARKER).exists():
            raise ViewerError(
                f"{out} exists and is not a site written by verl-mm-tools view; pass an empty or new directory to --out"
            )
        shutil.rmtree(out)
    (out / "t").mkdir(parents=True)
    (out / "img").mkdir()
    (out / SITE_MARKER).write_text("written by verl-mm-tools view; the whole directory is replaced on rebuild\n")


def _copy_images(trajectory: Trajectory, out: Path) -> str | None:
    """Link or copy the trajectory's image files into the site; returns their base path (None: no files)."""
    if trajectory.folder is None:
        return None
    base = f"img/{trajectory.id}"
    for name, source in trajectory.files.items():  # checked by the reader: inside the record's own folder
        _link_or_copy(source, out / base / name)
    return base


def _link_or_copy(source: Path, target: Path) -> None:
    if not source.is_file():
        raise ViewerError(
            f"{source} is listed in its trajectory record but missing; the dump is incomplete "
            f"(was it copied partially or cleaned while running?)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(os.path.realpath(source), target)  # no extra disk for the site
    except OSError:
        shutil.copyfile(source, target)


def _index_row(trajectory: Trajectory, page_link: str) -> IndexRow:
    record = trajectory.record
    sample = record.get("sample") or {}
    images = record.get("images") or []
    thumbs = [image for image in images if image.get("thumb")]
    shown = thumbs[:1] + thumbs[-2:] if len(thumbs) > 3 else thumbs  # the prompt image and the last tool images
    turns = record.get("turns")
    return IndexRow(
        page=page_link,
        id=trajectory.id,
        name=trajectory_name(record),
        model=record.get("model"),
        step=record.get("step"),
        validate=bool(record.get("validate")),
        sample_index=sample.get("index"),
        rollout_n=record.get("rollout_n"),
        question=_question(record)[:QUESTION_CHARS],
        reward=(record.get("reward") or {}).get("score"),
        tools=tuple(tools_used(record)),
        masked=record.get("masked"),
        turns=len(turns) if turns else _assistant_messages(record),
        stop_reason=record.get("stop_reason"),
        thumbnails=tuple((f"img/{trajectory.id}/{image['thumb']}", f"Image {image['id']}") for image in shown),
        origin=trajectory.origin,
    )


def _question(record: dict) -> str:
    """The last user message of the prompt, on one line."""
    messages = record.get("messages") or []
    prompt = [message for message in messages if message.get("role") == "user" and not message.get("turn")]
    return " ".join((prompt[-1].get("text") or "").split()) if prompt else ""


def _assistant_messages(record: dict) -> int | None:
    count = sum(1 for message in record.get("messages") or [] if message.get("role") == "assistant")
    return count or None


# ----- serving --------------------------------------------------------------------------------------------------


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s - %s", self.address_string(), format % args)


def make_server(site_dir: str | os.PathLike, port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for ``site_dir`` on 127.0.0.1 only (port 0: any free port); call ``serve_forever()``."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    try:
        return ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as error:
        raise ViewerError(
            f"cannot serve on 127.0.0.1:{port} ({error}); pick another --serve port, or 0 for any free one"
        ) from error
