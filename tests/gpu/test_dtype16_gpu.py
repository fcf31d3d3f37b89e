"""GPU tests of 16-bit inputs: the bfloat16 and float16 artifacts (``narrow/`` of the artifacts
built by ``tests/gpu/build_artifacts.py``) against the float64 reference of the inputs as the
kernel reads them (rounded to 16 bits).

Tolerance on ``max|out - ref| / max|ref|``: :func:`explorer.bench.affine.tolerance` of the output
dtype (its unit roundoff, 2**-8 for bfloat16 and 2**-11 for float16, plus float32's 1e-4), and
for the selective scan's readout y (a sum over N = 16 lanes) the 5e-4 of the float32 tests in
place of 1e-4. Outputs are poisoned with NaN before the launch (0xFFFF for bfloat16).
"""

from __future__ import annotations

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

from explorer.bench.affine import (  # noqa: E402
    affine_scan_f64,
    max_rel_error,
    random_problem,
    tolerance,
)
from explorer.bench.inputs import random_inputs  # noqa: E402
from explorer.runtime.dtypes import from_storage, to_storage  # noqa: E402

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts"
if not (ART / "index.json").exists():
    pytest.skip("no artifacts: run `python tests/gpu/build_artifacts.py` where MLIR is installed",
                allow_module_level=True)
NARROW: dict[str, dict[str, Any]] = json.loads((ART / "index.json").read_text()).get("narrow", {})
if not NARROW:
    pytest.skip("no 16-bit artifacts in the index: rebuild them", allow_module_level=True)

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
AFFINE_ARTS = sorted(n for n, i in NARROW.items() if i["recurrence"] == AFFINE)
VECTOR_ARTS = sorted(n for n, i in NARROW.items() if i["vector"])
SIZES = [(1, 1), (7, 33), (3, 4096), (9, 4095), (64, 4097), (4096, 1000), (131072, 32), (2, 2**20),
         (1, 2**22)]
#: the readout y of the selective scan sums N lanes: float32's bound there (test_cuda_runtime)
TOL_READOUT_F32 = 5e-4


def _kernel(name: str) -> CudaKernel:
    return CudaKernel.from_artifact(ART / "narrow" / name, poison=True)


def _dtypes(kernel: CudaKernel, output: str) -> tuple[str, str]:
    """(input dtype, output dtype) of an artifact."""
    return kernel.artifact.dtype, kernel.narrow.get(output, "float32")


def _rounded(x: Any, dtype: str) -> Any:
    """The float32 values of ``x`` rounded to ``dtype`` (CuPy)."""
    return from_storage(to_storage("x", x, dtype, cp), dtype, cp).astype(cp.float32)


@pytest.mark.parametrize("C,L", SIZES)
@pytest.mark.parametrize("name", AFFINE_ARTS)
def test_affine_scan_16bit_against_the_rounded_reference(name: str, C: int, L: int) -> None:
    kernel = _kernel(name)
    dtype, out_dtype = _dtypes(kernel, "h")
    a, b = random_problem(C, L, seed=C * 5 + L, xp=cp)
    h = kernel(a=a, b=b)   # float32 CuPy arrays: rounded to the dtype by the launcher
    want_dtype = cp.float16 if out_dtype == "float16" else cp.float32
    assert h.shape == (C, L) and h.dtype == want_dtype
    ref = affine_scan_f64(_rounded(a, dtype), _rounded(b, dtype), xp=cp)
    err = max_rel_error(h, ref, xp=cp)
    assert err <= tolerance(out_dtype), f"{name} C={C} L={L}: max rel err {err:.2e}"


@pytest.mark.parametrize("name", AFFINE_ARTS)
def test_torch_16bit_tensors_in_and_out(name: str) -> None:
    torch = pytest.importorskip("torch")
    kernel = _kernel(name)
    dtype, out_dtype = _dtypes(kernel, "h")
    tdtype = getattr(torch, dtype)
    a32, b32 = random_problem(64, 3000, seed=3, xp=cp)
    a, b = torch.from_dlpack(a32).to(tdtype), torch.from_dlpack(b32).to(tdtype)
    h = kernel(a=a, b=b)
    assert isinstance(h, torch.Tensor) and h.is_cuda and h.dtype == getattr(torch, out_dtype)
    assert len(kernel._plans.plans) == 1   # tensors of the kernel's dtype: a cached plan
    ref = affine_scan_f64(cp.from_dlpack(a.float()), cp.from_dlpack(b.float()), xp=cp)
    err = max_rel_error(cp.from_dlpack(h.float()), ref, xp=cp)
    assert err <= tolerance(out_dtype), f"{name}: max rel err {err:.2e}"
    # torch's rounding of the float32 inputs is the launcher's (nearest, ties to even)
    h_from_f32 = kernel(a=a32, b=b32)
    got = cp.from_dlpack(h.float())
    assert bool(cp.array_equal(cp.asarray(h_from_f32, dtype=cp.float32), got))


@pytest.mark.parametrize("C,L,N", [(1, 1, 16), (7, 33, 16), (256, 1000, 16), (3, 100, 1)])
@pytest.mark.parametrize("name", VECTOR_ARTS)
def test_selective_scan_16bit(name: str, C: int, L: int, N: int) -> None:
    import explorer

    kernel = _kernel(name)
    arrays = random_inputs(kernel, C, L, N, seed=C + L + N)   # the 16-bit inputs' exact values
    got = kernel(**arrays)
    outs = got if isinstance(got, dict) else {kernel.output_names[0]: got}
    try:
        want = explorer.reference(NARROW[name]["recurrence"], **arrays)
    except ImportError as err:   # the reference of a general recurrence needs sympy
        pytest.skip(f"explorer.reference is unavailable here: {err}")
    for o, v in outs.items():
        _, out_dtype = _dtypes(kernel, o)
        lane = kernel.output_lane[o]
        tol = tolerance(out_dtype) + (0 if lane else TOL_READOUT_F32)
        err = max_rel_error(np.asarray(v, dtype=np.float64), want[o])
        assert err <= tol, f"{name} {o} C={C} L={L} N={N}: max rel err {err:.2e} > {tol:.2e}"


def test_float16_overflow_is_refused() -> None:
    names = [n for n in AFFINE_ARTS if NARROW[n]["options"].get("dtype") == "float16"]
    if not names:
        pytest.skip("no float16 affine artifact")
    a = np.full((2, 10), 0.5, np.float32)
    b = np.full((2, 10), 1e5, np.float32)
    with pytest.raises(RecurrenceError, match="beyond float16's range"):
        _kernel(names[0])(a=a, b=b)
