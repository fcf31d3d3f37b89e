"""Stage 1, the front end: recurrence text -> `Recurrence`.

The language is a small subset of Python expressions, read with :mod:`ast` and never executed.

    h[t] = a[t] * h[t-1] + b[t]                       # scalar affine scan
    h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]
    y[t] = sum(C[t, n] * h[t, n]) + D * x[t]          # readout, summed over the state axis n
    g[t, n] = C[t, n] * h[t, n]                       # lane readout: a value per lane

* ``x[t]``: an input indexed by time; ``A``, ``gamma``: parameters constant over time;
  ``h[t-k]``: the past of a state (k >= 1); ``n`` indexes the state axis of a vector state.
* Statements are separated by new lines or ``;``; ``#`` starts a comment.
* A name on the left that is read with a lag (``h[t-1]``) is a state; the others are readouts.
* Functions: exp, log, sigmoid, softplus, tanh, sqrt, abs, max, min, and ``sum`` (over n, in
  readouts).
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.frontend.checks import Checker, check_state_size  # noqa: F401

# the language's tree and the parser's limits, named from here as before
from explorer.frontend.parser import (  # noqa: F401
    BINARY_FUNCTIONS,
    FUNCTIONS,
    MAX_BLELLOCH_STATE_SIZE,
    MAX_CONSTANT,
    MAX_DEPTH,
    MAX_EXPONENT,
    MAX_LAG,
    MAX_NAMES,
    MAX_NODES,
    MAX_SOURCE_CHARS,
    MAX_STATE_SIZE,
    MIN_CONSTANT,
    REDUCTIONS,
    RESERVED,
    UNARY_FUNCTIONS,
    _Parser,
)
from explorer.frontend.tree import (  # noqa: F401
    Binary,
    Call,
    Expr,
    Num,
    Ref,
    Span,
    Statement,
    Unary,
    children,
    fold,
    to_text,
    walk,
)


# --------------------------------------------------------------------------------------------
# The Recurrence
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recurrence:
    """A parsed, checked recurrence: statements plus the roles of every name."""

    text: str
    statements: tuple[Statement, ...]
    states: tuple[str, ...]
    readouts: tuple[str, ...]
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    lane_names: frozenset[str]
    vector: bool
    order: dict[str, int]
    name: str | None = None

    @classmethod
    def parse(cls, text: str, name: str | None = None) -> Recurrence:
        """Parse and check recurrence text; raises :class:`explorer.RecurrenceError`."""
        parser = _Parser(text)
        return cls(*Checker(parser).check(parser.parse(), name))

    @property
    def lane_readouts(self) -> tuple[str, ...]:
        """The readouts with a value per step and lane (``g[t, n] = C[t, n] * h[t, n]``); the
        others are one value per step (``y[t] = sum(...)``)."""
        return tuple(r for r in self.readouts if self.statement(r).lane)

    def statement(self, target: str) -> Statement:
        for s in self.statements:
            if s.target == target:
                return s
        raise KeyError(target)

    def is_timed(self, name: str) -> bool:
        return name in self.inputs

    def as_text(self) -> str:
        lines = []
        for s in self.statements:
            lhs = f"{s.target}[t, n]" if s.lane else f"{s.target}[t]"
            lines.append(f"{lhs} = {to_text(s.expr)}")
        return "\n".join(lines)

    def summary(self) -> str:
        kind = "vector (state axis n)" if self.vector else "scalar"
        parts = [
            self.as_text(),
            "",
            f"states:   {', '.join(f'{s} (order {self.order[s]})' for s in self.states)}",
            f"readouts: {', '.join(self.readouts) or '-'}",
            f"inputs:   {', '.join(self._show(n) for n in self.inputs) or '-'}",
            f"params:   {', '.join(self._show(n) for n in self.params) or '-'}",
            f"state:    {kind}",
        ]
        return "\n".join(parts)

    def _show(self, name: str) -> str:
        return f"{name}[n]" if name in self.lane_names else name

    def dependence_dot(self) -> str:
        """A graphviz DOT graph: which names each statement reads (lags on the edges)."""
        lines = ["digraph deps {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=11];']
        for n in self.inputs:
            lines.append(f'  "{n}" [shape=box, style=filled, fillcolor="#e8f0fe", label="{n}[t]"];')
        for n in self.params:
            lines.append(f'  "{n}" [shape=box, style="rounded,filled", fillcolor="#f1f3f4"];')
        for n in self.states:
            lines.append(f'  "{n}" [shape=ellipse, style=filled, fillcolor="#fde293"];')
        for n in self.readouts:
            lines.append(f'  "{n}" [shape=ellipse, style=filled, fillcolor="#ceead6"];')
        for s in self.statements:
            seen: set[tuple[str, int | None]] = set()
            for node in walk(s.expr):
                if isinstance(node, Ref) and (node.name, node.lag) not in seen:
                    seen.add((node.name, node.lag))
                    label = f' [label="t-{node.lag}", color="#d93025"]' if node.lag else ""
                    lines.append(f'  "{node.name}" -> "{s.target}"{label};')
        lines.append("}")
        return "\n".join(lines)
