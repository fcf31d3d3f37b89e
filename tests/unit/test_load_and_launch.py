"""``explorer.load`` gives a callable like a compile, with numpy alone; running on a machine
without CuPy or without a GPU is a LaunchError that says which, never ModuleNotFoundError."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import explorer as ex
from explorer.errors import LaunchError
from explorer.runtime import cuda
from explorer.runtime.artifact import Artifact, ArtifactError, write_artifact
from tests.unit.test_runtime_artifact import PTX, _manifest

ROOT = Path(__file__).resolve().parents[2]
A = np.ones((2, 8), np.float32)


@pytest.fixture
def art(tmp_path: Path) -> Path:
    return write_artifact(tmp_path / "art", PTX, _manifest())


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)   # import cupy -> ModuleNotFoundError


@pytest.fixture
def no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def count() -> int:
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)


def test_load_gives_a_callable_with_its_artifact(art: Path) -> None:
    k = ex.load(art)
    assert callable(k)
    assert isinstance(k.artifact, Artifact)
    assert k.artifact.recurrence == "h[t] = a[t] * h[t-1] + b[t]"
    assert k.artifact.ptx_text["kernel.ptx"] == PTX
    assert k.input_names == ("a", "b") and k.output_names == ("h",)
    assert ex.load(str(art / "manifest.json")).artifact.hash == k.artifact.hash


def test_load_refuses_a_malformed_artifact(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not an artifact directory"):
        ex.load(tmp_path)


def test_without_cupy_a_call_says_so(art: Path, no_cupy: None) -> None:
    assert cuda.gpu_unavailable_reason() == (
        "CuPy is not installed (pip install cupy-cuda13x, or cupy-cuda12x for CUDA 12)")
    assert not cuda.gpu_available()
    k = ex.load(art)
    with pytest.raises(LaunchError, match=r"^cannot run on the GPU: CuPy is not installed"):
        k(a=A, b=A)


def test_without_a_device_a_call_says_so(art: Path, no_device: None) -> None:
    reason = cuda.gpu_unavailable_reason()
    assert reason is not None and reason.startswith("no CUDA device: CuPy cannot reach one")
    assert "no CUDA-capable device" in reason and "\n" not in reason
    with pytest.raises(LaunchError, match="^cannot run on the GPU: no CUDA device"):
        ex.load(art)(a=A, b=A)


def test_a_device_count_of_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert cuda.gpu_unavailable_reason() == "no CUDA device: CuPy sees none"
    with pytest.raises(LaunchError, match="CuPy sees none"):
        cuda.require_gpu()


def test_bad_calls_are_still_refused_before_the_device_check(art: Path, no_cupy: None) -> None:
    from explorer.errors import RecurrenceError

    with pytest.raises(RecurrenceError, match="missing array"):
        ex.load(art)(a=A)


def test_loading_and_calling_imports_neither_mlir_nor_sympy(art: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "import explorer\n"
        f"k = explorer.load({str(art)!r})\n"
        "assert callable(k) and k.artifact.kernels[0].name == 'scan_kernel'\n"
        "from explorer.runtime.cuda import gpu_unavailable_reason\n"
        "if gpu_unavailable_reason() is not None:\n"
        "    try:\n"
        "        k(a=np.ones((2, 8), np.float32), b=np.ones((2, 8), np.float32))\n"
        "    except explorer.LaunchError as err:\n"
        "        print('LaunchError:', err)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlir', 'sympy'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
    if cuda.gpu_unavailable_reason() is not None:
        assert "LaunchError: cannot run on the GPU: " in out.stdout


@pytest.mark.skipif(importlib.util.find_spec("mlir") is None, reason="needs the MLIR bindings")
@pytest.mark.parametrize("fixture", ["no_cupy", "no_device"])
def test_a_compile_run_on_cuda_without_a_gpu(fixture: str, request: Any,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("SCANWEAVER_CACHE", str(tmp_path / "cache"))
    c = ex.compile("h[t] = a[t] * h[t-1] + b[t]", target="cuda")
    request.getfixturevalue(fixture)
    with pytest.raises(LaunchError, match="^cannot run on the GPU: (CuPy is not installed|no "
                                          "CUDA device)"):
        c(a=A, b=A, device="cuda")
    with pytest.raises(LaunchError):
        c.runner("cuda")
