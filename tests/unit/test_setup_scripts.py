"""The README's two commands choose their Python through scripts/python.sh: a project `.venv`
unless an environment is active (PEP 668: a Debian/Ubuntu system python3 refuses pip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _chosen(folder: Path, env: dict[str, str]) -> str:
    out = subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/python.sh; "
                          'echo "$PY"'], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update(extra)
    return env


def _project(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "python.sh", tmp_path / "scripts" / "python.sh")
    return tmp_path


def test_system_python_gets_a_project_venv(tmp_path: Path) -> None:
    """Outside any environment the scripts make `.venv` and run from it, even when the
    interpreter is externally managed (Debian's /usr/bin/python3 here)."""
    base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    folder = _project(tmp_path)
    py = _chosen(folder, _clean_env(PYTHON=base))
    assert py == str(folder / ".venv" / "bin" / "python")
    inside = subprocess.run([py, "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert inside == "True"
    # pip installs there (PEP 668 refuses it in an externally managed system python)
    pip = subprocess.run([py, "-m", "pip", "install", "--dry-run", "--no-index", "pip"],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    assert "externally-managed" not in pip.stderr
    # a second run reuses it
    stamp = (folder / ".venv" / "pyvenv.cfg").stat().st_mtime_ns
    assert _chosen(folder, _clean_env(PYTHON=base)) == py
    assert (folder / ".venv" / "pyvenv.cfg").stat().st_mtime_ns == stamp


def test_an_active_environment_is_kept(tmp_path: Path) -> None:
    folder = _project(tmp_path)
    env_dir = tmp_path / "mine"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    env = _clean_env(VIRTUAL_ENV=str(env_dir),
                     PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert _chosen(folder, env) == str(env_dir / "bin" / "python")
    assert not (folder / ".venv").exists()


def test_the_readme_commands_use_the_chooser() -> None:
    for script in ("setup.sh", "test.sh", "explore.sh"):
        text = (REPO / "scripts" / script).read_text()
        assert "source scripts/python.sh" in text, script
        assert '"$PY" -m' in text, script
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
