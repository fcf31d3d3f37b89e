"""Stage 1, the front end: recurrence text -> `Recurrence`.

The language is a small subset of Python expressions, read with :mod:`ast` and never executed.

    h[t] = a[t] * h[t-1] + b[t]                       # scalar affine scan
    h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]
    y[t] = sum(C[t, n] * h[t, n]) + D * x[t]          # readout, summed over the state axis n

* ``x[t]``: an input indexed by time; ``A``, ``gamma``: parameters constant over time;
  ``h[t-k]``: the past of a state (k >= 1); ``n`` indexes the state axis of a vector state.
* Statements are separated by new lines or ``;``; ``#`` starts a comment.
* A name on the left that is read with a lag (``h[t-1]``) is a state; the others are readouts.
* Functions: exp, log, sigmoid, softplus, tanh, sqrt, abs, max, min, and ``sum`` (over n, in
  readouts).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Literal

from explorer.errors import RecurrenceError

MAX_SOURCE_CHARS = 20_000
MAX_NODES = 5_000
MAX_LAG = 8

#: functions of one argument, allowed anywhere
UNARY_FUNCTIONS = frozenset({"exp", "log", "sigmoid", "softplus", "tanh", "sqrt", "abs"})
#: functions of two arguments
BINARY_FUNCTIONS = frozenset({"max", "min"})
#: reduction over the state axis n
REDUCTIONS = frozenset({"sum"})
FUNCTIONS = UNARY_FUNCTIONS | BINARY_FUNCTIONS | REDUCTIONS
RESERVED = frozenset({"t", "n"}) | FUNCTIONS


# --------------------------------------------------------------------------------------------
# The expression tree of the language (our own, so that nothing of Python leaks through)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    line: int
    col: int
    end_col: int

    @property
    def length(self) -> int:
        return max(1, self.end_col - self.col)


@dataclass(frozen=True)
class Num:
    value: float
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Ref:
    """A name, possibly indexed: ``A`` (lag None), ``x[t]`` (lag 0), ``h[t-1, n]`` (lag 1, lane)."""

    name: str
    lag: int | None
    lane: bool
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Unary:
    op: Literal["-", "+"]
    operand: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Binary:
    op: Literal["+", "-", "*", "/", "**"]
    left: Expr
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    span: Span = field(compare=False)


Expr = Num | Ref | Unary | Binary | Call


@dataclass(frozen=True)
class Statement:
    target: str
    lane: bool
    expr: Expr
    span: Span = field(compare=False)
    source_text: str = field(compare=False, default="")


def walk(expr: Expr):
    """Yield every node of an expression, parents first."""
    yield expr
    if isinstance(expr, Unary):
        yield from walk(expr.operand)
    elif isinstance(expr, Binary):
        yield from walk(expr.left)
        yield from walk(expr.right)
    elif isinstance(expr, Call):
        for arg in expr.args:
            yield from walk(arg)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "**": 4}


def to_text(expr: Expr) -> str:
    """Render an expression back to the language, with only the parentheses it needs."""
    if isinstance(expr, Num):
        v = expr.value
        return repr(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(v)
    if isinstance(expr, Ref):
        if expr.lag is None:
            return f"{expr.name}[n]" if expr.lane else expr.name
        t = "t" if expr.lag == 0 else f"t-{expr.lag}"
        return f"{expr.name}[{t}, n]" if expr.lane else f"{expr.name}[{t}]"
    if isinstance(expr, Unary):
        return f"{expr.op}{_wrap(expr.operand, 3)}"
    if isinstance(expr, Binary):
        p = _PRECEDENCE[expr.op]
        if expr.op == "**":
            return f"{_wrap(expr.left, p + 1)} ** {_wrap(expr.right, p)}"
        # the right operand of - and / binds tighter: a - (b - c)
        right_p = p + 1 if expr.op in "-/" else p
        return f"{_wrap(expr.left, p)} {expr.op} {_wrap(expr.right, right_p)}"
    return f"{expr.func}({', '.join(to_text(a) for a in expr.args)})"


def _wrap(expr: Expr, min_precedence: int) -> str:
    text = to_text(expr)
    if isinstance(expr, Binary):
        p = _PRECEDENCE[expr.op]
    elif isinstance(expr, Unary):
        p = 3
    else:
        return text
    return f"({text})" if p < min_precedence else text


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
        return _Parser(text).parse(name)

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


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise RecurrenceError(f"a recurrence is text, got {type(text).__name__}")
        self.text = text
        self.nodes = 0

    def error(self, message: str, span: Span | None = None) -> RecurrenceError:
        if span is None:
            return RecurrenceError(message)
        return RecurrenceError(message, self.text, span.line, span.col, span.length)

    def span(self, node: ast.AST) -> Span:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        end_line = getattr(node, "end_lineno", line)
        end_col = getattr(node, "end_col_offset", col + 1)
        if end_line != line or end_col is None:
            lines = self.text.splitlines()
            end_col = len(lines[line - 1]) if 0 < line <= len(lines) else col + 1
        return Span(line, col, end_col)

    # -- entry -------------------------------------------------------------------------------
    def parse(self, name: str | None) -> Recurrence:
        if len(self.text) > MAX_SOURCE_CHARS:
            raise self.error(f"the recurrence is {len(self.text)} characters long; the limit is "
                             f"{MAX_SOURCE_CHARS}")
        if "\x00" in self.text:
            raise self.error("the recurrence contains a NUL character")
        try:
            module = ast.parse(self.text, mode="exec")
        except SyntaxError as e:
            line = e.lineno or 1
            col = max(0, (e.offset or 1) - 1)
            lines = self.text.splitlines() or [""]
            line = min(max(line, 1), len(lines))
            col = min(col, max(0, len(lines[line - 1]) - 1))
            raise RecurrenceError(f"syntax error: {e.msg}", self.text, line, col) from None
        except (RecursionError, MemoryError, ValueError) as e:
            raise self.error(f"the recurrence cannot be read: {type(e).__name__}: {e}") from None
        count = sum(1 for _ in ast.walk(module))
        if count > 2 * MAX_NODES:
            raise self.error(f"the recurrence has more than {MAX_NODES} terms")
        if not module.body:
            raise self.error("the recurrence is empty: write a state update such as "
                             "h[t] = a[t] * h[t-1] + b[t]")
        try:
            statements = [self.statement(node) for node in module.body]
        except RecursionError:
            raise self.error("the recurrence is nested too deeply") from None
        return self.check(statements, name)

    # -- statements --------------------------------------------------------------------------
    def statement(self, node: ast.stmt) -> Statement:
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            raise self.error("use a plain '=' to define a statement", self.span(node))
        if not isinstance(node, ast.Assign):
            what = type(node).__name__.lower()
            raise self.error(f"only statements of the form h[t] = ... are allowed, not {what}",
                             self.span(node))
        if len(node.targets) != 1:
            raise self.error("one target per statement", self.span(node))
        target = node.targets[0]
        if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)):
            raise self.error("the left side must be a name indexed by time, such as h[t] or "
                             "h[t, n]", self.span(target))
        tname = target.value.id
        if tname in RESERVED:
            raise self.error(f"'{tname}' is reserved and cannot be defined", self.span(target))
        lag, lane = self.index(target.slice, target)
        if lag != 0:
            raise self.error(f"define {tname} at the current time: {tname}[t]", self.span(target))
        expr = self.expr(node.value)
        seg = ast.get_source_segment(self.text, node) or ""
        return Statement(tname, lane, expr, self.span(node), seg)

    def index(self, sl: ast.expr, where: ast.AST) -> tuple[int | None, bool]:
        """(lag, lane) of a subscript: [t] [t-1] [t, n] [n]."""
        elts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        if len(elts) > 2:
            raise self.error("at most two indices: time t and the state axis n", self.span(where))
        lag: int | None = None
        lane = False
        for i, e in enumerate(elts):
            if isinstance(e, ast.Name) and e.id == "n":
                if lane or i != len(elts) - 1:
                    raise self.error("the state axis n comes last, once: x[t, n]", self.span(e))
                lane = True
                continue
            if i != 0:
                raise self.error("the second index can only be the state axis n", self.span(e))
            lag = self.time(e)
        return lag, lane

    def time(self, e: ast.expr) -> int:
        if isinstance(e, ast.Name) and e.id == "t":
            return 0
        if (isinstance(e, ast.BinOp) and isinstance(e.left, ast.Name) and e.left.id == "t"
                and isinstance(e.op, ast.Add | ast.Sub) and isinstance(e.right, ast.Constant)
                and type(e.right.value) is int):
            k = e.right.value if isinstance(e.op, ast.Sub) else -e.right.value
            if k < 0:
                raise self.error(f"t+{-k} refers to the future; a recurrence reads only the "
                                 "present (t) and the past (t-1, t-2, ...)", self.span(e))
            if k > MAX_LAG:
                raise self.error(f"lags beyond t-{MAX_LAG} are not supported", self.span(e))
            return int(k)
        raise self.error("a time index must be t or t-k with an integer k", self.span(e))

    # -- expressions -------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> Expr:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.error(f"the recurrence has more than {MAX_NODES} terms", self.span(node))
        span = self.span(node)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise self.error(f"only numbers are allowed as constants, not {node.value!r}"[:200],
                                 span)
            if isinstance(node.value, int) and abs(node.value) > 2**63:
                raise self.error("the number is too large", span)
            return Num(float(node.value), span)
        if isinstance(node, ast.Name):
            if node.id in ("t", "n"):
                raise self.error(f"'{node.id}' is an index and can only appear inside [...]",
                                 span)
            if node.id in FUNCTIONS:
                raise self.error(f"'{node.id}' is a function: call it, as in {node.id}(x[t])",
                                 span)
            return Ref(node.id, None, False, span)
        if isinstance(node, ast.Subscript):
            if not isinstance(node.value, ast.Name):
                raise self.error("only names can be indexed", span)
            if node.value.id in RESERVED:
                raise self.error(f"'{node.value.id}' cannot be indexed", span)
            lag, lane = self.index(node.slice, node)
            return Ref(node.value.id, lag, lane, span)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return Unary("-", self.expr(node.operand), span)
            if isinstance(node.op, ast.UAdd):
                return Unary("+", self.expr(node.operand), span)
            raise self.error(f"the operator {type(node.op).__name__} is not in the language",
                             span)
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
            op = ops.get(type(node.op))
            if op is None:
                raise self.error(f"the operator {type(node.op).__name__} is not in the language "
                                 "(use + - * / **)", span)
            left, right = self.expr(node.left), self.expr(node.right)
            if op == "**" and not _is_number(right):
                raise self.error("the exponent of ** must be a number", right.span)
            return Binary(op, left, right, span)  # type: ignore[arg-type]
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                raise self.error("only the functions of the language can be called "
                                 f"({', '.join(sorted(FUNCTIONS))})", span)
            fname = node.func.id
            if fname not in FUNCTIONS:
                raise self.error(f"unknown function '{fname}'; the language has "
                                 f"{', '.join(sorted(FUNCTIONS))}", self.span(node.func))
            if node.keywords:
                raise self.error(f"{fname}() takes no keyword arguments", span)
            want = 2 if fname in BINARY_FUNCTIONS else 1
            if len(node.args) != want or any(isinstance(a, ast.Starred) for a in node.args):
                raise self.error(f"{fname}() takes {want} argument{'s' * (want > 1)}", span)
            return Call(fname, tuple(self.expr(a) for a in node.args), span)
        kinds = {ast.Attribute: "attribute access", ast.Lambda: "lambda",
                 ast.ListComp: "comprehension", ast.GeneratorExp: "comprehension",
                 ast.SetComp: "comprehension", ast.DictComp: "comprehension",
                 ast.Compare: "comparison", ast.BoolOp: "boolean operator",
                 ast.IfExp: "conditional expression", ast.NamedExpr: "':=' assignment",
                 ast.JoinedStr: "string", ast.Await: "await", ast.Yield: "yield",
                 ast.YieldFrom: "yield", ast.Starred: "'*' unpacking"}
        what = kinds.get(type(node), type(node).__name__)
        raise self.error(f"{what} is not part of the recurrence language", span)

    # -- semantic checks ---------------------------------------------------------------------
    def check(self, statements: list[Statement], name: str | None) -> Recurrence:
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

        vector = any(defined[name].lane for name in states)
        for name in states:
            if defined[name].lane != vector:
                raise self.error("either every state has the axis n or none has",
                                 defined[name].span)
        for name in readouts:
            if defined[name].lane:
                raise self.error(f"a readout is one value per time step: write {name}[t] and "
                                 "reduce over n with sum(...)", defined[name].span)

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

        for s in statements:
            self.check_sums(s, vector, s.target in readouts)
            if s.target in order:
                self.check_affine(s, set(states))
        return Recurrence(self.text, tuple(statements), states, readouts, tuple(inputs),
                          tuple(params), frozenset(lane_names), vector, order, name)

    def check_sums(self, s: Statement, vector: bool, readout: bool) -> None:
        lane_names = {r.name for r in walk(s.expr) if isinstance(r, Ref) and r.lane}

        def has_lane(e: Expr) -> bool:
            if isinstance(e, Call) and e.func == "sum":
                return False
            if isinstance(e, Ref):
                return e.name in lane_names
            return any(has_lane(c) for c in _children(e))

        for node in walk(s.expr):
            if isinstance(node, Call) and node.func == "sum":
                if not vector:
                    raise self.error("sum(...) reduces over the state axis n, but the state has "
                                     "no axis n", node.span)
                if not readout:
                    raise self.error("sum(...) over n belongs in a readout, not in a state "
                                     "update (each lane of a vector state is independent)",
                                     node.span)
                inner = node.args[0]
                if any(isinstance(c, Call) and c.func == "sum" for c in walk(inner)):
                    raise self.error("sums cannot be nested", node.span)
                if not has_lane(inner):
                    raise self.error("sum(...) of something not indexed by n", node.span)
        if readout and has_lane(s.expr):
            raise self.error(f"the readout {s.target}[t] depends on the axis n: reduce with "
                             "sum(...)", s.expr.span)

    def check_affine(self, s: Statement, states: set[str]) -> None:
        """Raise at the smallest term that makes the update not affine in the states."""

        def bad(node: Expr, why: str) -> RecurrenceError:
            text = ast.get_source_segment(self.text, _dummy(node.span, self.text)) or to_text(node)
            return self.error(f"the update of {s.target} is not affine in the state: "
                              f"`{text}` {why}", node.span)

        def degree(e: Expr) -> int:
            if isinstance(e, Num):
                return 0
            if isinstance(e, Ref):
                return 1 if e.name in states else 0
            if isinstance(e, Unary):
                return degree(e.operand)
            if isinstance(e, Binary):
                dl, dr = degree(e.left), degree(e.right)
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
            for a in e.args:
                if degree(a):
                    raise bad(e, f"applies {e.func}() to the state")
            return 0

        degree(s.expr)


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Call):
        return e.args
    return ()


def _is_number(e: Expr) -> bool:
    return isinstance(e, Num) or (isinstance(e, Unary) and isinstance(e.operand, Num))


def _number(e: Expr) -> float:
    if isinstance(e, Num):
        return e.value
    assert isinstance(e, Unary) and isinstance(e.operand, Num)
    return -e.operand.value if e.op == "-" else e.operand.value


def _dummy(span: Span, text: str) -> ast.AST:
    node = ast.Pass()
    node.lineno = node.end_lineno = span.line
    node.col_offset, node.end_col_offset = span.col, span.end_col
    return node
