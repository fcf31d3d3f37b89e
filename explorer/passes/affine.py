"""Stage 2, affine decomposition: `Recurrence` -> `AffineForm` (sympy).

Every state update is affine in the past of the states, so the whole system is

    s_t = A_t s_{t-1} + b_t

with ``s`` the state vector: one entry per state and lag (a recurrence of order k contributes
``h[t], h[t-1], ..., h[t-k+1]``: the companion form).  ``A_t`` and ``b_t`` depend only on the
inputs at time t and the parameters, which is what makes the scan parallel: the pairs
``(A_t, b_t)`` compose with the associative operator

    (A2, b2) o (A1, b1) = (A2 A1, A2 b1 + b2)        identity (I, 0)

For a vector state (axis n) the system holds per lane: ``A_t`` is diagonal across lanes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

import numpy as np
import sympy

from explorer.frontend.recurrence import (
    Binary,
    Call,
    Expr,
    Num,
    Recurrence,
    Ref,
    Unary,
    fold,
)
from explorer.passes.lanesum import LaneSum, Sigmoid, Softplus
from explorer.passes.numeric import evaluate

if TYPE_CHECKING:
    from collections.abc import Mapping


def symbol(name: str) -> sympy.Symbol:
    """The sympy symbol that stands for an input or a parameter."""
    return sympy.Symbol(name, real=True)


@functools.lru_cache(maxsize=4096)
def state_symbol(name: str, lag: int) -> sympy.Symbol:
    """The sympy symbol that stands for ``name[t-lag]`` of a state (made once: a backward
    asks for the same few on every call)."""
    return sympy.Symbol(f"{name}[t]" if lag == 0 else f"{name}[t-{lag}]", real=True)


class _Terms(list[sympy.Expr]):
    """The terms of a ``+``/``-`` chain, summed once when the chain ends."""


class _Factors(list[sympy.Expr]):
    """The factors of a ``*`` chain, multiplied once when the chain ends."""


_Part: TypeAlias = "sympy.Expr | _Terms | _Factors"


def to_sympy(expr: Expr, states: Mapping[tuple[str, int], sympy.Expr]) -> sympy.Expr:
    """Translate the language's expression tree into sympy (sigmoid and softplus as the functions
    of :mod:`explorer.passes.lanesum`).

    Bottom-up without recursion (a legal sum may be thousands of terms deep); the terms of a
    chain of ``+``/``-`` (factors of ``*``) are collected and handed to sympy once, which keeps
    a long sum linear instead of re-flattening a growing ``Add`` at every term.
    """

    def visit(e: Expr, kids: list[_Part]) -> _Part:
        if isinstance(e, Num):
            v = e.value
            if float(v).is_integer() and abs(v) < 2**53:
                return sympy.Integer(int(v))
            return sympy.Float(v)
        if isinstance(e, Ref):
            if e.lag is not None and (e.name, e.lag) in states:
                return states[(e.name, e.lag)]
            return symbol(e.name)
        if isinstance(e, Unary):
            operand = _done(kids[0])
            return -operand if e.op == "-" else operand
        if isinstance(e, Binary):
            left, right = kids
            if e.op in "+-":
                terms = left if isinstance(left, _Terms) else _Terms([_done(left)])
                r = _done(right)
                terms.append(r if e.op == "+" else -r)
                return terms
            if e.op == "*":
                factors = left if isinstance(left, _Factors) else _Factors([_done(left)])
                factors.append(_done(right))
                return factors
            if e.op == "/":
                return _done(left) / _done(right)
            return _done(left) ** _done(right)
        assert isinstance(e, Call)
        return _call(e.func, [_done(k) for k in kids])

    return _done(fold(expr, visit))


def _done(part: _Part) -> sympy.Expr:
    if isinstance(part, _Terms):
        return sympy.Add(*part)
    if isinstance(part, _Factors):
        return sympy.Mul(*part)
    return part


def _call(f: str, args: list[sympy.Expr]) -> sympy.Expr:
    if f == "exp":
        return sympy.exp(args[0])
    if f == "log":
        return sympy.log(args[0])
    if f == "tanh":
        return sympy.tanh(args[0])
    if f == "sqrt":
        return sympy.sqrt(args[0])
    if f == "abs":
        return sympy.Abs(args[0])
    if f == "sigmoid":
        return Sigmoid(args[0])
    if f == "softplus":
        return Softplus(args[0])
    if f == "max":
        return sympy.Max(*args)
    if f == "min":
        return sympy.Min(*args)
    assert f == "sum", f
    return LaneSum(args[0])


@dataclass(frozen=True)
class AffineForm:
    """``s_t = A_t s_{t-1} + b_t`` with the readouts ``y_t = f(s_t, inputs)``."""

    recurrence: Recurrence
    components: tuple[tuple[str, int], ...]
    A: sympy.Matrix
    b: sympy.Matrix
    state_symbols: tuple[sympy.Symbol, ...]
    readouts: dict[str, sympy.Expr]

    # -- shape facts -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.components)

    @property
    def vector(self) -> bool:
        return self.recurrence.vector

    @property
    def kind(self) -> Literal["scalar", "diagonal", "dense"]:
        if self.size > 1:
            return "dense"
        return "diagonal" if self.vector else "scalar"

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.recurrence.inputs

    @property
    def params(self) -> tuple[str, ...]:
        return self.recurrence.params

    @property
    def lane_names(self) -> frozenset[str]:
        return self.recurrence.lane_names

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.recurrence.states + self.recurrence.readouts

    def output_is_lane(self, name: str) -> bool:
        """A value per step and lane: a vector state, or a lane readout (``g[t, n]``)."""
        return self.vector and (name in self.recurrence.states
                                or name in self.recurrence.lane_readouts)

    def component_index(self, state: str) -> int:
        """Index of ``state[t]`` in the state vector."""
        return self.components.index((state, 0))

    # -- renderings --------------------------------------------------------------------------
    def as_text(self) -> str:
        lane = "  (per lane n)" if self.vector else ""
        comps = ", ".join(str(s) for s in self.state_symbols)
        lines = [f"state s_t = [{comps}]   size {self.size}, {self.kind}{lane}",
                 "s_t = A_t s_(t-1) + b_t", ""]
        lines.append("A_t =")
        lines += ["  " + row for row in sympy.pretty(self.A, use_unicode=True).splitlines()]
        lines.append("b_t =")
        lines += ["  " + row for row in sympy.pretty(self.b, use_unicode=True).splitlines()]
        for name, e in self.readouts.items():
            at = "[t, n]" if self.output_is_lane(name) else "[t]"
            lines.append(f"{name}{at} = {sympy.sstr(e)}")
        lines += ["", "combine: (A2, b2) o (A1, b1) = (A2 A1, A2 b1 + b2)    identity: (I, 0)"]
        return "\n".join(lines)

    def to_latex(self) -> dict[str, str]:
        """LaTeX of each piece: 'state', 'A', 'b', 'update', 'combine', 'identity', readouts."""
        s_vec = sympy.Matrix(self.state_symbols)
        # a name of several underscores keeps its first as the subscript and shows the others
        # (sympy writes grad_sum_dt as grad_{sum dt}, which MathJax shows as "sumdt")
        pieces = [s_vec, self.A, self.b, *self.readouts.values(),
                  *(symbol(n) for n in self.readouts)]
        names = {x: _subscripted(x.name) for p in pieces for x in p.free_symbols
                 if x.name.count("_") > 1}

        def latex(e: sympy.Basic) -> str:
            return sympy.latex(e, symbol_names=names)

        out = {
            "state": r"s_t = " + latex(s_vec),
            "A": r"A_t = " + latex(self.A),
            "b": r"b_t = " + latex(self.b),
            "update": r"s_t = A_t\, s_{t-1} + b_t",
            "combine": r"(A_2, b_2) \circ (A_1, b_1) = (A_2 A_1,\; A_2 b_1 + b_2)",
            "identity": r"e = (I, 0)",
        }
        for name, e in self.readouts.items():
            # a name with underscores is a subscripted symbol (grad_{sum dt}): braced, so
            # that _t is not a double subscript, which MathJax refuses
            sub = "{t, n}" if self.output_is_lane(name) else "t"
            out[f"readout {name}"] = f"{{{latex(symbol(name))}}}_{sub} = " + latex(e)
        return out

    # -- numbers -----------------------------------------------------------------------------
    def coefficients(self, env: Mapping[str, np.ndarray], shape: tuple[int, ...]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Numeric ``A`` (*batch, N, S, S, L) and ``b`` (*batch, N, S, L), float64.

        ``env`` maps each input and parameter to an array broadcastable to
        ``shape = batch + (N, L)`` (see :func:`explorer.runtime.shapes.canonical_views`).
        """

        S = self.size
        A = np.zeros((*shape[:-1], S, S, shape[-1]))
        b = np.zeros((*shape[:-1], S, shape[-1]))
        for i in range(S):
            for j in range(S):
                A[..., i, j, :] = evaluate(self.A[i, j], env)
            b[..., i, :] = evaluate(self.b[i], env)
        return A, b

    @staticmethod
    def combine(A2: np.ndarray, b2: np.ndarray, A1: np.ndarray, b1: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """``(A2, b2) o (A1, b1)``: apply element 1 first, then element 2.

        ``A`` has shape (..., S, S) and ``b`` shape (..., S).
        """
        return A2 @ A1, np.einsum("...ij,...j->...i", A2, b1) + b2

    def identity(self, batch: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        S = self.size
        return np.broadcast_to(np.eye(S), (*batch, S, S)).copy(), np.zeros((*batch, S))


def decompose(rec: Recurrence) -> AffineForm:
    """Write each state update as ``s_t = A_t s_{t-1} + b_t`` (companion form for lags > 1)."""
    components = tuple((s, lag) for s in rec.states for lag in range(rec.order[s]))
    # symbols of the previous state vector: (name, lag) read in an update, lag >= 1
    prev = {(name, lag + 1): state_symbol(name, lag + 1) for name, lag in components}
    cur = {(name, 0): state_symbol(name, 0) for name, lag in components if lag == 0}
    S = len(components)
    A = sympy.zeros(S, S)
    b = sympy.zeros(S, 1)
    prev_symbols = [prev[(name, lag + 1)] for name, lag in components]
    for i, (name, lag) in enumerate(components):
        if lag > 0:  # companion row: name[t-lag] is name[t-lag] of the previous vector
            A[i, components.index((name, lag - 1))] = 1
            continue
        e = to_sympy(rec.statement(name).expr, prev)
        zero = dict.fromkeys(prev_symbols, 0)
        for j, sym in enumerate(prev_symbols):
            coeff = sympy.diff(e, sym)
            A[i, j] = _tidy(coeff)
        b[i] = _tidy(e.subs(zero))
    state_symbols = tuple(state_symbol(name, lag) for name, lag in components)
    cur_map = {**cur, **{(n, lag): state_symbol(n, lag) for n, lag in components}}
    readouts = {r: to_sympy(rec.statement(r).expr, cur_map) for r in rec.readouts}
    for i, (name, lag) in enumerate(components):
        if lag == 0:
            _check_folded(rec, name, [A[i, j] for j in range(S)] + [b[i]])
    for r, e in readouts.items():
        _check_folded(rec, r, [e])
    return AffineForm(rec, components, A, b, state_symbols, readouts)


_NOT_REAL = (sympy.I, sympy.zoo, sympy.oo, -sympy.oo, sympy.nan)


def _check_folded(rec: Recurrence, name: str, exprs: list[sympy.Expr]) -> None:
    """Refuse what sympy's folding makes of the constants when the kernels could not compute it
    in float32: a number beyond float32's range (``3e38 * x[t] * 10`` folds to ``3e39*x``) or
    one that is not a finite real (``log(0 * x[t])`` folds to ``zoo``).  The front end checks
    every constant subexpression as written; this checks what folding across terms made."""
    from explorer.errors import RecurrenceError
    from explorer.frontend.recurrence import MAX_CONSTANT

    st = rec.statement(name)
    what = "update" if name in rec.states else "readout"
    for e in exprs:
        if any(e.has(a) for a in _NOT_REAL):
            raise RecurrenceError(f"the {what} of {name} is not a finite real number once its "
                                  f"constants are folded: {_short(e)} (zoo is 1/0, I is "
                                  "sqrt(-1))", rec.text, st.span.line, st.span.col,
                                  st.span.length)
        for n in e.atoms(sympy.Number):
            if abs(n) > MAX_CONSTANT:
                raise RecurrenceError(f"the {what} of {name} folds its constants into "
                                      f"{_magnitude(n)}, beyond float32's range (|x| <= "
                                      f"{MAX_CONSTANT:.4g})", rec.text, st.span.line, st.span.col,
                                      st.span.length)


def _magnitude(n: sympy.Number) -> str:
    try:
        return f"{float(n):.3g}"
    except OverflowError:
        return sympy.sstr(sympy.Float(n, 3))


def _short(e: sympy.Expr, limit: int = 80) -> str:
    text = sympy.sstr(e)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _tidy(e: sympy.Expr) -> sympy.Expr:
    """Factor common terms out lightly so that A_t and b_t read like what the person wrote."""
    return sympy.factor_terms(e)


def _subscripted(name: str) -> str:
    """LaTeX of a name with several underscores: the first starts the subscript, the others
    are shown (``grad_{sum\\_dt}``)."""
    head, rest = name.split("_", 1)
    return head + "_{" + rest.replace("_", r"\_") + "}"
