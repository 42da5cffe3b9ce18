"""The isolated browser: no page reaches any host (this machine's 127.0.0.1 included), the package's pages load, and
nothing it started outlives it, however it ends (closed, killed, dropped)."""

from __future__ import annotations

import dataclasses
import errno
import gc
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from verl_mm_tools.envs.gui.browser import (
    BUSY_RETRIES,
    CHROMIUM_ENV,
    Browser,
    BrowserSettings,
    live_processes,
    start_when_not_busy,
)
from verl_mm_tools.errors import ConfigError

pytestmark = pytest.mark.integration  # starts Chromium


@pytest.fixture
def listener():
    """A TCP listener on the host's loopback, and the connections it accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    accepted: list[object] = []

    def accepted_now() -> list[object]:
        try:
            while True:
                connection, address = server.accept()
                accepted.append(address)
                connection.close()
        except BlockingIOError:
            return accepted

    yield server.getsockname()[1], accepted_now
    server.close()


def test_no_page_reaches_the_hosts_loopback(listener):
    port, accepted = listener
    browser = Browser(BrowserSettings.found())
    try:
        driver = browser.driver
        driver.set_page_load_timeout(5)
        with pytest.raises(Exception):  # noqa: B017  Selenium's error for a page that cannot load
            driver.get(f"http://127.0.0.1:{port}/")
        driver.get("about:blank")
        outcome = driver.execute_async_script(
            "const done = arguments[0];"
            f"fetch('http://127.0.0.1:{port}/').then(() => done('reached'), (error) => done('refused: ' + error));"
        )
        assert outcome.startswith("refused: TypeError")
        time.sleep(0.5)
        assert accepted() == []
    finally:
        browser.close()


def test_the_listener_is_reachable_without_the_browser(listener):
    """The control: the same listener does accept a connection from this process."""
    port, accepted = listener
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    time.sleep(0.2)
    assert len(accepted()) == 1


def test_the_packages_pages_load():
    from miniwob.selenium_instance import DEFAULT_BASE_URL, HTML_DIR

    browser = Browser(dataclasses.replace(BrowserSettings.found(), pages=(str(HTML_DIR),)))
    try:
        browser.driver.get(DEFAULT_BASE_URL + "click-test.html")
        assert browser.driver.execute_script("return typeof core.startEpisodeReal") == "function"
    finally:
        browser.close()


@pytest.mark.parametrize("ending", ["close", "kill", "drop"])
def test_nothing_outlives_the_browser(ending):
    browser = Browser(BrowserSettings.found())
    workdir, driver_process = browser.workdir, browser.process
    assert len(live_processes(str(workdir))) >= 3  # bwrap, Chromium's browser process and its helpers
    assert (workdir / "profile").is_dir()
    if ending == "drop":
        del browser
        gc.collect()
    else:
        getattr(browser, ending)()
    assert live_processes(str(workdir)) == []
    assert driver_process.poll() is not None
    assert not workdir.exists()


def test_a_missing_program_is_a_config_error(monkeypatch):
    monkeypatch.setenv(CHROMIUM_ENV, "/nonexistent/chromium")
    with pytest.raises(ConfigError, match=r"VERL_MM_TOOLS_CHROMIUM='/nonexistent/chromium' is not an executable"):
        BrowserSettings.found()
    monkeypatch.delenv(CHROMIUM_ENV)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="needs chromium, which is not on PATH: run scripts/install_chromium.sh"):
        BrowserSettings.found()


def test_a_process_killed_outright_leaves_no_browser():
    """A Ray actor or a worker killed for memory runs no finalizer: chromedriver dies with its launching thread, and
    Chromium with chromedriver."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from verl_mm_tools.envs.gui.browser import Browser, BrowserSettings\n"
            "browser = Browser(BrowserSettings.found())\n"
            "print(browser.workdir, browser.process.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    workdir, driver_pid = launcher.stdout.readline().split()
    assert len(live_processes(workdir)) >= 3
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while (live_processes(workdir) or _alive(int(driver_pid))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_processes(workdir) == [] and not _alive(int(driver_pid))
    shutil.rmtree(workdir, ignore_errors=True)  # its profile: the finalizer that removes it never ran


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pages_under_tmp_load_only_where_bound(tmp_path):
    """The sandbox's /tmp is its own: a page under the host's /tmp (a virtual environment there holds miniwob's)
    loads when its directory is one of the browser's ``pages``, and not otherwise."""
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "task.html").write_text("<html><head><title>bound page</title></head><body></body></html>")
    assert str(pages).startswith("/tmp/")
    settings = BrowserSettings.found()
    for bound in (True, False):
        browser = Browser(dataclasses.replace(settings, pages=(str(pages),) if bound else ()))
        try:
            browser.driver.get(f"file://{pages}/task.html")
            assert (browser.driver.title == "bound page") is bound  # unbound: Chromium's error page
        finally:
            browser.close()


def _busy_script(tmp_path: Path):
    """An executable script with a write handle still open on it: exec'ing it fails with ETXTBSY, as a browser's
    freshly written wrapper does while another thread's fork holds it."""
    script = tmp_path / "busy.sh"
    script.write_text("#!/bin/sh\nexit 7\n")
    script.chmod(0o700)
    return script, open(script, "a")  # closed by the test


def test_a_script_busy_for_a_moment_is_started_once_it_is_free(tmp_path):
    script, handle = _busy_script(tmp_path)
    with pytest.raises(OSError) as busy:
        subprocess.run([str(script)], check=False)
    assert busy.value.errno == errno.ETXTBSY
    threading.Timer(0.1, handle.close).start()
    assert start_when_not_busy(lambda: subprocess.run([str(script)], check=False)).returncode == 7


def test_a_script_that_stays_busy_or_another_error_is_raised(tmp_path):
    script, handle = _busy_script(tmp_path)
    tries = []

    def start(path: Path):
        tries.append(path.name)
        return subprocess.run([str(path)], check=False)

    try:
        with pytest.raises(OSError) as busy:
            start_when_not_busy(lambda: start(script))
    finally:
        handle.close()
    assert busy.value.errno == errno.ETXTBSY and tries == ["busy.sh"] * (BUSY_RETRIES + 1)
    with pytest.raises(FileNotFoundError):
        start_when_not_busy(lambda: start(tmp_path / "absent"))
    assert tries[-2:] == ["busy.sh", "absent"]  # tried once: only ETXTBSY is waited out
