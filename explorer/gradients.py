"""Stage: the gradients of a recurrence's arrays, elementwise, from the adjoint that
:mod:`explorer.autodiff` derives and compiles (the formulas of its docstring, written once for
NumPy and for torch: :class:`Ops`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import sympy

from explorer.frontend.names import h0_name
from explorer.passes.affine import LaneSum, state_symbol
from explorer.passes.lanesum import Sigmoid, Softplus, np_sigmoid, np_softplus

if TYPE_CHECKING:
    from explorer.autodiff import Backward


# ----------------------------------------------------------------------------------------------
# Arrays: one set of formulas for NumPy and torch
# ----------------------------------------------------------------------------------------------
class Ops:
    """The array operations the gradient formulas use (NumPy here; torch in torch_op)."""

    def exp(self, x: Any) -> Any:
        return np.exp(x)

    def log(self, x: Any) -> Any:
        return np.log(x)

    def tanh(self, x: Any) -> Any:
        return np.tanh(x)

    def sigmoid(self, x: Any) -> Any:
        return np_sigmoid(x)   # no overflow

    def softplus(self, x: Any) -> Any:
        return np_softplus(x)

    def abs(self, x: Any) -> Any:
        return np.abs(x)

    def sign(self, x: Any) -> Any:
        return np.sign(x)

    def sqrt(self, x: Any) -> Any:
        return np.sqrt(x)

    def power(self, x: Any, p: float) -> Any:
        return np.power(x, p)

    def maximum(self, x: Any, y: Any) -> Any:
        return np.maximum(x, y)

    def minimum(self, x: Any, y: Any) -> Any:
        return np.minimum(x, y)

    def sum(self, x: Any, axis: int) -> Any:
        return np.sum(x, axis=axis, keepdims=True)

    def cat(self, parts: list[Any]) -> Any:
        return np.concatenate(parts, axis=-1)

    def broadcast(self, x: Any, shape: tuple[int, ...]) -> Any:
        return np.broadcast_to(x, shape)

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        return np.zeros(shape, dtype=like.dtype)

    def flip(self, x: Any) -> Any:
        return np.ascontiguousarray(x[..., ::-1])

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)

    def shift(self, x: Any, k: int, init: Any, L: int) -> Any:
        """``x[t-k]`` along the last axis (see :func:`_prev`)."""
        return _prev(x, k, init, self, L)

    def next(self, x: Any) -> Any:
        """``x[t+1]`` along the last axis, the last step repeated (see :func:`_next`)."""
        return _next(x, self)

    def mul_shifted(self, r: Any, x: Any, k: int, init: Any, L: int) -> Any:
        """``r * x[t-k]``: torch computes it without laying out the shifted ``x``."""
        return r * self.shift(x, k, init, L)

    def dense(self, x: Any, shape: tuple[int, ...], like: Any) -> Any:
        """``x`` (a sum of broadcast parts) as an array of its own of ``shape``."""
        return self.zeros(shape, like) + x


NUMPY = Ops()


def evaluate(expr: sympy.Expr, env: Mapping[str, Any], ops: Ops, full: tuple[int, ...]) -> Any:
    """Evaluate a sympy expression on arrays (``env``: symbol name -> array or number).

    The arrays are in the canonical layout ``batch + (N or 1, L or 1)``; ``LaneSum`` sums over
    the state axis (second to last) after broadcasting to ``full``.  Constant subexpressions are
    folded by sympy first, so functions only ever see arrays.
    """
    if expr.is_number:
        return float(expr)
    if expr.is_Symbol:
        try:
            return env[expr.name]
        except KeyError:
            raise KeyError(f"no value for {expr.name}") from None
    args = expr.args
    if expr.is_Add or expr.is_Mul:
        total = evaluate(args[0], env, ops, full)
        for a in args[1:]:
            v = evaluate(a, env, ops, full)
            total = total + v if expr.is_Add else total * v
        return total
    if expr.is_Pow:
        base = evaluate(args[0], env, ops, full)
        p = float(args[1])
        if p == 0.5:
            return ops.sqrt(base)
        if p == -1:
            return 1.0 / base
        if p == 2:
            return base * base
        if p.is_integer() and p > 0:
            return ops.power(base, int(p))
        return ops.power(base, p)
    if isinstance(expr, LaneSum):
        inner = evaluate(args[0], env, ops, full)
        if isinstance(inner, float):
            return inner * full[-2]
        return ops.sum(ops.broadcast(inner, full), -2)
    if isinstance(expr, sympy.Max | sympy.Min):
        pick = ops.maximum if isinstance(expr, sympy.Max) else ops.minimum
        vals = [evaluate(a, env, ops, full) for a in args]
        out = vals[0]
        for v in vals[1:]:
            out = pick(out, v)
        return out
    if isinstance(expr, sympy.Heaviside):
        return (ops.sign(evaluate(args[0], env, ops, full)) + 1.0) * 0.5
    funcs = {sympy.exp: ops.exp, sympy.log: ops.log, sympy.tanh: ops.tanh, sympy.Abs: ops.abs,
             sympy.sign: ops.sign, Sigmoid: ops.sigmoid, Softplus: ops.softplus}
    f = funcs.get(expr.func)
    if f is not None:
        return f(evaluate(args[0], env, ops, full))
    raise NotImplementedError(f"cannot evaluate {type(expr).__name__}: {expr}")


class _Lazy(dict[str, Any]):
    """An environment that evaluates a shared subexpression the first time it is read."""

    def __init__(self, base: Mapping[str, Any], shared: Mapping[str, sympy.Expr], ops: Ops,
                 full: tuple[int, ...]) -> None:
        super().__init__(base)
        self.shared, self.ops, self.full = shared, ops, full
        #: the past states s[t-k]: name -> (trajectory, k, initial state), laid out only when
        #: an expression reads them other than as a factor of a product
        self.past: dict[str, tuple[Any, int, Any, int]] = {}

    def __missing__(self, name: str) -> Any:
        if name in self.past:
            x, k, init, length = self.past[name]
            value = self.ops.shift(x, k, init, length)
        elif name in self.shared:
            value = product(self.shared[name], self, self.ops, self.full)
        else:
            raise KeyError(name)
        self[name] = value
        return value


def product(expr: sympy.Expr, env: _Lazy, ops: Ops, full: tuple[int, ...],
            scale: Any = None) -> Any:
    """``scale * expr`` (``scale`` None: 1), where a product with a past state ``s[t-k]`` as a
    factor is computed on the shifted trajectory without laying out ``s[t-k]`` (one pass
    fewer, and no copy of the states)."""
    factor, rest = _past_factor(expr, tuple(sorted(env.past)))
    if factor is None or factor in env:
        if expr == 1 and scale is not None:
            return scale   # the array itself (the gradient of b in a * h + b is lam)
        value = evaluate(expr, env, ops, full)
        return value if scale is None else scale * value
    r = scale
    if rest != 1:
        v = evaluate(rest, env, ops, full)
        r = v if r is None else r * v
    x, k, init, length = env.past[factor]
    if r is None or isinstance(r, float):
        value = env[factor]
        return value if r is None else r * value
    return ops.mul_shifted(r, x, k, init, length)


@functools.lru_cache(maxsize=1024)
def _past_factor(expr: sympy.Expr, past: tuple[str, ...]) -> tuple[str | None, sympy.Expr]:
    """(the past state that is a factor of ``expr``, the other factors) when exactly one is;
    (None, expr) otherwise.  Cached: the backward reads the same expressions every call."""
    factors = sympy.Mul.make_args(expr)
    hits = [f for f in factors if f.is_Symbol and f.name in past]
    if len(hits) != 1:
        return None, expr
    return hits[0].name, sympy.Mul(*[f for f in factors if f is not hits[0]])


def canonical_shape(shape: tuple[int, ...], timed: bool, lane: bool, rank: int
                    ) -> tuple[int, ...]:
    """The shape of an array in the canonical layout ``batch + (N or 1, L or 1)``, its batch
    padded with leading 1s to ``rank`` axes."""
    s = list(shape)
    if not timed:
        s.append(1)
    if not lane:
        s.insert(len(s) - 1, 1)
    return (1,) * (rank + 2 - len(s)) + tuple(s)


def reduce_to(x: Any, shape: tuple[int, ...], ops: Ops) -> Any:
    """``x`` summed over the axes that ``shape`` (same rank) broadcasts, then broadcast to
    ``shape`` (a derivative constant along an axis of the array)."""
    if isinstance(x, float):
        return x
    xs = ops.shape(x)
    for axis, (have, want) in enumerate(zip(xs, shape)):
        if want == 1 and have != 1:
            x = ops.sum(x, axis)
    return ops.broadcast(x, shape)


def _prev(x: Any, k: int, init: Any, ops: Ops, L: int) -> Any:
    """``x[t-k]`` along the last axis: ``init`` at t = k-1 (h[-1], zero when None), zeros
    before."""
    if k == 0:
        return x
    lead = ops.shape(x)[:-1]
    parts = [ops.zeros((*lead, k - 1), x)] if k > 1 else []
    first = ops.zeros((*lead, 1), x) if init is None else ops.broadcast(init, (*lead, 1))
    parts += [first, x[..., :max(L - k, 0)]]
    out = ops.cat(parts)
    return out[..., :L] if k > L else out


def _next(x: Any, ops: Ops) -> Any:
    """``x[t+1]`` along the last axis, the last step repeated."""
    if ops.shape(x)[-1] <= 1:
        return x
    return ops.cat([x[..., 1:], x[..., -1:]])


def gradients(bw: Backward, ops: Ops, arrays: Mapping[str, Any], states: Mapping[str, Any],
              cotangents: Mapping[str, Any], scan: Callable[..., dict[str, Any]],
              reverse: bool = False, L: int | None = None,
              needed: set[str] | None = None,
              in_place: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The gradients of every array in ``arrays`` (names of the forward: inputs, parameters,
    initial states), shaped like them.

    ``states`` are the forward's state outputs and ``cotangents`` the gradients of the outputs
    (missing: zero), all shaped as the forward returns them; ``scan(call)`` runs the compiled
    adjoint on ``call`` (name -> array, the backward recurrence's own layout) and returns its
    outputs; ``scan(call, sums)`` may sum the lane readouts ``sums`` names to the batch shape
    given (or return them whole).  ``reverse``: the forward was a reverse scan.  ``needed``
    restricts the result.
    ``in_place``: the adjoint's inputs that ``scan`` reads at another time itself (the
    compile's ``read_offsets``): they are passed as the forward's arrays, not shifted copies.
    """
    rec, form = bw.forward, bw.form
    names = bw.names
    lane_of = rec.lane_names
    vector = rec.vector
    specs = {n: (True, n in lane_of) for n in rec.inputs}
    specs.update({n: (False, n in lane_of) for n in rec.params})
    specs.update({h0_name(s): (False, vector) for s in rec.states})
    shapes = {n: tuple(ops.shape(v)) for n, v in arrays.items()}
    # the batch and sizes, from the forward's states (which are full-size)
    s0 = states[rec.states[0]]
    full_state = tuple(ops.shape(s0))
    batch = full_state[:-2] if vector else full_state[:-1]
    length = full_state[-1]
    N = full_state[-2] if vector else 1
    full = (*batch, N, length)
    rank = len(batch)

    def to_canonical(name: str, x: Any) -> Any:
        timed, lane = specs[name]
        return x.reshape(canonical_shape(tuple(ops.shape(x)), timed, lane, rank))

    def flip(x: Any) -> Any:
        return ops.flip(x) if reverse else x

    views = {n: to_canonical(n, v) for n, v in arrays.items()}
    for n in rec.inputs:
        if n in views:
            views[n] = flip(views[n])
    traj = {s: flip(v if vector else v.reshape((*batch, 1, length))) for s, v in states.items()}
    h0 = {s: views.get(h0_name(s)) for s in rec.states}
    if length == 0:
        return {n: ops.zeros(shapes[n], v) for n, v in arrays.items()
                if needed is None or n in needed}

    # --- the environment: inputs, parameters, past states, cotangents -------------------------
    env = _Lazy({n: v for n, v in views.items() if n in rec.inputs + rec.params},
                bw.shared, ops, full)
    like = s0
    for s in rec.states:
        env[state_symbol(s, 0).name] = traj[s]
        for k in range(1, form.recurrence.order[s] + 1):
            env.past[state_symbol(s, k).name] = (traj[s], k, h0[s], length)
    for o in form.outputs:
        g = cotangents.get(o)
        lane = form.output_is_lane(o)
        if g is None:
            # an output the loss does not read: zeros of one sequence, which every sequence
            # shares (the adjoint's kernels read such an input where it is, a row shared by
            # all channels, where a broadcast view was laid out as B x D x N x L zeros)
            g = ops.zeros((1,) * rank + (N if lane else 1, length), like)
        else:
            g = flip(g if lane else g.reshape((*batch, 1, length)))
        env[names.cotangent[o]] = g

    # --- the adjoint scan --------------------------------------------------------------------
    call: dict[str, Any] = {}
    brec = bw.recurrence
    moved = dict(in_place or {})
    if any(names.read_offsets.get(n) != k for n, k in moved.items()):
        raise ValueError(f"the adjoint reads {moved} in place; the backward's arrays at other "
                         f"times are {names.read_offsets}")
    for n in brec.inputs + brec.params:
        if n in names.next.values():
            x = next(k for k, v in names.next.items() if v == n)
            value = env[x] if n in moved else ops.next(env[x])
        elif n in names.trajectory.values():
            s = next(k for k, v in names.trajectory.items() if v == n)
            value = env[state_symbol(s, 0).name]
        elif n in names.previous.values():   # h[t-1], read by the adjoint's summed readouts
            s = next(k for k, v in names.previous.items() if v == n)
            value = env[state_symbol(s, 0 if n in moved else 1).name]
        elif n in names.direct.values():
            c = next(k for k, v in names.direct.items() if v == n)
            i = form.components.index(c)
            value = ops.broadcast(evaluate(bw.reduced[("direct", "", i)], env, ops, full),
                                  full)
        else:
            value = env[n]
        call[n] = _call_layout(value, n in brec.inputs, n in brec.lane_names)
    # a lane input's gradient, summed in the adjoint's kernel to the input's own batch shape
    sums = {names.lane[n]: tuple(ops.shape(views[n]))[:rank] for n in names.lane
            if n in views and (needed is None or n in needed)}
    lam_call = scan(call, sums) if sums else scan(call)
    lam = {}
    for i, c in enumerate(form.components):
        v = lam_call[names.adjoint[c]]
        lam[i] = _widen(v, vector, batch, N, length, ops)

    # --- the gradients -----------------------------------------------------------------------
    out: dict[str, Any] = {}
    for n in arrays:
        if (needed is not None and n not in needed) or n not in specs or \
                n not in rec.inputs + rec.params:
            continue
        # the terms through the scan vary along n with lam; a readout's only where its
        # derivative does (dL/dD of sum(C * h) + D * x is per channel, not per lane)
        grads = []
        if n in names.lane:   # the whole gradient: a lane readout of the adjoint
            v = lam_call[names.lane[n]]
            own = tuple(ops.shape(v))[:-2]
            grads.append(v if own == sums.get(names.lane[n]) else
                         _widen(v, True, batch, N, length, ops))
        elif n in names.summed:   # the scan terms, summed over n in the adjoint's kernel
            grads.append(_widen(lam_call[names.summed[n]], False, batch, N, length, ops))
            if any(v in moved for v in names.previous.values()):
                grads += _first_step(bw, n, ops, views, traj, h0, lam, full)
        else:
            for i, _ in bw.scan_terms.get(n, []):
                grads.append(product(bw.reduced[("scan", n, i)], env, ops, full, lam[i]))
        for r, _ in [] if n in names.lane else bw.readout_terms.get(n, []):
            grads.append(product(bw.reduced[("readout", n, r)], env, ops, full,
                                 env[names.cotangent[r]]))
        canon = ops.shape(views[n])
        g = None
        for part in grads:
            part = reduce_to(part, canon, ops)
            g = part if g is None else g + part
        g = ops.zeros(canon, like) if g is None else ops.dense(g, canon, like)
        if n in rec.inputs:
            g = flip(g)
        out[n] = g.reshape(shapes[n])
    at0: dict[str, Any] | None = None   # the arrays at t = 0, made when an h0 needs them
    for s in rec.states:
        key = h0_name(s)
        if key not in arrays or (needed is not None and key not in needed):
            continue
        if at0 is None:
            at0 = {k: (v[..., :1] if k in rec.inputs else v) for k, v in env.items()}
        canon = ops.shape(views[key])
        g = ops.zeros(canon, like)
        for i, e in bw.h0_terms[s]:
            g = g + reduce_to(lam[i][..., :1] * evaluate(e, at0, ops, full), canon, ops)
        out[key] = g.reshape(shapes[key])
    return out


def _widen(v: Any, lane: bool, batch: tuple[int, ...], N: int, length: int, ops: Ops) -> Any:
    """An output of the adjoint in the canonical ``batch + (N or 1, L)`` layout. Its batch is
    that of the adjoint's inputs, which may share one row among all sequences (an output the
    loss does not read gives zeros of one sequence): then every sequence's adjoint is that
    row, broadcast."""
    own = tuple(ops.shape(v))[:-2 if lane else -1]
    if own == batch:
        return v if lane else v.reshape((*batch, 1, length))
    lead = (1,) * (len(batch) - len(own)) + own
    return ops.broadcast(v.reshape((*lead, N if lane else 1, length)),
                         (*batch, N if lane else 1, length))


def _first_step(bw: Backward, name: str, ops: Ops, views: Mapping[str, Any],
                traj: Mapping[str, Any], h0: Mapping[str, Any], lam: Mapping[int, Any],
                full: tuple[int, ...]) -> list[Any]:
    """The share of the initial states in the summed gradient of ``name`` at t = 0, as a
    ``batch + (1, L)`` array zero after t = 0 (none when no initial state is given): the
    adjoint's kernel read the states at t - 1 in place, zero before the first step, and a
    scan term is linear in them, so the share is the term with ``h[-1] = h0`` less the term
    with zero, summed over n."""
    rec = bw.forward
    if all(h0.get(s) is None for s in rec.states):
        return []
    first = {k: (v[..., :1] if k in rec.inputs else v) for k, v in views.items()
             if k in rec.inputs or k in rec.params}
    for s in rec.states:
        first[state_symbol(s, 0).name] = traj[s][..., :1]
    past = {state_symbol(s, 1).name: s for s in rec.states}
    x = traj[rec.states[0]]
    share = None
    for i, e in bw.scan_terms.get(name, []):
        if not any(sym.name in past for sym in e.free_symbols):
            continue
        diff = None
        for given in (True, False):
            env = dict(first)
            for sym, s in past.items():
                v = h0.get(s) if given else None
                at0 = traj[s][..., :1]
                env[sym] = v if v is not None else ops.zeros(tuple(ops.shape(at0)), x)
            term = evaluate(e, env, ops, (*full[:-1], 1))
            diff = term if diff is None else diff - term
        part = ops.sum(lam[i][..., :1] * diff, -2)
        share = part if share is None else share + part
    if share is None:
        return []
    L = full[-1]
    lead = tuple(ops.shape(share))[:-1]
    return [ops.cat([share, ops.zeros((*lead, L - 1), x)]) if L > 1 else share]


def _call_layout(x: Any, timed: bool, lane: bool) -> Any:
    """A canonical ``batch + (N or 1, L or 1)`` array in the layout a call takes."""
    if timed and lane:
        return x
    if timed:
        return x[..., 0, :]
    if lane:
        return x[..., :, 0]
    return x[..., 0, 0]
