"""GPU tests of packed variable-length batches (``varlen=True``, a call's ``cu_seqlens=``) and of
last states (``<state>_last``): the affine scan and the selective scan presets on every plan
(sequential, the chunked trees, the look-back grid), against the float64 reference run on each
sequence alone; offsets given as NumPy, CuPy or torch integers; bad offsets refused before any
launch.

Needs CuPy and a CUDA device (skipped otherwise) and the artifacts of
``python tests/gpu/build_artifacts.py`` (``artifacts/varlen/``, built on the fly where MLIR is
importable). Tolerances as in ``test_cuda_runtime``: 1e-4 on states, 5e-4 on a readout summed
over lanes (``max|out - ref| / max|ref|``, the reference in float64).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

from explorer.errors import RecurrenceError  # noqa: E402
from explorer.runtime.cuda import CudaKernel, gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

from explorer.bench.affine import max_rel_error  # noqa: E402

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts" / "varlen"
if not (ART / "index.json").exists() and importlib.util.find_spec("mlir") is not None:
    import build_artifacts  # type: ignore[import-not-found]

    build_artifacts.build_varlen(ART)
if not (ART / "index.json").exists():
    pytest.skip("no varlen artifacts: run `python tests/gpu/build_artifacts.py` where MLIR is "
                "installed", allow_module_level=True)

INDEX: dict[str, Any] = json.loads((ART / "index.json").read_text())
ARTIFACTS: dict[str, dict[str, Any]] = INDEX["artifacts"]
TOL = 1e-4
TOL_READOUT = 5e-4
AFFINE = sorted(n for n, i in ARTIFACTS.items() if not i["vector"])
SELECTIVE = sorted(n for n, i in ARTIFACTS.items() if i["vector"])


def test_every_varlen_artifact_was_built() -> None:
    assert not INDEX["failed"], INDEX["failed"]
    assert AFFINE and SELECTIVE


def _reference(text: str, **arrays: Any) -> Any:
    import explorer as ex

    return ex.reference(text, **arrays)


def _packing(rng: np.random.Generator, L: int, sequences: int) -> np.ndarray:
    """Offsets of ``sequences`` sequences of random lengths (an empty one among them)."""
    cuts = np.sort(rng.choice(np.arange(1, L), sequences - 2, replace=False))
    return np.concatenate([[0], cuts, [cuts[-1]], [L]]).astype(np.int32)


@pytest.mark.parametrize("name", AFFINE)
@pytest.mark.parametrize("L", [1000, 70000])
def test_packed_affine_scan(name: str, L: int) -> None:
    k = CudaKernel.from_artifact(ART / name, poison=True)
    rng = np.random.default_rng(L)
    C = 3
    a = rng.uniform(0.9, 1.0, (C, L)).astype(np.float32)
    b = rng.standard_normal((C, L)).astype(np.float32)
    cu = _packing(rng, L, 7)
    S = len(cu) - 1
    h0 = rng.standard_normal((S, C)).astype(np.float32)
    out = k(a=a, b=b, cu_seqlens=cp.asarray(cu), h0=h0)
    assert out["h_last"].shape == (S, C)
    for j in range(S):
        s, e = int(cu[j]), int(cu[j + 1])
        if s == e:
            np.testing.assert_array_equal(out["h_last"][j], h0[j])
            continue
        ref = _reference(ARTIFACTS[name]["recurrence"], a=a[:, s:e], b=b[:, s:e], h0=h0[j])
        assert max_rel_error(out["h"][:, s:e], ref) < TOL, (name, j)
        assert max_rel_error(out["h_last"][j], ref[:, -1]) < TOL, (name, j)


@pytest.mark.parametrize("name", SELECTIVE)
def test_packed_selective_scan(name: str) -> None:
    """Mamba's packed layout: B and C (1, 1, N, T) shared by the D channels, offsets as a torch
    tensor when torch is there; y and the last state per sequence."""
    k = CudaKernel.from_artifact(ART / name, poison=True)
    rng = np.random.default_rng(5)
    D, N, L = 40, 16, 20000
    cu = _packing(rng, L, 6)
    S = len(cu) - 1
    arrays = {"x": rng.standard_normal((1, D, L)), "dt": rng.uniform(0.01, 0.1, (1, D, L)),
              "A": -rng.uniform(0.5, 2.0, (D, N)), "B": rng.standard_normal((1, 1, N, L)),
              "C": rng.standard_normal((1, 1, N, L)), "D": rng.standard_normal(D)}
    arrays = {n: v.astype(np.float32) for n, v in arrays.items()}
    h0 = rng.standard_normal((S, 1, D, N)).astype(np.float32)
    try:
        import torch

        offsets: Any = torch.as_tensor(cu, device="cuda")
    except ImportError:
        offsets = cu
    out = k(**arrays, cu_seqlens=offsets, h0=h0)
    assert out["h_last"].shape == (S, 1, D, N)
    for j in range(S):
        s, e = int(cu[j]), int(cu[j + 1])
        if s == e:
            np.testing.assert_array_equal(out["h_last"][j], h0[j])
            continue
        part = {n: (v[..., s:e] if n in ("x", "dt", "B", "C") else v) for n, v in arrays.items()}
        ref = _reference(ARTIFACTS[name]["recurrence"], **part, h0=h0[j])
        assert max_rel_error(out["y"][..., s:e], ref["y"]) < TOL_READOUT, (name, j)
        assert max_rel_error(out["h_last"][j], ref["h"][..., -1]) < TOL, (name, j)


@pytest.mark.parametrize("name", AFFINE[:1] + SELECTIVE[:1])
def test_without_offsets_one_sequence(name: str) -> None:
    k = CudaKernel.from_artifact(ART / name, poison=True)
    rng = np.random.default_rng(9)
    if ARTIFACTS[name]["vector"]:
        arrays = {"x": rng.standard_normal((2, 3000)), "dt": rng.uniform(0.01, 0.1, (2, 3000)),
                  "A": -rng.uniform(0.5, 2.0, (2, 4)), "B": rng.standard_normal((2, 4, 3000)),
                  "C": rng.standard_normal((2, 4, 3000)), "D": rng.standard_normal(2)}
    else:
        arrays = {"a": rng.uniform(0.9, 1.0, (2, 3000)), "b": rng.standard_normal((2, 3000))}
    arrays = {n: v.astype(np.float32) for n, v in arrays.items()}
    out = k(**arrays)
    ref = _reference(ARTIFACTS[name]["recurrence"], **arrays)
    h = ref["h"] if isinstance(ref, dict) else ref
    assert max_rel_error(out["h_last"], h[..., -1]) < TOL


def test_bad_offsets_are_refused_before_any_launch() -> None:
    k = CudaKernel.from_artifact(ART / AFFINE[0])
    a = np.ones((2, 10), np.float32)
    with pytest.raises(RecurrenceError, match="non-decreasing"):
        k(a=a, b=a, cu_seqlens=np.array([0, 6, 4, 10]))
    with pytest.raises(RecurrenceError, match="end at the total length"):
        k(a=a, b=a, cu_seqlens=np.array([0, 4, 9]))
    with pytest.raises(RecurrenceError, match="integer"):
        k(a=a, b=a, cu_seqlens=cp.asarray([0.0, 10.0]))
