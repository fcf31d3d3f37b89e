"""The float64 reference of the affine scan ``h[t] = a[t] * h[t-1] + b[t]`` and the error measure.

The benchmark times one problem beside its baselines, the scalar affine scan over ``(C, L)``
arrays, so its ground truth is computed from the arrays directly, with NumPy or CuPy (``xp``), in
float64, on the device where the arrays are.  Whether a compiled recurrence *is* that scan is for
the front end and the affine decomposition to say (:func:`affine_roles`), never the text's
spelling.  For any other recurrence the benchmark and ``scanweaver run`` use
:func:`explorer.reference`.

Long sequences are computed in chunks (a sequential scan inside each chunk, vectorised over all
chunks, then one pass over the chunks to carry the state across their boundaries), the same
arithmetic reordered; a plain loop over L would need 2**26 Python steps for L = 2**26.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import AffineForm

#: sequences shorter than this are scanned with one loop over time
SEQUENTIAL_BELOW = 4096

#: default tolerance on max|out - ref| / max|ref| for a float32 kernel
TOLERANCE = 1e-4


def tolerance(out_dtype: str = "float32") -> float:
    """The default tolerance on ``max|out - ref| / max|ref|`` for a kernel storing its outputs
    in ``out_dtype``, against the float64 reference of the inputs *as the kernel read them*
    (rounded to 16 bits when they are): the rounding of each output to ``out_dtype``, at most
    its unit roundoff ``eps/2`` (2**-8 for bfloat16, 2**-11 for float16) times the output, plus
    :data:`TOLERANCE` for the float32 arithmetic, as for float32 kernels. Neither grows with L:
    with decays |a| < 1 an output's error is that of the last steps' terms, whatever L."""
    from explorer.runtime.dtypes import UNIT_ROUNDOFF

    if out_dtype == "float32":
        return TOLERANCE
    return UNIT_ROUNDOFF[out_dtype] + TOLERANCE


def affine_scan_f64(a: Any, b: Any, xp: Any = np, h0: Any = None) -> Any:
    """Float64 ``h[c, t] = a[c, t] * h[c, t-1] + b[c, t]`` for ``(C, L)`` arrays.

    ``h0`` (``(C,)``, zeros when None) is ``h[c, -1]``.
    """
    a = xp.asarray(a, dtype=xp.float64)
    b = xp.asarray(b, dtype=xp.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"a and b must both be (C, L); got {a.shape} and {b.shape}")
    C, L = a.shape
    prev = xp.zeros(C, dtype=xp.float64) if h0 is None else xp.asarray(h0, dtype=xp.float64)
    if L < SEQUENTIAL_BELOW or L == 0:
        h = xp.empty_like(b)
        for t in range(L):
            prev = a[:, t] * prev + b[:, t]
            h[:, t] = prev
        return h
    K = 1 << max(5, math.ceil(math.log2(math.sqrt(L))))
    M = -(-L // K)
    pad = M * K - L
    if pad:
        a = xp.concatenate([a, xp.ones((C, pad), dtype=xp.float64)], axis=1)
        b = xp.concatenate([b, xp.zeros((C, pad), dtype=xp.float64)], axis=1)
    a3 = a.reshape(C, M, K)
    b3 = b.reshape(C, M, K)
    h = xp.empty_like(b3)
    p = xp.empty_like(a3)  # product of a inside the chunk up to and including k
    h[:, :, 0] = b3[:, :, 0]
    p[:, :, 0] = a3[:, :, 0]
    for k in range(1, K):
        h[:, :, k] = a3[:, :, k] * h[:, :, k - 1] + b3[:, :, k]
        p[:, :, k] = a3[:, :, k] * p[:, :, k - 1]
    carry = prev
    for j in range(M):
        h[:, j, :] += p[:, j, :] * carry[:, None]
        carry = h[:, j, K - 1]
    return h.reshape(C, M * K)[:, :L]


def max_rel_error(out: Any, ref: Any, xp: Any = np) -> float:
    """``max|out - ref| / max|ref|`` in float64; ``inf`` when ``out`` has a NaN or infinity."""
    out = xp.asarray(out, dtype=xp.float64)
    ref = xp.asarray(ref, dtype=xp.float64)
    if out.shape != ref.shape:
        raise ValueError(f"result shape {out.shape} differs from the reference {ref.shape}")
    if out.size == 0:
        return 0.0
    if not bool(xp.isfinite(out).all()):
        return math.inf
    scale = float(xp.abs(ref).max())
    return float(xp.abs(out - ref).max()) / (scale if scale > 0 else 1.0)


def random_problem(C: int, L: int, seed: int = 0, xp: Any = np) -> tuple[Any, Any]:
    """Float32 inputs: decays ``a ~ U(0.5, 1)`` (long memory, like Mamba's) and ``b ~ N(0, 1)``."""
    try:
        rng = xp.random.default_rng(seed)
        a = (0.5 + 0.5 * rng.random((C, L), dtype=xp.float32)).astype(xp.float32)
        b = rng.standard_normal((C, L), dtype=xp.float32)
    except (AttributeError, TypeError):  # an array module without the Generator API
        xp.random.seed(seed)
        a = xp.random.uniform(0.5, 1.0, (C, L)).astype(xp.float32)
        b = xp.random.standard_normal((C, L)).astype(xp.float32)
    return a, b


# --- recognising the affine scan: the decomposition says what a recurrence computes -------

def form_roles(form: AffineForm) -> tuple[str, str, str] | None:
    """``(state, a, b)`` when ``form`` is the affine scan the baselines implement, else None.

    That is a scalar form (one state, no lane axis) whose ``A_t`` is one input and ``b_t``
    another, with no parameter and no readout: ``h[t] = a[t] * h[t-1] + b[t]`` however it is
    written (``h[t] = b[t] + h[t-1] * a[t]``, ``h[t] = a[t] * (h[t-1]) + b[t]``, ...) gives
    ``("h", "a", "b")``.  A constant decay, a second lag, a parameter or a readout do not.
    """
    if form.kind != "scalar" or form.vector or form.params or form.readouts:
        return None
    A, b = form.A[0, 0], form.b[0, 0]
    if not (A.is_Symbol and b.is_Symbol) or A == b:
        return None
    a_name, b_name = str(A), str(b)
    if set(form.inputs) != {a_name, b_name}:
        return None
    return form.outputs[0], a_name, b_name


def affine_roles(recurrence: Recurrence | str) -> tuple[str, str, str] | None:
    """:func:`form_roles` of the affine decomposition of ``recurrence`` (or of its text, parsed
    by the front end); raises :class:`~explorer.errors.RecurrenceError` for text that is not a
    recurrence of the language."""
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose

    rec = recurrence if isinstance(recurrence, Recurrence) else Recurrence.parse(recurrence)
    return form_roles(decompose(rec))
