"""The float64 ground truth: `reference(rec, **arrays)`.

Shape rules (see :mod:`explorer.runtime.shapes`): time is the last axis.  An input ``x[t]`` is
``(..., L)``; ``B[t, n]`` is ``(..., N, L)``; a parameter ``D`` is ``(...)`` and ``A[n]`` is
``(..., N)``.  Batch dimensions broadcast NumPy-style.  The initial state is zero unless
``h0=`` (``<state>0=`` for each state) gives ``h[-1]``, shaped like a parameter (``(...)`` or
``(..., N)``); older history (``h[-2]``, ...) is zero.

Results: a state is ``batch + (L,)`` (``batch + (N, L)`` for a vector state), a readout
``batch + (L,)``.  One output is returned as an array; several as a dict name -> array.

The scan runs sequentially in float64, vectorised over channels; for long sequences with few
channels it runs in chunks (a sequential scan inside each chunk, then the carries between chunks
in order), which is the same arithmetic reordered and keeps the reference fast enough for
``L = 2**26``.  :func:`interpret` is a slower, independent oracle that evaluates the statements
as written, step by step, without the affine decomposition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from explorer.errors import RecurrenceError
from explorer.frontend.names import h0_name
from explorer.frontend.recurrence import Binary, Call, Expr, Num, Recurrence, Ref, Unary, fold
from explorer.passes.affine import AffineForm, decompose
from explorer.passes.lanesum import np_sigmoid, np_softplus
from explorer.runtime.shapes import ArgSpec, canonical_views

#: below this many steps a plain sequential loop is used
_CHUNK_ABOVE = 4096


def arg_specs(rec: Recurrence) -> list[ArgSpec]:
    """The arrays a recurrence reads: inputs then parameters."""
    return [ArgSpec(n, True, n in rec.lane_names) for n in rec.inputs] + [
        ArgSpec(n, False, n in rec.lane_names) for n in rec.params]


def h0_specs(rec: Recurrence) -> list[ArgSpec]:
    """The initial states a call may give: ``<state>0``, shaped like a parameter."""
    return [ArgSpec(h0_name(s), False, rec.vector) for s in rec.states]


def _as_recurrence(rec: Recurrence | AffineForm | str) -> tuple[Recurrence, AffineForm]:
    if isinstance(rec, AffineForm):
        return rec.recurrence, rec
    if isinstance(rec, str):
        rec = Recurrence.parse(rec)
    if not isinstance(rec, Recurrence):
        raise TypeError(f"expected a Recurrence or its text, got {type(rec).__name__}")
    return rec, decompose(rec)


def _split_h0(rec: Recurrence, arrays: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    data = dict(arrays)
    h0 = {}
    for spec in h0_specs(rec):  # the front end refuses any other name spelled so
        if spec.name in data:
            h0[spec.name] = data.pop(spec.name)
    return data, h0


def at_offsets(arrays: Mapping[str, Any], offsets: Any) -> dict[str, Any]:
    """The arrays a compile with ``read_offsets`` (the plan's ``scan.read``) reads: each
    named one (indexed by time along its last axis) moved by its offset in time, ``x[t + k]``,
    zero where ``t + k`` is outside the sequence (float64); the others as they are. Apply
    before flipping the inputs of a reverse compile: offsets are in time, not scan order."""
    shift = dict(offsets or ())
    out: dict[str, Any] = {}
    for name, x in arrays.items():
        k = shift.get(name, 0)
        if not k:
            out[name] = x
            continue
        x = np.asarray(x, dtype=np.float64)
        y = np.zeros_like(x)
        L = x.shape[-1]
        if abs(k) < L:
            if k > 0:
                y[..., :L - k] = x[..., k:]
            else:
                y[..., -k:] = x[..., :L + k]
        out[name] = y
    return out


def _results(rec: Recurrence, out: dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
    return next(iter(out.values())) if len(out) == 1 else out


def reference(rec: Recurrence | AffineForm | str, /, L: int | None = None, **arrays: Any
              ) -> np.ndarray | dict[str, np.ndarray]:
    """Float64 sequential ground truth of the recurrence over the given arrays.

    ``rec`` is positional only, so that an array may be called ``rec``; a parameter or an
    initial state may be a number (``gamma=0.9``).
    """
    rec, form = _as_recurrence(rec)
    data, h0 = _split_h0(rec, arrays)
    specs = arg_specs(rec)
    views, batch, N, length = canonical_views(specs, data, L)
    N = N if rec.vector else 1
    full = (*batch, N, length)
    A, b = form.coefficients(views, full)  # (*batch, N, S, S, L), (*batch, N, S, L)
    S = form.size
    M = math.prod(batch) * N
    A = np.moveaxis(A.reshape(M, S, S, length), -1, 1)  # (M, L, S, S)
    b = np.moveaxis(b.reshape(M, S, length), -1, 1)  # (M, L, S)
    init = np.zeros((M, S))
    for s in rec.states:
        name = h0_name(s)
        if name in h0:
            v, _, _, _ = canonical_views([ArgSpec(name, False, rec.vector)], {name: h0[name]}, L=1)
            try:
                vb = np.broadcast_to(v[name][..., 0], (*batch, N))
            except ValueError:
                raise RecurrenceError(f"{name} has shape {np.shape(h0[name])}, which does not "
                                      f"broadcast to the batch {batch}"
                                      + (f" x N={N}" if rec.vector else "")) from None
            init[:, form.component_index(s)] = vb.reshape(M)
    states = scan(A, b, init)  # (M, L, S)

    out: dict[str, np.ndarray] = {}
    env = dict(views)
    for s in rec.states:
        h = states[:, :, form.component_index(s)].reshape(*batch, N, length)
        env[str(form.state_symbols[form.component_index(s)])] = h
        out[s] = h if rec.vector else h[..., 0, :]
    from explorer.passes.numeric import evaluate

    for r, e in form.readouts.items():
        y = np.broadcast_to(np.asarray(evaluate(e, env), dtype=np.float64), full)
        out[r] = np.ascontiguousarray(y if r in rec.lane_readouts else y[..., 0, :])
    return _results(rec, out)


def scan(A: np.ndarray, b: np.ndarray, init: np.ndarray) -> np.ndarray:
    """``s_t = A_t s_{t-1} + b_t`` for A (M, L, S, S), b (M, L, S), init (M, S) -> (M, L, S)."""
    M, length, S = b.shape
    if length == 0:
        return np.zeros((M, 0, S))
    if length <= _CHUNK_ABOVE:
        return _scan_loop(A, b, init)
    m = max(1, math.isqrt(length * max(1, 1024 // max(M, 1))))
    m = min(m, length)
    K = -(-length // m)
    pad = K * m - length
    if pad:
        eye = np.broadcast_to(np.eye(S), (M, pad, S, S))
        A = np.concatenate([A, eye], axis=1)
        b = np.concatenate([b, np.zeros((M, pad, S))], axis=1)
    Ac = A.reshape(M * K, m, S, S)
    bc = b.reshape(M * K, m, S)
    local = _scan_loop(Ac, bc, np.zeros((M * K, S))).reshape(M, K, m, S)
    prods = _prefix_products(Ac).reshape(M, K, m, S, S)
    carry = init.copy()
    carries = np.empty((M, K, S))
    for k in range(K):
        carries[:, k] = carry
        carry = _apply(prods[:, k, -1], carry) + local[:, k, -1]
    result = local + np.einsum("mkiab,mkb->mkia", prods, carries)
    return result.reshape(M, K * m, S)[:, :length]


def _apply(A: np.ndarray, s: np.ndarray) -> np.ndarray:
    if A.shape[-1] == 1:
        return A[..., 0] * s
    return np.einsum("...ij,...j->...i", A, s)


def _scan_loop(A: np.ndarray, b: np.ndarray, init: np.ndarray) -> np.ndarray:
    M, length, S = b.shape
    out = np.empty((M, length, S))
    h = init.copy()
    if S == 1:
        a1, b1 = A[:, :, 0, 0], b[:, :, 0]
        h1 = h[:, 0]
        o1 = out[:, :, 0]
        for t in range(length):
            h1 = a1[:, t] * h1 + b1[:, t]
            o1[:, t] = h1
        return out
    for t in range(length):
        h = np.einsum("mij,mj->mi", A[:, t], h) + b[:, t]
        out[:, t] = h
    return out


def _prefix_products(A: np.ndarray) -> np.ndarray:
    """P_i = A_i A_(i-1) ... A_0 along axis 1."""
    out = np.empty_like(A)
    p = np.broadcast_to(np.eye(A.shape[-1]), (A.shape[0], A.shape[-1], A.shape[-1])).copy()
    for i in range(A.shape[1]):
        p = A[:, i] @ p
        out[:, i] = p
    return out


# ----------------------------------------------------------------------------------------------
# An independent oracle: the statements as written, one time step after another
# ----------------------------------------------------------------------------------------------
_NP_FUNCS: dict[str, Callable[[Any], Any]] = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt, "abs": np.abs,
    "sigmoid": np_sigmoid, "softplus": np_softplus,   # no overflow at any x
}


def interpret(rec: Recurrence | str, /, L: int | None = None, **arrays: Any
              ) -> np.ndarray | dict[str, np.ndarray]:
    """Evaluate the statements step by step in float64 (slow; for checking the compiler)."""
    if isinstance(rec, str):
        rec = Recurrence.parse(rec)
    data, h0 = _split_h0(rec, arrays)
    views, batch, N, length = canonical_views(arg_specs(rec), data, L)
    N = N if rec.vector else 1
    full = (*batch, N)
    history: dict[str, list[np.ndarray]] = {}
    for s in rec.states:
        start = np.zeros(full)
        key = h0_name(s)
        if key in h0:
            v, _, _, _ = canonical_views([ArgSpec(key, False, rec.vector)], {key: h0[key]}, L=1)
            start = np.broadcast_to(v[key][..., 0], full).astype(np.float64)
        history[s] = [np.zeros(full)] * (rec.order[s] - 1) + [start]
    outs: dict[str, list[np.ndarray]] = {n: [] for n in rec.states + rec.readouts}

    ops: dict[str, Callable[[Any, Any], Any]] = {
        "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "**": np.power}

    def ev(expr: Expr, t: int, current: dict[str, np.ndarray]) -> Any:
        def visit(e: Expr, args: list[Any]) -> Any:
            if isinstance(e, Num):
                return e.value
            if isinstance(e, Ref):
                if e.name in history:
                    if e.lag == 0:
                        return current[e.name]
                    return history[e.name][-(e.lag or 0)]
                v = views[e.name]
                return v[..., t] if e.lag is not None else v[..., 0]
            if isinstance(e, Unary):
                return -args[0] if e.op == "-" else args[0]
            if isinstance(e, Binary):
                return ops[e.op](np.asarray(args[0], dtype=np.float64), args[1])
            assert isinstance(e, Call)
            if e.func == "sum":
                return np.sum(np.broadcast_to(args[0], full), axis=-1, keepdims=True)
            if e.func in ("max", "min"):
                return (np.maximum if e.func == "max" else np.minimum)(*args)
            return _NP_FUNCS[e.func](np.asarray(args[0], dtype=np.float64))

        # bottom-up without recursion: a legal sum may be thousands of terms deep
        return fold(expr, visit)

    lanes = set(rec.lane_readouts)
    for t in range(length):
        current: dict[str, np.ndarray] = {}
        for s in rec.states:
            current[s] = np.broadcast_to(ev(rec.statement(s).expr, t, current), full)
        for s in rec.states:
            history[s] = history[s][1:] + [current[s]]
            outs[s].append(current[s])
        for r in rec.readouts:
            y = np.broadcast_to(ev(rec.statement(r).expr, t, current), full)
            outs[r].append(y if r in lanes else y[..., 0])
    out: dict[str, np.ndarray] = {}
    for name, steps in outs.items():
        arr = np.stack(steps, axis=-1) if steps else np.zeros((*full, 0))
        if name in rec.states and not rec.vector:
            arr = arr[..., 0, :]
        if name in rec.readouts and name not in lanes and not steps:
            arr = arr[..., 0, :]
        out[name] = arr
    return _results(rec, out)


def named_outputs(recurrence: Recurrence | str, ref: Any) -> dict[str, Any]:
    """The outputs :func:`reference` returned, by name: one output comes back bare, and it is
    the recurrence's only state or readout (never a compile's first output, which may be a
    last state)."""
    if isinstance(ref, dict):
        return dict(ref)
    rec = Recurrence.parse(recurrence) if isinstance(recurrence, str) else recurrence
    return {(tuple(rec.states) + tuple(rec.readouts))[0]: ref}


def stored_reference(recurrence: Recurrence | str, ref: Any, stored: tuple[str, ...],
                     reverse: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
    """The reference of every output a compile stores (``stored``: its outputs, last states
    included), and what each is compared with, in words.

    ``ref`` is what :func:`reference` returned for the whole sequence (time the last axis). A
    last state (``h_last``) is that state after the last step of the scan: time ``L - 1``, or
    time 0 scanning backwards. An output the reference cannot give raises ``ValueError``
    naming it."""
    from explorer.frontend.names import LAST_SUFFIX

    rec = Recurrence.parse(recurrence) if isinstance(recurrence, str) else recurrence
    expected = named_outputs(rec, ref)
    wanted: dict[str, Any] = {}
    about: dict[str, str] = {}
    for name in stored:
        if name in expected:
            wanted[name] = expected[name]
            about[name] = f"reference {name}"
            continue
        state = name[:-len(LAST_SUFFIX)] if name.endswith(LAST_SUFFIX) else None
        if state is None or state not in expected or state not in rec.states:
            raise ValueError(f"the compile stores {name}, which explorer.reference does not "
                             f"give (it gives {', '.join(expected)})")
        step = 0 if reverse else -1
        wanted[name] = np.asarray(expected[state])[..., step]
        about[name] = f"reference {state}[..., {'0' if reverse else 'L-1'}] (the last state)"
    return wanted, about
