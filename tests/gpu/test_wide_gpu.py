"""GPU tests of the wide tile accesses (``scan.thread {vector_width = V}``): the artifacts under
``wide/`` of ``tests/gpu/build_artifacts.py``, each beside its twin compiled with
``vector_width=1``.

The two run the same arithmetic and differ only in how a tile reaches the stage and the
outputs leave it, whichever path (wide, or scalar for a tail, an unaligned row or an unaligned
buffer) each tile takes: their outputs agree within float32 rounding (ptxas may contract the
two kernels' arithmetic alike or not). The affine ones are also checked against the float64
reference (of the inputs rounded to the dtype) with the tolerance of
:func:`explorer.bench.affine.tolerance`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

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
WIDE: dict[str, dict[str, Any]] = json.loads((ART / "index.json").read_text()).get("wide", {})
if not WIDE:
    pytest.skip("no wide-access artifacts in the index: rebuild them", allow_module_level=True)

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
PAIRS = sorted(n for n, i in WIDE.items() if i["scalar_twin"] != n and i["scalar_twin"] in WIDE)
AFFINE_PAIRS = [n for n in PAIRS if WIDE[n]["recurrence"] == AFFINE]
OTHER_PAIRS = [n for n in PAIRS if WIDE[n]["recurrence"] != AFFINE]
#: how far two float32 kernels of the same arithmetic may differ (contraction into FMAs)
F32_APART = 1e-5
#: lengths that are and are not multiples of the vector (rows starting off a vector boundary),
#: tails shorter than a tile, and sequences cut into tiles across blocks (look-back, chunks)
SIZES = [(1, 1), (3, 7), (5, 33), (4, 1024), (7, 1027), (2, 4099), (1, 2**16 + 3), (2, 2**20),
         (1, 2**22 + 5), (4096, 64), (300, 2000)]


@functools.cache
def _kernel(name: str) -> CudaKernel:
    return CudaKernel.from_artifact(ART / "wide" / name, poison=True)


def _f32(x: Any) -> Any:
    return cp.asarray(x, dtype=cp.float32)


def _rounded(x: Any, dtype: str) -> Any:
    return from_storage(to_storage("x", x, dtype, cp), dtype, cp).astype(cp.float32)


def _moved(name: str, a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` and ``b`` as a compile with ``read_offsets`` reads them: ``x[t + k]``, zero
    outside the sequence (the float64 reference's inputs)."""
    offsets = dict(WIDE[name]["options"].get("read_offsets") or {})

    def shift(x: Any, k: int) -> Any:
        if not k:
            return x
        y = cp.zeros_like(x)
        L = x.shape[-1]
        if abs(k) < L:
            if k > 0:
                y[:, :L - k] = x[:, k:]
            else:
                y[:, -k:] = x[:, :L + k]
        return y
    return shift(a, offsets.get("a", 0)), shift(b, offsets.get("b", 0))


@pytest.mark.parametrize("C,L", SIZES)
@pytest.mark.parametrize("name", AFFINE_PAIRS)
def test_wide_and_scalar_accesses_agree_and_match_the_reference(name: str, C: int,
                                                                  L: int) -> None:
    wide, scalar = _kernel(name), _kernel(WIDE[name]["scalar_twin"])
    a, b = random_problem(C, L, seed=C * 3 + L, xp=cp)
    h_wide, h_scalar = wide(a=a, b=b), scalar(a=a, b=b)
    dtype = wide.artifact.dtype
    out_dtype = wide.narrow.get("h", "float32")
    apart = max_rel_error(_f32(h_wide), _f32(h_scalar).astype(cp.float64), xp=cp)
    assert apart <= tolerance(out_dtype), f"{name} C={C} L={L}: wide vs scalar {apart:.2e}"
    ar, br = _moved(name, _rounded(a, dtype), _rounded(b, dtype))
    if WIDE[name]["options"].get("reverse"):
        ref = affine_scan_f64(ar[:, ::-1], br[:, ::-1], xp=cp)[:, ::-1]
    else:
        ref = affine_scan_f64(ar, br, xp=cp)
    err = max_rel_error(_f32(h_wide), ref, xp=cp)
    assert err <= tolerance(out_dtype), f"{name} C={C} L={L}: max rel err {err:.2e}"


@pytest.mark.parametrize("name", [n for n in AFFINE_PAIRS
                                  if WIDE[n]["options"].get("dtype", "float32") == "float32"])
@pytest.mark.parametrize("shift", [1, 2, 3])
def test_buffers_off_a_vector_boundary(name: str, shift: int) -> None:
    """Inputs that start 4, 8 or 12 bytes past a 16-byte boundary: the scalar path, same
    results."""
    C, L = 6, 3000
    a0, b0 = random_problem(C, L, seed=shift, xp=cp)
    buf_a = cp.empty(C * L + shift, dtype=cp.float32)
    buf_b = cp.empty(C * L + shift, dtype=cp.float32)
    a = buf_a[shift:].reshape(C, L)
    b = buf_b[shift:].reshape(C, L)
    a[...] = a0
    b[...] = b0
    assert a.data.ptr % 16 != 0
    h = _kernel(name)(a=a, b=b)
    for other in (_kernel(name)(a=a0, b=b0), _kernel(WIDE[name]["scalar_twin"])(a=a, b=b)):
        assert max_rel_error(h, other.astype(cp.float64), xp=cp) <= F32_APART
    a0, b0 = _moved(name, a0, b0)
    ref = affine_scan_f64(a0, b0, xp=cp)
    if WIDE[name]["options"].get("reverse"):
        ref = affine_scan_f64(a0[:, ::-1], b0[:, ::-1], xp=cp)[:, ::-1]
    assert max_rel_error(h, ref, xp=cp) <= tolerance("float32")


@pytest.mark.parametrize("C,L", [(2, 33), (3, 1024), (2, 5000)])
@pytest.mark.parametrize("name", OTHER_PAIRS)
def test_other_recurrences_wide_and_scalar_agree(name: str, C: int, L: int) -> None:
    wide, scalar = _kernel(name), _kernel(WIDE[name]["scalar_twin"])
    arrays = random_inputs(wide, C, L, N=4, seed=L)
    got_w, got_s = wide(**arrays), scalar(**arrays)
    got_w = got_w if isinstance(got_w, dict) else {"out": got_w}
    got_s = got_s if isinstance(got_s, dict) else {"out": got_s}
    for k in got_w:
        assert bool(np.isfinite(cp.asnumpy(_f32(got_w[k]))).all()), f"{name}.{k}"
        apart = max_rel_error(_f32(got_w[k]), _f32(got_s[k]).astype(cp.float64), xp=cp)
        assert apart <= F32_APART, f"{name}.{k} C={C} L={L}: wide vs scalar {apart:.2e}"


#: a direct-layout artifact and its staged twin (same plan but ``scan.thread {layout}``)
DIRECT_TWINS = {n: n.replace("-direct", "") if WIDE.get(n.replace("-direct", "")) else
                n.replace("-direct", "-staged")
                for n in WIDE if "-direct" in n and not n.endswith("-v1")}


@pytest.mark.parametrize("C,L", [(1, 1), (3, 1000), (2, 4099), (1, 2**20 + 7), (300, 2048)])
@pytest.mark.parametrize("name", sorted(DIRECT_TWINS))
def test_direct_and_staged_layouts_agree(name: str, C: int, L: int) -> None:
    """The same plan with its tiles moved by each thread from registers (direct) and through
    the stage: every output agrees (float32 rounding, or the 16-bit output's unit roundoff)."""
    twin = DIRECT_TWINS[name]
    if twin not in WIDE:
        pytest.skip(f"no staged twin {twin}")
    direct, staged = _kernel(name), _kernel(twin)
    assert WIDE[name]["options"]["tile_layout"] == "direct"
    arrays = random_inputs(direct, C, L, N=4, seed=C + L)
    got_d, got_s = direct(**arrays), staged(**arrays)
    got_d = got_d if isinstance(got_d, dict) else {"out": got_d}
    got_s = got_s if isinstance(got_s, dict) else {"out": got_s}
    assert got_d.keys() == got_s.keys()
    tol = max(F32_APART, tolerance(direct.narrow.get("h", "float32")))
    for k in got_d:
        assert bool(np.isfinite(cp.asnumpy(_f32(got_d[k]))).all()), f"{name}.{k}"
        apart = max_rel_error(_f32(got_d[k]), _f32(got_s[k]).astype(cp.float64), xp=cp)
        assert apart <= tol, f"{name}.{k} C={C} L={L}: direct vs staged {apart:.2e}"
