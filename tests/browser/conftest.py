"""A headless JupyterLab and a headless Chromium for the browser tests.

The fixtures skip (with the reason) when Chromium, Playwright or JupyterLab is missing. JupyterLab
serves a temporary root holding a copy of the quickstart notebook, on a free port, with no token;
its settings turn off news and update checks so that no pop-up covers the notebook.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("EXPLORER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
OUTPUT = REPO / "test-output" / "browser"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_server(url: str, process: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url + "api/status", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {timeout:.0f} s")


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running JupyterLab whose root holds ``quickstart.ipynb``."""
    if shutil.which("jupyter") is None:
        pytest.skip("JupyterLab is not installed (the 'jupyter' command is missing)")
    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed")
    root = tmp_path_factory.mktemp("lab-root")
    shutil.copy(REPO / "notebooks" / "quickstart.ipynb", root / "quickstart.ipynb")
    settings = tmp_path_factory.mktemp("lab-settings")
    notification = settings / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"checkForUpdates": False, "fetchNews": "false"}))
    workspaces = tmp_path_factory.mktemp("lab-workspaces")
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(workspaces)
    log = open(tmp_path_factory.mktemp("lab-log") / "jupyterlab.log", "wb")  # noqa: SIM115
    command = [
        sys.executable, "-m", "jupyter", "lab", "--allow-root", "--ip", "127.0.0.1",
        f"--port={port}", "--ServerApp.token=", "--ServerApp.password=", "--no-browser",
        f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
        "--ServerApp.port_retries=0",
    ]
    process = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_for_server(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless Chromium driven by Playwright."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the python 'playwright' package is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS,
                                              headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
