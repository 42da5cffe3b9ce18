"""A headless Chromium driven through Selenium, isolated: no network, a temporary profile, nothing left running.

Chromium runs inside bubblewrap (``bwrap``) in new network and PID namespaces: the only network it has is its own
loopback, so no page can reach any host, this machine's 127.0.0.1 included. The root file system is read-only to
it; it writes only a tmpfs ``/tmp``, a tmpfs ``/dev/shm`` and its own profile directory. Its own ``/tmp`` hides the
host's, so the directories its pages come from are bound in read-only (``pages``: a virtual environment under
``/tmp`` holds miniwob's). chromedriver (on the host's
loopback, where Selenium reaches it) talks to Chromium over a pipe (``--remote-debugging-pipe``), which crosses the
namespace boundary where a TCP port would not. As root, Chromium refuses its own sandbox, so it is started without
it (``--no-sandbox``): bubblewrap's namespaces are the isolation.

Lifecycle: chromedriver is started in a session of its own and bwrap dies with it (``--die-with-parent``), and with
bwrap the PID namespace, every Chromium process included. ``Browser.kill`` kills that session's process group and
removes the profile; a finalizer does the same for a browser that is dropped without ``close``, and so does exit.
chromedriver itself gets SIGKILL when the thread that launched it ends (``setpriv --pdeathsig``): a process killed
outright (a Ray actor, a worker killed for memory) leaves no browser behind.

Debian's ``chromium`` and ``chromium-driver`` packages provide both programs (``scripts/install_chromium.sh``);
``VERL_MM_TOOLS_CHROMIUM`` and ``VERL_MM_TOOLS_CHROMEDRIVER`` point at others. Selenium is never allowed to
download a driver.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.sandbox.bwrap import check_bwrap

logger = logging.getLogger(__name__)

CHROMIUM_ENV = "VERL_MM_TOOLS_CHROMIUM"
CHROMEDRIVER_ENV = "VERL_MM_TOOLS_CHROMEDRIVER"
INSTALL_HINT = "run scripts/install_chromium.sh (Debian/Ubuntu packages chromium and chromium-driver)"
WRAPPER_NAME = "chromium-isolated"  # the script chromedriver starts as "Chromium", in the browser's directory
DRIVER_WRAPPER_NAME = "chromedriver-tied"  # the script started as chromedriver: it dies with its launching thread
# Starting a script this process has just written can fail with ETXTBSY: another thread's fork (another browser's
# launch) inherits the open file until its child execs. The window is that short, so a few retries clear it.
BUSY_RETRIES = 8
BUSY_BACKOFF_S = 0.05


@dataclass(frozen=True)
class BrowserSettings:
    """Which programs to run, and the window Chromium renders in."""

    chromium: str
    chromedriver: str
    bwrap: str = "bwrap"
    setpriv: str | None = None  # util-linux's, to tie chromedriver's life to its launcher (None: not found)
    pages: tuple[str, ...] = ()  # directories the pages are read from, bound read-only over the sandbox's own /tmp
    window: tuple[int, int] = (800, 600)  # the outer window; its viewport must hold the page (MiniWoB's: 160x210)

    @classmethod
    def found(cls, bwrap: str = "bwrap") -> BrowserSettings:
        """The programs on this machine; a ConfigError naming what is missing and how to install it."""
        chromium = _program(CHROMIUM_ENV, "chromium", "chromium-browser")
        chromedriver = _program(CHROMEDRIVER_ENV, "chromedriver")
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            logger.warning(
                "setpriv (util-linux) is not on PATH: a process killed outright may leave its browsers running"
            )
        return cls(chromium=chromium, chromedriver=chromedriver, bwrap=check_bwrap(bwrap), setpriv=setpriv)


def _program(variable: str, *names: str) -> str:
    """The program ``variable`` names, else the first of ``names`` on PATH; a ConfigError saying how to install it."""
    chosen = os.environ.get(variable)
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise ConfigError(f"{variable}={chosen!r} is not an executable file; unset it or {INSTALL_HINT}")
        return chosen
    found = next((path for path in map(shutil.which, names) if path), None)
    if found is None:
        raise ConfigError(f"the GUI environment needs {names[0]}, which is not on PATH: {INSTALL_HINT}")
    return found


def chromium_arguments(profile: Path, window: tuple[int, int]) -> list[str]:
    """Chromium's flags: headless, driven over a pipe, a throwaway profile, nothing fetched in the background."""
    return [
        "--headless=new",
        "--no-sandbox",  # bubblewrap isolates it; as root Chromium refuses its own sandbox
        "--remote-debugging-pipe",
        f"--user-data-dir={profile}",
        f"--window-size={window[0]},{window[1]}",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
        "--mute-audio",
    ]


def wrapper_script(settings: BrowserSettings, workdir: Path) -> str:
    """The program chromedriver starts as Chromium: Chromium in bubblewrap's namespaces, the pipe's fds inherited."""
    command = [
        settings.bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--tmpfs", "/dev/shm",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--bind", str(workdir), str(workdir),
        *[argument for page in settings.pages for argument in ("--ro-bind", page, page)],
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--setenv", "HOME", str(workdir),
        "--",
        settings.chromium,
    ]  # fmt: skip
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in command) + ' "$@"\n'


class Browser:
    """One isolated headless Chromium and its chromedriver; ``driver`` is Selenium's WebDriver on it."""

    def __init__(self, settings: BrowserSettings) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="vmt-browser-"))
        try:
            self.driver = self._launch(settings)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.process = self.driver.service.process
        self._finalizer = weakref.finalize(self, _kill, self.process, self.workdir)

    def _launch(self, settings: BrowserSettings) -> webdriver.Chrome:
        wrapper = self.workdir / WRAPPER_NAME
        wrapper.write_text(wrapper_script(settings, self.workdir))
        wrapper.chmod(0o700)
        options = webdriver.ChromeOptions()
        options.binary_location = str(wrapper)
        for argument in chromium_arguments(self.workdir / "profile", settings.window):
            options.add_argument(argument)
        driver = self._tied_driver(settings)

        def service() -> Service:  # a fresh one per try: a failed start leaves nothing to reuse
            return Service(
                executable_path=driver,
                log_output=subprocess.DEVNULL,
                popen_kw={"start_new_session": True},  # its own process group: ``kill`` reaches all it started
            )

        return start_when_not_busy(lambda: webdriver.Chrome(service=service(), options=options))

    def _tied_driver(self, settings: BrowserSettings) -> str:
        """chromedriver, killed when the thread launching it ends (where setpriv is found)."""
        if settings.setpriv is None:
            return settings.chromedriver
        script = self.workdir / DRIVER_WRAPPER_NAME
        command = [settings.setpriv, "--pdeathsig", "KILL", settings.chromedriver]
        script.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in command) + ' "$@"\n')
        script.chmod(0o700)
        return str(script)

    @property
    def alive(self) -> bool:
        return self._finalizer.alive and self.process.poll() is None

    def close(self) -> None:
        """Quit Chromium, then make sure nothing it started is left, and remove its profile."""
        if not self._finalizer.alive:
            return
        try:
            self.driver.quit()
        except Exception:
            logger.debug("quitting the browser failed", exc_info=True)
        self._finalizer()

    def kill(self) -> None:
        """Kill the browser at once (a hung or broken one), from any thread."""
        self._finalizer()


T = TypeVar("T")


def start_when_not_busy(start: Callable[[], T]) -> T:
    """``start()``, tried again while it fails with ETXTBSY (``BUSY_RETRIES`` times, ``BUSY_BACKOFF_S`` apart)."""
    for attempt in range(BUSY_RETRIES + 1):
        try:
            return start()
        except OSError as error:
            if error.errno != errno.ETXTBSY or attempt == BUSY_RETRIES:
                raise
            logger.debug("starting %s: text file busy, try %d", error.filename, attempt + 1)
            time.sleep(BUSY_BACKOFF_S * (attempt + 1))
    raise AssertionError("unreachable")


def live_processes(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds ``marker``, e.g. a browser's directory: every
    Chromium process, crash handlers included, names its profile there."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # it ended while we looked
            continue
        if marker in command and state != "Z":
            found.append(int(entry.name))
    return found


def _kill(process: subprocess.Popen, workdir: Path) -> None:
    """Kill chromedriver's process group (bwrap and, with its PID namespace, every Chromium process) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        logger.warning("chromedriver (pid %d) did not exit after SIGKILL", process.pid)
    shutil.rmtree(workdir, ignore_errors=True)
