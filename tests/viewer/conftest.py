"""The site of the real sample dump (``sample_dump``, tests/conftest.py), a localhost server for it, and a real
headless Chromium."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from verl_mm_tools.viewer.chromium import Chromium, ChromiumError, find_chromium
from verl_mm_tools.viewer.site import build_site, make_server

REPO_OUTPUTS = Path(__file__).resolve().parents[2] / "outputs"


@pytest.fixture(scope="session")
def sample_site(sample_dump):
    return build_site(sample_dump)


@pytest.fixture(scope="session")
def site_url(sample_site):
    """The site served on 127.0.0.1 by the viewer's own server."""
    server = make_server(sample_site.index.parent, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    try:
        executable = find_chromium()
    except ChromiumError as error:  # CI installs it: a missing browser is a failure, never a skip
        pytest.fail(f"the viewer tests need a real headless Chromium: {error}", pytrace=False)
    with Chromium(executable) as chromium:
        yield chromium


@pytest.fixture(scope="session")
def keep_screenshot(tmp_path_factory):
    """``keep_screenshot(page, name)``: a full-page PNG in the session's artifact folder (pytest's tmp dir), also
    copied into the repository's outputs/ when that folder exists."""
    artifacts = tmp_path_factory.mktemp("screenshots")

    def keep(page, name: str) -> Path:
        path = page.screenshot(artifacts / name)
        if REPO_OUTPUTS.is_dir():
            shutil.copyfile(path, REPO_OUTPUTS / name)
        return path

    return keep
