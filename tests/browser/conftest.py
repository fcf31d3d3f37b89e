"""A headless JupyterLab, installed from the built wheel, and a headless Chromium for the browser
tests.

JupyterLab runs from a virtual environment of its own (:func:`wheel_env`, made once a session):
the package's wheel is built (``pip wheel``; its build runs the extension's npm build when the
built extension is missing or older than its sources) and installed there without
dependencies, so the extension JupyterLab loads is the one the wheel put in
``share/jupyter/labextensions``, and the kernel imports ``explorer`` from the wheel. The
dependencies (JupyterLab, ipywidgets, MLIR, ...) are the test environment's own, made visible to
the new environment by a ``.pth`` file, with their ``.pth`` files and Jupyter data (JupyterLab's
application, the other lab extensions, kernel specs, server configuration) linked in; the
development install of this project (its editable ``.pth``, its copy of the extension) is left
out and the fixture checks that it cannot be seen. Building and installing takes about half a
minute.

The ``lab`` fixture serves a temporary root holding a copy of the quickstart notebook, on a free
port, with no token; its settings turn off news and update checks so that no pop-up covers the
notebook. The fixtures skip (with the reason) when Chromium, Playwright or JupyterLab is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
EXTENSION = "scanweaver-explorer"
#: a wheel to test instead of building one (a path), e.g. the wheel a CI job already built
WHEEL_VARIABLE = "EXPLORER_TEST_WHEEL"


def one_cell_notebook(cell_id: str, source: str) -> dict[str, Any]:
    """A notebook (nbformat 4.5, the Python 3 kernel) of one code cell holding ``source``."""
    return {
        "cells": [{"cell_type": "code", "execution_count": None, "id": cell_id,
                   "metadata": {}, "outputs": [], "source": source}],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }


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


# -- the environment made from the wheel ---------------------------------------------------------
@dataclass(frozen=True)
class WheelEnv:
    """A virtual environment with the wheel installed: its interpreter and the environment
    variables to run it with."""

    wheel: Path
    prefix: Path
    python: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=self.prefix)

    @property
    def labextensions(self) -> Path:
        return self.prefix / "share" / "jupyter" / "labextensions"


def _is_this_project(pth: Path) -> bool:
    """A ``.pth`` file of the development install of this project (an editable install points
    at the source tree)."""
    name = pth.name.lower().replace("-", "_")
    if "scanweaver" in name:
        return True
    try:
        return str(REPO) in pth.read_text(errors="replace")
    except OSError:
        return False


def _dependency_dirs() -> list[Path]:
    """The site-packages folders of the environment running the tests."""
    dirs = [Path(p) for p in site.getsitepackages()]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(Path(site.getusersitepackages()))
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


DEPENDENCIES_MODULE = '''"""The dependencies of the browser tests' environment, on sys.path:
the site-packages of the environment that made this one, with their .pth files except those of
this project's development install (written by tests/browser/conftest.py)."""
import os
import site
import sys

DIRECTORIES = {directories!r}
SKIPPED = {skipped!r}


def add():
    for directory in DIRECTORIES:
        if directory not in sys.path:
            sys.path.append(directory)
        for name in sorted(os.listdir(directory)):
            if name.endswith(".pth") and os.path.join(directory, name) not in SKIPPED:
                site.addpackage(directory, name, None)
'''


def _link_data(source: Path, target: Path, skip: set[Path]) -> None:
    """Link every entry of ``source`` into ``target`` (made as folders as far down as needed
    to leave out the paths in ``skip``)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        destination = target / entry.name
        if entry in skip:
            continue
        made_here = destination.is_dir() and not destination.is_symlink()
        if entry.is_dir() and (made_here or any(entry in s.parents for s in skip)):
            _link_data(entry, destination, skip)   # a folder of its own, holding links
        elif not (destination.exists() or destination.is_symlink()):
            destination.symlink_to(entry, target_is_directory=entry.is_dir())


def _build_wheel(folder: Path) -> Path:
    given = os.environ.get(WHEEL_VARIABLE)
    if given:
        wheel = Path(given)
        if not wheel.is_file():
            raise FileNotFoundError(f"{WHEEL_VARIABLE}={given}: no such wheel")
        return wheel
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(folder),
         "--disable-pip-version-check", "-q"],
        capture_output=True, text=True, timeout=900)
    wheels = sorted(folder.glob("scanweaver_explorer-*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError("building the wheel failed:\n" + result.stdout[-3000:]
                           + result.stderr[-3000:])
    return wheels[-1]


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> WheelEnv:
    """A virtual environment with the built wheel installed (no dependencies), the test
    environment's dependencies visible through a ``.pth`` file, and JupyterLab's data linked in
    (without this project's development copy of the extension)."""
    if shutil.which("jupyter") is None:
        pytest.skip("JupyterLab is not installed (the 'jupyter' command is missing)")
    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed")
    started = time.monotonic()
    root = tmp_path_factory.mktemp("wheel-env")
    wheel = _build_wheel(root / "dist")
    built = time.monotonic()
    prefix = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True,
                   timeout=300)
    python = prefix / "bin" / "python"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # the dependencies: this environment's site-packages, without the development install
    purelib = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    directories = [str(d) for d in _dependency_dirs()]
    skipped = [str(pth) for d in _dependency_dirs() for pth in sorted(d.glob("*.pth"))
               if _is_this_project(pth)]
    (purelib / "_browser_test_dependencies.py").write_text(
        DEPENDENCIES_MODULE.format(directories=directories, skipped=skipped))
    (purelib / "_browser_test_dependencies.pth").write_text(
        "import _browser_test_dependencies; _browser_test_dependencies.add()\n")

    # Jupyter's data and configuration of this environment, but the wheel's extension
    data = Path(sysconfig.get_path("data"))
    own = data / "share" / "jupyter" / "labextensions" / EXTENSION
    for part in (Path("share") / "jupyter", Path("etc") / "jupyter"):
        if (data / part).is_dir():
            _link_data(data / part, prefix / part, {own})

    # a Jupyter of its own: no user folder (a development link there would come first)
    home = root / "jupyter-home"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "JUPYTER_PATH",
                        "JUPYTER_CONFIG_PATH")}
    env.update({
        "VIRTUAL_ENV": str(prefix),
        "PATH": os.pathsep.join([str(prefix / "bin"), env.get("PATH", "")]),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "PYTHONNOUSERSITE": "1",
    })
    made = WheelEnv(wheel, prefix, python, env)

    # what the kernel imports is the wheel's, and the source tree is nowhere on its path
    probe = made.run("-c", "import json, sys, explorer; print(json.dumps("
                           "[explorer.__file__, sys.path]))")
    assert probe.returncode == 0, probe.stderr[-3000:]
    where, path = json.loads(probe.stdout)
    assert Path(where).is_relative_to(purelib), where
    assert str(REPO) not in path and "" not in path[1:], path
    print(f"\nbrowser tests: {wheel.name} built in {built - started:.0f} s, installed in "
          f"{time.monotonic() - built:.0f} s")
    return made


def labextension_listing(wheel_env: WheelEnv) -> list[str]:
    """``jupyter labextension list`` of the wheel's environment: the lines naming this
    project's extension, each after the folder it was found in."""
    listing = wheel_env.run("-m", "jupyterlab.labextensions", "list", timeout=120)
    out = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)   # no colours
    folder, lines = "", []
    for line in out.splitlines():
        if line.strip().startswith("/"):
            folder = line.strip()
        elif EXTENSION in line:
            lines.append(f"{folder}: {line.strip()}")
    return lines


@contextmanager
def running_lab(wheel_env: WheelEnv, root: Path, tmp_path_factory: pytest.TempPathFactory,
                extra: Sequence[str] = ()) -> Iterator[str]:
    """JupyterLab of the wheel's environment serving ``root``; yields its base URL."""
    settings = tmp_path_factory.mktemp("lab-settings")
    notification = settings / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"checkForUpdates": False, "fetchNews": "false"}))
    env = dict(wheel_env.env)
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path_factory.mktemp("lab-workspaces"))
    port = _free_port()
    log_path = tmp_path_factory.mktemp("lab-log") / "jupyterlab.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below, after the server
    command = [
        str(wheel_env.python), "-m", "jupyterlab", "--allow-root", "--ip", "127.0.0.1",
        f"--port={port}", "--ServerApp.token=", "--ServerApp.password=", "--no-browser",
        f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
        "--ServerApp.port_retries=0", *extra,
    ]
    process = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/"
    try:
        try:
            _wait_for_server(url, process)
        except (RuntimeError, TimeoutError) as err:
            log.flush()
            raise RuntimeError(f"{err}; its log:\n{log_path.read_text()[-4000:]}") from err
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="session")
def lab_extension_listed(wheel_env: WheelEnv) -> list[str]:
    """The wheel's extension, as ``jupyter labextension list`` of its environment shows it:
    installed by the wheel in that environment, enabled, OK, and there only."""
    lines = labextension_listing(wheel_env)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{wheel_env.labextensions}:"), lines
    assert " enabled " in f" {lines[0]} " and "OK" in lines[0], lines
    return lines


@pytest.fixture(scope="session")
def lab_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the ``lab`` fixture serves: a copy of ``quickstart.ipynb``, and whatever a test
    puts there."""
    root = tmp_path_factory.mktemp("lab-root")
    shutil.copy(REPO / "notebooks" / "quickstart.ipynb", root / "quickstart.ipynb")
    return root


@pytest.fixture(scope="session")
def lab(wheel_env: WheelEnv, lab_extension_listed: list[str], lab_folder: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running JupyterLab (from the wheel) serving :func:`lab_folder`."""
    with running_lab(wheel_env, lab_folder, tmp_path_factory) as url:
        yield url


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
