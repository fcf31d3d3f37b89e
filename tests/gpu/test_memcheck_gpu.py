"""compute-sanitizer's memcheck over every artifact of the GPU tests (``memcheck_driver.py``:
shapes that end tiles, chunks and look-back windows part way, each array an allocation of its
own): no kernel reads or writes outside its arrays. Skipped where compute-sanitizer is not on
PATH (or under ``/usr/local/cuda/bin``), where there is no GPU, or no artifacts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

from explorer.runtime.cuda import gpu_available  # noqa: E402

HERE = Path(__file__).resolve().parent
SANITIZER = shutil.which("compute-sanitizer") or next(
    (p for p in ["/usr/local/cuda/bin/compute-sanitizer"] if os.access(p, os.X_OK)), None)

pytestmark = [
    pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy"),
    pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not installed"),
    pytest.mark.skipif(not (HERE / "artifacts" / "index.json").exists(),
                       reason="no artifacts: run `python tests/gpu/build_artifacts.py`"),
]


@pytest.mark.gpu
def test_no_kernel_touches_memory_outside_its_arrays() -> None:
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    run = subprocess.run([str(SANITIZER), "--tool", "memcheck", "--error-exitcode", "99",
                          "--print-limit", "10", sys.executable, str(HERE / "memcheck_driver.py")],
                         capture_output=True, text=True, timeout=1500, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "ERROR SUMMARY: 0 errors" in out, out[-6000:]
    launched = [line for line in out.splitlines() if line.startswith("launched ")]
    assert launched and int(launched[-1].split()[1]) > 100, out[-3000:]
