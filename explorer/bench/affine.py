"""The float64 reference of the affine scan ``h[t] = a[t] * h[t-1] + b[t]`` and the error measure.

The benchmark times one problem, the scalar affine scan over ``(C, L)`` arrays, so its ground
truth needs no symbolic machinery: this module computes it from the arrays directly, with NumPy
or CuPy (``xp``), in float64.  That keeps ``scanweaver bench`` free of sympy and MLIR.  For any
other recurrence the tests and ``scanweaver run`` use :func:`explorer.reference` where it imports.

Long sequences are computed in chunks (a sequential scan inside each chunk, vectorised over all
chunks, then one pass over the chunks to carry the state across their boundaries), the same
arithmetic reordered; a plain loop over L would need 2**26 Python steps for L = 2**26.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

#: sequences shorter than this are scanned with one loop over time
SEQUENTIAL_BELOW = 4096

#: default tolerance on max|out - ref| / max|ref| for a float32 kernel
TOLERANCE = 1e-4


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


# --- recognising the affine scan without sympy ---------------------------------------------

_NAME = r"([A-Za-z_]\w*)"


def affine_roles(text: str) -> tuple[str, str, str] | None:
    """``(state, a, b)`` when ``text`` is the scalar affine scan written in one of its usual forms.

    ``h[t] = a[t] * h[t-1] + b[t]`` (either product order, either order of the sum) gives
    ``("h", "a", "b")``; anything else gives None.  Used where sympy is absent; with sympy the
    affine decomposition answers the general question.
    """
    s = re.sub(r"\s+", "", text.strip())
    if "\n" in text.strip() or ";" in s:
        return None
    m = re.fullmatch(_NAME + r"\[t\]=(.*)", s)
    if not m:
        return None
    h, rhs = m.group(1), m.group(2)
    prev = re.escape(h) + r"\[t-1\]"
    x = _NAME + r"\[t\]"
    prods = [x + r"\*" + prev, prev + r"\*" + x]
    for prod in prods:
        for pattern in (prod + r"\+" + x, x + r"\+" + prod):
            mm = re.fullmatch(pattern, rhs)
            if mm:
                g = mm.groups()
                a, b = (g[0], g[1]) if pattern.startswith(prod) else (g[1], g[0])
                if len({h, a, b}) == 3:
                    return h, a, b
    return None
