"""The checks of a parsed recurrence: every name defined once and given one role, states read
only in the past and entering their update affinely, sums over n where lanes are read, the
limits on names and on the state dimension; the result is what :class:`Recurrence` holds.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, NamedTuple

from explorer.errors import RecurrenceError
from explorer.frontend.names import RESERVED_NAMES, h0_name
from explorer.frontend.parser import (
    MAX_BLELLOCH_STATE_SIZE,
    MAX_NAMES,
    MAX_STATE_SIZE,
    RESERVED,
    _dummy,
    _number,
    _Parser,
)
from explorer.frontend.tree import (
    Binary,
    Call,
    Expr,
    Num,
    Ref,
    Span,
    Statement,
    Unary,
    fold,
    to_text,
    walk,
)

if TYPE_CHECKING:
    from explorer.frontend.recurrence import Recurrence


class Parsed(NamedTuple):
    """What the parser found, in the order of :class:`Recurrence`'s fields."""

    text: str
    statements: tuple[Statement, ...]
    states: tuple[str, ...]
    readouts: tuple[str, ...]
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    lane_names: frozenset[str]
    vector: bool
    order: dict[str, int]
    name: str | None


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


class Checker:
    """The checks, with the parser's text and its error (a caret under the span at fault)."""

    def __init__(self, parser: _Parser) -> None:
        self.text = parser.text
        self.error = parser.error

    def check(self, statements: list[Statement], name: str | None) -> Parsed:
        defined: dict[str, Statement] = {}
        for s in statements:
            if s.target in defined:
                raise self.error(f"{s.target} is defined twice", s.span)
            defined[s.target] = s
        refs = [(s, r) for s in statements for r in walk(s.expr) if isinstance(r, Ref)]

        for s, r in refs:
            if r.name == s.target and r.lag == 0:
                raise self.error(f"{s.target}[t] is defined from itself; a recurrence reads the "
                                 f"past: {s.target}[t-1]", r.span)
        # states: defined names read with a lag; a lag on an undefined name is an error
        order: dict[str, int] = {}
        for _, r in refs:
            if r.lag is not None and r.lag > 0:
                if r.name not in defined:
                    raise self.error(f"{r.name}[t-{r.lag}] reads the past of {r.name}, but "
                                     f"{r.name} is never defined (add a statement "
                                     f"{r.name}[t] = ...)", r.span)
                order[r.name] = max(order.get(r.name, 0), r.lag)
        states = tuple(s.target for s in statements if s.target in order)
        readouts = tuple(s.target for s in statements if s.target not in order)
        if not states:
            raise self.error("no state: a recurrence needs a statement that reads its own past, "
                             "such as h[t] = a[t] * h[t-1] + b[t]", statements[0].span)
        self.check_state_size(states, order, refs)

        vector = any(defined[name].lane for name in states)
        for name in states:
            if defined[name].lane != vector:
                raise self.error("either every state has the axis n or none has",
                                 defined[name].span)
        for name in readouts:
            if defined[name].lane and not vector:
                raise self.error(f"a readout is one value per time step: write {name}[t] "
                                 "(only a vector state's readout has the axis n)",
                                 defined[name].span)

        inputs: list[str] = []
        params: list[str] = []
        lane_names: set[str] = set(states) if vector else set()
        laned: dict[str, bool] = {}
        for s, r in refs:
            if r.name in defined:
                if r.lag is None:
                    raise self.error(f"{r.name} is defined by a statement; index it by time: "
                                     f"{r.name}[t-1]", r.span)
                if r.name in readouts:
                    raise self.error(f"{r.name} is a readout; statements cannot read it",
                                     r.span)
                if r.lane != vector:
                    want = f"{r.name}[t-{r.lag}, n]" if vector else f"{r.name}[t-{r.lag}]"
                    raise self.error(f"write the state as {want}", r.span)
                if s.target in order and r.lag == 0:
                    raise self.error(f"the update of {s.target} reads {r.name}[t], the state being "
                                     f"computed; use the past, {r.name}[t-1]", r.span)
                if s.target in readouts and r.lag != 0:
                    raise self.error(f"the readout {s.target} reads {r.name}[t-{r.lag}]; "
                                     f"readouts use the current state {r.name}[t]", r.span)
                continue
            if r.lane and not vector:
                raise self.error(f"{r.name} is indexed by n, but the state has no axis n "
                                 "(write the state as h[t, n])", r.span)
            if r.name in laned and laned[r.name] != r.lane:
                raise self.error(f"{r.name} is used both with and without the axis n", r.span)
            laned[r.name] = r.lane
            if r.lane:
                lane_names.add(r.name)
            if r.lag is None:
                if r.name in inputs:
                    raise self.error(f"{r.name} is used both as an input {r.name}[t] and as a "
                                     "parameter", r.span)
                if r.name not in params:
                    params.append(r.name)
            else:
                if r.lag != 0:
                    raise self.error(f"inputs are read at the current time: write {r.name}[t]",
                                     r.span)
                if r.name in params:
                    raise self.error(f"{r.name} is used both as an input {r.name}[t] and as a "
                                     "parameter", r.span)
                if r.name not in inputs:
                    inputs.append(r.name)

        self.check_initial_keywords(states, defined, refs, inputs)
        names = len(inputs) + len(params) + len(defined)
        if names > MAX_NAMES:
            # at the first name past the limit
            seen: list[str] = []
            for _, r in refs:
                if r.name not in defined and r.name not in seen:
                    seen.append(r.name)
                    if len(seen) + len(defined) > MAX_NAMES:
                        break
            raise self.error(f"the recurrence names {names} arrays (inputs, parameters, states "
                             f"and readouts); the limit is {MAX_NAMES}, each being an argument "
                             "of the kernels: add inputs up before the scan", r.span)
        for s in statements:
            self.check_sums(s, vector, s.target in readouts, s.lane and s.target in readouts)
            if s.target in order:
                self.check_affine(s, set(states))
        return Parsed(self.text, tuple(statements), states, readouts, tuple(inputs),
                      tuple(params), frozenset(lane_names), vector, order, name)

    def check_state_size(self, states: tuple[str, ...], order: dict[str, int],
                         refs: list[tuple[Statement, Ref]]) -> None:
        size = sum(order.values())
        if size > MAX_STATE_SIZE:
            raise _state_size_error(self.text, states, order, refs, MAX_STATE_SIZE,
                                    "the scan composes S x S matrices")

    def check_initial_keywords(self, states: tuple[str, ...], defined: dict[str, Statement],
                               refs: list[tuple[Statement, Ref]], inputs: list[str]) -> None:
        """``<state>0=`` gives the initial state of each state (a keyword of every call and a
        kernel argument): no other name may be spelled so, and it may not be reserved."""
        first_use: dict[str, Span] = {}
        for _, r in refs:
            first_use.setdefault(r.name, r.span)
        for name, st in defined.items():
            first_use[name] = st.target_span or st.span
        for state in states:
            key = h0_name(state)
            where = defined[state].target_span or defined[state].span
            if key in RESERVED:
                why = RESERVED_NAMES.get(key, "it is a function of the language")
                raise self.error(f"the state {state} gives its initial state as {key}=..., but "
                                 f"'{key}' is reserved: {why}; rename {state}", where)
            if key in first_use:
                role = ("a state" if key in states else "a readout" if key in defined
                        else "an input" if key in inputs else "a parameter")
                raise self.error(f"{key} is {role}, but {key} is also the keyword of the initial "
                                 f"state of {state} ({key}=... gives {state}[-1]); rename {key} "
                                 f"or {state}", first_use[key])

    def check_sums(self, s: Statement, vector: bool, readout: bool, lane: bool = False
                   ) -> None:
        """Sums over n belong in a readout of one value per step; a lane readout
        (``g[t, n] = ...``: one value per step and lane) sums nothing."""
        lane_names = {r.name for r in walk(s.expr) if isinstance(r, Ref) and r.lane}

        def has_lane(e: Expr) -> bool:
            def visit(node: Expr, kids: list[bool]) -> bool:
                if isinstance(node, Call) and node.func == "sum":
                    return False
                if isinstance(node, Ref):
                    return node.name in lane_names
                return any(kids)
            return fold(e, visit)

        for node in walk(s.expr):
            if isinstance(node, Call) and node.func == "sum":
                if not vector:
                    raise self.error("sum(...) reduces over the state axis n, but the state has "
                                     "no axis n", node.span)
                if not readout:
                    raise self.error("sum(...) over n belongs in a readout, not in a state "
                                     "update (each lane of a vector state is independent)",
                                     node.span)
                if lane:
                    raise self.error(f"the readout {s.target}[t, n] has a value per lane: it "
                                     f"sums nothing (write {s.target}[t] = sum(...) for a sum "
                                     "over n)", node.span)
                inner = node.args[0]
                if any(isinstance(c, Call) and c.func == "sum" for c in walk(inner)):
                    raise self.error("sums cannot be nested", node.span)
                if not has_lane(inner):
                    raise self.error("sum(...) of something not indexed by n", node.span)
        if readout and not lane and has_lane(s.expr):
            raise self.error(f"the readout {s.target}[t] depends on the axis n: reduce with "
                             "sum(...)", s.expr.span)

    def check_affine(self, s: Statement, states: set[str]) -> None:
        """Raise at the smallest term that makes the update not affine in the states."""

        def bad(node: Expr, why: str) -> RecurrenceError:
            text = ast.get_source_segment(self.text, _dummy(node.span, self.text)) or to_text(node)
            return self.error(f"the update of {s.target} is not affine in the state: "
                              f"`{text}` {why}", node.span)

        def degree(e: Expr, kids: list[int]) -> int:
            if isinstance(e, Num):
                return 0
            if isinstance(e, Ref):
                return 1 if e.name in states else 0
            if isinstance(e, Unary):
                return kids[0]
            if isinstance(e, Binary):
                dl, dr = kids
                if e.op in "+-":
                    return max(dl, dr)
                if e.op == "*":
                    if dl and dr:
                        raise bad(e, "multiplies two terms that both depend on the state")
                    return dl or dr
                if e.op == "/":
                    if dr:
                        raise bad(e, "divides by a term that depends on the state")
                    return dl
                assert isinstance(e.right, Num | Unary)
                if dl and _number(e.right) != 1.0:
                    raise bad(e, "raises the state to a power")
                return dl
            assert isinstance(e, Call)
            if any(kids):
                raise bad(e, f"applies {e.func}() to the state")
            return 0

        fold(s.expr, degree)


def check_state_size(rec: Recurrence, strategy: str) -> None:
    """Refuse, before any compile work, a state dimension the strategy cannot compile in
    seconds: the Blelloch tree composes S x S matrices at every level, code that grows as S**3
    (see :data:`MAX_BLELLOCH_STATE_SIZE`)."""
    if strategy != "blelloch" or sum(rec.order.values()) <= MAX_BLELLOCH_STATE_SIZE:
        return
    refs = [(s, r) for s in rec.statements for r in walk(s.expr) if isinstance(r, Ref)]
    raise _state_size_error(rec.text, rec.states, rec.order, refs, MAX_BLELLOCH_STATE_SIZE,
                            "the Blelloch strategy composes S x S matrices at every level of "
                            "its tree, code that grows as S**3; strategy='sequential' takes "
                            f"up to {MAX_STATE_SIZE}")


def _state_size_error(text: str, states: tuple[str, ...], order: dict[str, int],
                      refs: list[tuple[Statement, Ref]], limit: int, why: str
                      ) -> RecurrenceError:
    """The error at the deepest read of the state whose order crosses the limit."""
    size = sum(order.values())
    total = 0
    name = states[-1]
    for name in states:
        total += order[name]
        if total > limit:
            break
    where = next(r for _, r in refs if r.name == name and r.lag == order[name])
    parts = " + ".join(f"{s} {order[s]}" for s in states)
    span = where.span
    return RecurrenceError(f"the state has dimension S = {size} ({parts}: each state counts its "
                           f"deepest lag), more than the limit of {limit}: {why}", text,
                           span.line, span.col, span.length)
