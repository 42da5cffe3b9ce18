"""A trajectory page's videos (the prompt's and tools' answers): each one's strip of frames (the dump's thumbnails),
the times of the frames the model saw, their size and the video's file or the turn whose tool answered with it."""

from __future__ import annotations

from html import escape


def video_view(video: dict, image_base: str | None) -> str:
    """A video as the model saw it: its strip of frames, its frames' times and size, and its file (a prompt's) or
    its turn (a tool's)."""
    times = video.get("times_s") or []
    shown = ", ".join(f"{time:g}" for time in times[:32]) + (", ..." if len(times) > 32 else "")
    source = f", from {video['path']}" if video.get("path") else ", given as frames"
    if video.get("source") == "tool":
        source = f", a tool's answer in turn {video.get('turn')}"
    size = f"{video.get('width')}x{video.get('height')} px"
    what = f"Video {video['id']}: {len(times)} frames at {shown} s ({size}){source}"
    frames = "".join(
        _strip_frame(video["id"], frame, image_base)
        for frame in video.get("strip") or []
        if frame.get("thumb") and image_base is not None
    )
    strip = f'<div class="thumbs strip">{frames}</div>' if frames else ""
    return f'{strip}<div class="note">{escape(what)}</div>'


def _strip_frame(video_id: int, frame: dict, image_base: str) -> str:
    src, when = escape(f"{image_base}/{frame['thumb']}"), f"{frame['time_s']:g} s"
    return f'<img src="{src}" alt="Video {video_id} at {when}" title="{when}">'
