"""Channel values: the parts of a vector recurrence's element ``(A_t, b_t)`` and of its lane
terms that depend on the channel alone (its inputs without the lane axis and its parameters),
computed once per (channel, step) instead of once per lane.

Mamba's ``exp(softplus(dt[t] + dt_bias) * A[n])`` and ``softplus(dt[t] + dt_bias) * B[t, n] *
x[t]`` share ``softplus(dt[t] + dt_bias)``, the same for the N lanes of a channel (an exp and a
log, where the rest of a lane's step is a few multiplies): the sequential kernel computes it
where it stages a channel's inputs, and its lanes read it like an input. :func:`hoist` names
the largest such subexpressions that read a timed input and cost a transcendental function or
a division, and rewrites the expressions with those names. A sum is never named itself (its
terms are). A product is named only for the part of it that is the channel's: in
``softplus(dt[t] + dt_bias) * B[t, n] * x[t]`` the factors ``softplus(...) * x[t]`` become one
channel value, so a lane multiplies once by ``B`` instead of twice (the staged value costs a
row of shared memory per tile; a multiply per lane and step is what the lane loop repeats N
times).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import sympy

from explorer.codegen.emit import is_lane_sum
from explorer.passes.lanesum import Sigmoid, Softplus

#: the names of channel values begin with this (not a name of the language: no collision)
PREFIX = "#"


@dataclass
class Hoisted:
    """The channel values (name -> expression of channel names), and the expressions that
    read them, in the order given."""

    values: dict[str, sympy.Expr] = field(default_factory=dict)
    exprs: list[sympy.Expr] = field(default_factory=list)

    def timed_inputs(self, timed: Iterable[str]) -> set[str]:
        """The timed inputs the channel values read."""
        names = set(timed)
        return {s.name for e in self.values.values() for s in e.free_symbols if s.name in names}


def hoist(exprs: Sequence[sympy.Expr], channel: set[str], timed: set[str]) -> Hoisted:
    """Name the largest subexpressions of ``exprs`` that read only the ``channel`` names (and
    at least one ``timed`` input) and cost a function or a division, sums and products aside,
    and rewrite ``exprs`` with those names."""
    out = Hoisted()
    by_expr: dict[sympy.Expr, sympy.Symbol] = {}

    def only_channel(e: sympy.Basic) -> bool:
        names = {s.name for s in e.free_symbols}
        return bool(names) and names <= channel and bool(names & timed) and not _has_sum(e)

    def name(e: sympy.Expr) -> sympy.Expr:
        if e.is_Atom:
            return e
        sym = by_expr.get(e)
        if sym is None:
            sym = sympy.Symbol(f"{PREFIX}{len(by_expr)}", real=True)
            by_expr[e] = sym
            out.values[sym.name] = e
        return sym

    def channel_factors(e: sympy.Expr) -> tuple[list[sympy.Expr], list[sympy.Expr]]:
        """A product's factors that read the channel's names alone, and the others."""
        ours = [a for a in e.args if {s.name for s in a.free_symbols} <= channel
                and not _has_sum(a)]
        return ours, [a for a in e.args if a not in ours]

    def visit(e: sympy.Expr) -> sympy.Expr:
        if e.is_Atom:
            return e
        if only_channel(e) and _costly(e) and not isinstance(e, sympy.Add | sympy.Mul):
            return name(e)
        if isinstance(e, sympy.Mul):
            ours, rest = channel_factors(e)
            group = sympy.Mul(*ours, evaluate=False)
            if len(ours) >= 2 and rest and only_channel(group):
                return sympy.Mul(name(group), *[visit(a) for a in rest], evaluate=False)
        if isinstance(e, sympy.Add | sympy.Mul):
            return e.func(*[visit(a) for a in e.args], evaluate=False)
        return e.func(*[visit(a) for a in e.args])

    out.exprs = [visit(sympy.sympify(e)) for e in exprs]
    return out


#: what a lane would compute at a cost worth a staged value
_COSTLY = (sympy.exp, sympy.log, sympy.tanh, sympy.Abs, sympy.Max, sympy.Min, Sigmoid, Softplus)


def _costly(e: sympy.Basic) -> bool:
    for n in sympy.preorder_traversal(e):
        if isinstance(n, _COSTLY):
            return True
        if isinstance(n, sympy.Pow) and not (n.exp.is_Integer and n.exp > 0):
            return True      # a division, a root, a power of a variable exponent
    return False


def _has_sum(e: sympy.Basic) -> bool:
    return any(is_lane_sum(n) for n in sympy.preorder_traversal(e))


@dataclass(frozen=True)
class ChannelSplit:
    """What a kernel that holds a channel's lanes together reads per lane and per channel."""

    #: the element's coefficients (A row by row, then b) and the lane terms, with the channel
    #: values in them
    element: tuple[sympy.Expr, ...]
    terms: tuple[sympy.Expr, ...]
    #: channel values, name -> expression of the channel's inputs and parameters
    values: tuple[tuple[str, sympy.Expr], ...]
    #: timed inputs with the lane axis that the element and terms read (per lane)
    lane_inputs: tuple[str, ...]
    #: timed inputs without it that they read (staged per channel beside the values)
    channel_inputs: tuple[str, ...]
    #: timed inputs without it that a channel's stage loads: those, and what the values read
    channel_raw: tuple[str, ...]
    #: the lane readouts (name -> expression), with the channel values in them
    readouts: tuple[tuple[str, sympy.Expr], ...] = ()

    @property
    def channel_staged(self) -> tuple[str, ...]:
        """What is staged per channel and step: its inputs, then its values."""
        return self.channel_inputs + tuple(n for n, _ in self.values)


def split_channel(form: object, lane_terms: Sequence[sympy.Expr],
                  also: Iterable[str] = (), readouts: Sequence[str] = ()) -> ChannelSplit:
    """The :class:`ChannelSplit` of a vector ``form`` (an
    :class:`~explorer.passes.affine.AffineForm`), its ``lane_terms`` and the lane readouts
    ``readouts`` (computed per lane, like the terms); ``also``: inputs without the lane axis
    to stage per channel besides (a readout's, outside its sums)."""
    rec = form.recurrence  # type: ignore[attr-defined]
    lanes = set(rec.lane_names)
    inputs = tuple(rec.inputs)
    S = form.size  # type: ignore[attr-defined]
    A, b = form.A, form.b  # type: ignore[attr-defined]
    channel = {n for n in (*inputs, *rec.params) if n not in lanes}
    coeffs = [A[i, j] for i in range(S) for j in range(S)] + [b[i] for i in range(S)]
    outs = [form.readouts[r] for r in readouts]  # type: ignore[attr-defined]
    h = hoist([*coeffs, *lane_terms, *outs], channel, set(inputs))
    read = {s.name for e in h.exprs for s in e.free_symbols}
    nt = len(coeffs) + len(lane_terms)
    staged = (read | set(also)) & set(inputs)
    from_values = h.timed_inputs(inputs)
    return ChannelSplit(
        tuple(h.exprs[:len(coeffs)]), tuple(h.exprs[len(coeffs):nt]), tuple(h.values.items()),
        tuple(n for n in inputs if n in lanes and n in staged),
        tuple(n for n in inputs if n not in lanes and n in staged),
        tuple(n for n in inputs if n not in lanes and (n in staged or n in from_values)),
        tuple(zip(readouts, h.exprs[nt:], strict=True)))
