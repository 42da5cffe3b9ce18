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
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from verl_mm_tools.viewer.records import ViewerError

logger = logging.getLogger(__name__)

ENV_EXECUTABLE = "VERL_MM_TOOLS_CHROMIUM"
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless as root on a machine without network or GPU: no sandbox (root), and nothing that phones home.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
)
INSTALL_HINT = (
    "install Chromium (Debian/Ubuntu: `apt-get install -y chromium`), or point the environment variable "
    f"{ENV_EXECUTABLE} at a Chromium or Chrome binary"
)


class ChromiumError(ViewerError):
    """Chromium is missing, failed to start, or a DevTools command failed."""


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

    def __init__(self, executable: str | None = None, *, timeout_s: float = 30.0,
                 window: tuple[int, int] = (1280, 900)):
        self.executable = executable or find_chromium()
        self.timeout_s = timeout_s
        self.window = window
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> Chromium:
        self._profile = tempfile.mkdtemp(prefix="verl-mm-tools-chromium-")
        self._stderr = tempfile.TemporaryFile()
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def pipes_on_3_and_4():  # Chromium reads commands from fd 3 and writes answers to fd 4
            read_end = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        command = [self.executable, *FLAGS, f"--user-data-dir={self._profile}",
                   f"--window-size={self.window[0]},{self.window[1]}", "about:blank"]
        self._process = subprocess.Popen(command, preexec_fn=pipes_on_3_and_4, close_fds=False,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr)
        os.close(to_browser_read)
        os.close(from_browser_write)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if self._process.poll() is None:
                self.command("Browser.close")
                self._process.wait(timeout=10)
        except (ChromiumError, OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            self._stderr.close()
            shutil.rmtree(self._profile, ignore_errors=True)

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
        events[:] = [event for event in events if not (event.get("method") == "Page.loadEventFired"
                                                       and event.get("sessionId") == self.session)]

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
            self.browser.command("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                              "button": "left", "clickCount": 1}, self.session)
        if wait_for_load:
            self.browser.wait_event("Page.loadEventFired", self.session)

    def screenshot(self, path: str | os.PathLike, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            width, height = self.evaluate("[document.documentElement.scrollWidth,"
                                          " document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = self.browser.command("Page.captureScreenshot", params, self.session)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path
