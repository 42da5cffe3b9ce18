"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): no driver binary,
no websocket client, no debugging port; used by the viewer's tests and to render screenshots of a site.

    with Chromium() as browser:
        page = browser.open("http://127.0.0.1:8000/")
        page.evaluate("document.title")
        page.screenshot("index.png")
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from verl_mm_tools.viewer.loading import ViewerError

logger = logging.getLogger(__name__)

ENV_EXECUTABLE = "VERL_MM_TOOLS_CHROMIUM"
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless as root on a machine without network or GPU: no sandbox (root), and nothing that phones home.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)
INSTALL_HINT = (
    "install Chromium (Debian/Ubuntu: `apt-get install -y chromium`), or point the environment variable "
    f"{ENV_EXECUTABLE} at a Chromium or Chrome binary"
)


class ChromiumError(ViewerError):
    """Chromium is missing, failed to start, or a DevTools command failed."""


def _pipe_above(lowest: int) -> tuple[int, int]:
    """A pipe whose two ends are file descriptors >= ``lowest`` (close-on-exec, as os.pipe's)."""
    read_end, write_end = os.pipe()
    moved_read, moved_write = (fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, lowest) for end in (read_end, write_end))
    os.close(read_end)
    os.close(write_end)
    return moved_read, moved_write


def find_chromium() -> str:
    """The Chromium binary: ``$VERL_MM_TOOLS_CHROMIUM``, else the first of EXECUTABLES on PATH."""
    configured = os.environ.get(ENV_EXECUTABLE)
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise ChromiumError(f"{ENV_EXECUTABLE}={configured!r} is not an executable file; {INSTALL_HINT}")
        return configured
    for name in EXECUTABLES:
        found = shutil.which(name)
        if found:
            return found
    raise ChromiumError(f"no Chromium found on PATH (looked for {', '.join(EXECUTABLES)}); {INSTALL_HINT}")


class Chromium:
    """One headless browser process with a fresh profile; a context manager that always ends the process."""

    def __init__(
        self, executable: str | None = None, *, timeout_s: float = 60.0, window: tuple[int, int] = (1280, 900)
    ):
        self.executable = executable or find_chromium()
        self.timeout_s = timeout_s
        self.window = window
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> Chromium:
        self._profile = tempfile.mkdtemp(prefix="verl-mm-tools-chromium-")
        self._stderr = tempfile.TemporaryFile()
        to_browser_read, self._to_browser = _pipe_above(10)
        self._from_browser, from_browser_write = _pipe_above(10)
        command = [
            self.executable,
            *FLAGS,
            f"--user-data-dir={self._profile}",
            f"--window-size={self.window[0]},{self.window[1]}",
            "about:blank",
        ]
        # posix_spawn, not Popen(preexec_fn=...): remapping fds in a forked child of a threaded process may deadlock.
        # Chromium reads commands from fd 3 and writes answers to fd 4; the pipe ends sit above fd 10, so placing
        # one cannot overwrite the other.
        with open(os.devnull, "rb") as devnull:
            self._pid = os.posix_spawn(
                self.executable,
                command,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull.fileno(), 0),
                    (os.POSIX_SPAWN_DUP2, self._stderr.fileno(), 1),
                    (os.POSIX_SPAWN_DUP2, self._stderr.fileno(), 2),
                    (os.POSIX_SPAWN_DUP2, to_browser_read, 3),
                    (os.POSIX_SPAWN_DUP2, from_browser_write, 4),
                ],
            )
        os.close(to_browser_read)
        os.close(from_browser_write)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if not self._exited(0):
                self.command("Browser.close")
                if not self._exited(10):
                    raise ChromiumError("Chromium did not exit within 10 s of Browser.close")
        except (ChromiumError, OSError):
            os.kill(self._pid, signal.SIGKILL)
            self._exited(None)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            self._stderr.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    def _exited(self, within_s: float | None) -> bool:
        """Whether the browser process has exited (reaping it), waiting up to ``within_s`` (None: forever)."""
        if not hasattr(self, "_status"):
            deadline = None if within_s is None else time.monotonic() + within_s
            while True:
                pid, status = os.waitpid(self._pid, 0 if deadline is None else os.WNOHANG)
                if pid:
                    self._status = status
                    break
                if deadline is not None and time.monotonic() >= deadline:  # None: waitpid blocked until the exit
                    return False
                time.sleep(0.05)
        return True

    # ----- protocol ---------------------------------------------------------------------------------------------

    def command(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one DevTools command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except BrokenPipeError as error:
            raise ChromiumError(f"Chromium exited before {method}: {self._stderr_tail()}") from error
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._receive(deadline, f"the answer to {method}")
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise ChromiumError(f"{method} failed: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def wait_event(self, method: str, session: str | None = None) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for event in self._events:
                if event.get("method") == method and event.get("sessionId") == session:
                    self._events.remove(event)
                    return event.get("params", {})
            self._events.append(self._receive(deadline, f"the event {method}"))

    def _receive(self, deadline: float, waiting_for: str) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(left, 0))
            if not ready:
                raise ChromiumError(f"timed out after {self.timeout_s:g} s waiting for {waiting_for}")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ChromiumError(f"Chromium exited while waiting for {waiting_for}: {self._stderr_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-2000:] or "(no output)"

    # ----- pages ------------------------------------------------------------------------------------------------

    def open(self, url: str) -> Page:
        """A new tab showing ``url`` once its load event fired (images included)."""
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        self.command("Page.enable", session=session)
        page.navigate(url)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser = browser
        self.session = session

    def navigate(self, url: str) -> None:
        self._forget_loads()
        result = self.browser.command("Page.navigate", {"url": url}, self.session)
        if result.get("errorText"):
            raise ChromiumError(f"could not open {url}: {result['errorText']}")
        self.browser.wait_event("Page.loadEventFired", self.session)

    def _forget_loads(self) -> None:
        """Drop load events already received, so the next wait is for the next load."""
        events = self.browser._events
        events[:] = [
            event
            for event in events
            if not (event.get("method") == "Page.loadEventFired" and event.get("sessionId") == self.session)
        ]

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises are awaited); page exceptions raise."""
        result = self.browser.command(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, self.session
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise ChromiumError(f"JavaScript error in {expression[:80]!r}: {text}")
        return result["result"].get("value")

    def click(self, selector: str, *, wait_for_load: bool = False) -> None:
        """A real left click (mouse events) at the centre of the first element matching ``selector``; with
        ``wait_for_load``, returns once the page it opens has loaded."""
        self._forget_loads()
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if box is None:
            raise ChromiumError(f"no element matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.browser.command(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                self.session,
            )
        if wait_for_load:
            self.browser.wait_event("Page.loadEventFired", self.session)

    def screenshot(self, path: str | os.PathLike, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            width, height = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = self.browser.command("Page.captureScreenshot", params, self.session)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path
