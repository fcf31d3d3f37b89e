"""The parser of the recurrence language: text -> statements (expression trees with their spans),
each node checked as it is built (names, numbers, powers, depth); :mod:`explorer.frontend.checks`
then checks the program as a whole. The text is read with :mod:`ast` and never executed; the
limits below bound what a text can ask of the compiler.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from explorer.errors import RecurrenceError
from explorer.frontend.names import RESERVED_NAMES, STATE_AXIS, TIME_AXIS
from explorer.frontend.tree import (
    Binary,
    Call,
    Expr,
    Num,
    Ref,
    Span,
    Statement,
    Unary,
)

if TYPE_CHECKING:
    pass

MAX_SOURCE_CHARS = 20_000
#: terms of one recurrence (names, numbers, operators, calls). Long sums are legal: every walk
#: over the tree is iterative (a 2,400-term chain parses, decomposes and runs the reference in
#: about a second); the bound keeps sympy's work and the kernels' size reasonable
MAX_NODES = 5_000
MAX_LAG = 8
#: names of one recurrence (inputs, parameters, states, readouts): each is a kernel argument
#: (with the initial states, sizes and workspaces an artifact's kernel takes at most 256), and
#: the kernels grow with them: distinct inputs compiled for the CPU (Blelloch) in 8.5 s (126),
#: 22 s (254), 112 to 193 s (500)
MAX_NAMES = 128
#: the deepest nesting of functions, powers and parenthesised sums and products inside each
#: other (a chain such as a + b + c is one level, however long). sympy walks expressions
#: recursively: exp(-exp(-...)) 190 levels deep exceeded Python's recursion limit in sympy itself;
#: 50 levels compile with the recursion limit lowered to 600
MAX_DEPTH = 50
#: the largest state dimension S: the sum of the orders of the states (two coupled states read
#: at t-8 make S = 16). Compile times of two coupled states (explorer.compile, cache off, one at
#: a time on the 2-core development machine; S >= 9 with other work beside it):
#:
#:   S                     2    3    4    5    6    7    8     9    10    11   12   14   16
#:   sequential, cpu     0.8  0.9  1.0  0.8  1.0  0.9  1.6   2.5   4.1   3.8  2.9  4.5  4.1 s
#:   sequential, cuda    0.9  1.0  0.8  0.9  1.3  1.5  1.9   2.2   3.1   3.1  2.8  4.2  3.3 s
#:   blelloch, cpu       1.6  3.6  5.5  7.9 10.9 16.4 24.1  72.3 152.5 380.0            (448)
#:   blelloch, cuda 32x1 1.1  1.9  2.5  4.6  6.7  9.8 12.9  17.8  25.5  33.0 62.7   -    -
#:
#: (448: seconds and 1.2 GB as first reported; cuda Blelloch with 32 threads x 1 element runs out of
#: shared memory from S = 14, with the default 128 x 8 from S = 3.) The sequential kernel applies
#: an S x S matrix per step, code that grows as S**2; the Blelloch tree composes S x S matrices
#: at every level, code that grows as S**3. So the language takes 16 (every S measured compiles
#: in seconds sequentially) and the Blelloch strategy 8, the order one state may have
#: (:data:`MAX_LAG`), checked by :func:`check_state_size` before any compile work.
MAX_STATE_SIZE = 16
MAX_BLELLOCH_STATE_SIZE = 8
#: the largest magnitude of a constant, literal or folded: float32's largest finite value (the
#: kernels compute in float32; a larger constant would silently become inf)
MAX_CONSTANT = 3.4028234663852886e38
#: the smallest non-zero magnitude of a literal: float32's smallest subnormal (a smaller one
#: would silently become 0)
MIN_CONSTANT = 1.401298464324817e-45
#: the largest |exponent| of ``**`` (and of a power of a power, whose exponents multiply):
#: enough for any polynomial a recurrence needs, and it keeps sympy's exact arithmetic small
#: (``3 ** 1000000000`` would be computed digit by digit)
MAX_EXPONENT = 64

#: functions of one argument, allowed anywhere
UNARY_FUNCTIONS = frozenset({"exp", "log", "sigmoid", "softplus", "tanh", "sqrt", "abs"})
#: functions of two arguments
BINARY_FUNCTIONS = frozenset({"max", "min"})
#: reduction over the state axis n
REDUCTIONS = frozenset({"sum"})
FUNCTIONS = UNARY_FUNCTIONS | BINARY_FUNCTIONS | REDUCTIONS
#: names that cannot be defined: the axes, the functions and the names the explorer uses for
#: itself (:data:`explorer.frontend.names.RESERVED_NAMES`, with the reason of each)
RESERVED = frozenset(RESERVED_NAMES) | FUNCTIONS


@dataclass(frozen=True)
class _Built:
    """A converted node and what the checks need of it: its value when it is a constant, and
    the largest |exponent| a power of it would multiply (``(x ** 2) ** 3`` is ``x ** 6`` to
    sympy; unbounded, nested powers of constants would make sympy compute huge integers)."""

    expr: Expr
    value: float | None = None
    power: float | None = None
    depth: int = 0


_BINOPS: dict[type, Literal["+", "-", "*", "/", "**"]] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}


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

    def segment(self, span: Span, limit: int = 60) -> str:
        """The source text under a span, shortened for a message."""
        lines = self.text.splitlines()
        text = lines[span.line - 1][span.col:span.end_col] if 0 < span.line <= len(lines) else ""
        return text if len(text) <= limit else text[:limit - 3] + "..."

    # -- entry -------------------------------------------------------------------------------
    def parse(self) -> list[Statement]:
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
        except (RecursionError, MemoryError):
            raise self.error("the recurrence is nested too deeply for Python's parser (write "
                             "fewer nested operators or parentheses)") from None
        except ValueError as e:
            raise self.error(f"the recurrence cannot be read: {e}") from None
        # a first, coarse bound before any conversion (Python's tree has about four nodes for
        # each of ours: x[t] is a subscript, two names and their contexts)
        count = sum(1 for _ in ast.walk(module))
        if count > 4 * MAX_NODES:
            raise self.error(_too_many())
        if not module.body:
            raise self.error("the recurrence is empty: write a state update such as "
                             "h[t] = a[t] * h[t-1] + b[t]")
        return [self.statement(node) for node in module.body]

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
        if tname in FUNCTIONS:
            raise self.error(f"'{tname}' is a function of the language and cannot be defined",
                             self.span(target.value))
        if tname in RESERVED_NAMES:
            raise self.error(f"'{tname}' is reserved and cannot be defined: "
                             f"{RESERVED_NAMES[tname]}", self.span(target.value))
        lag, lane = self.index(target.slice, target)
        if lag != 0:
            raise self.error(f"define {tname} at the current time: {tname}[t]", self.span(target))
        expr = self.expr(node.value)
        seg = ast.get_source_segment(self.text, node) or ""
        return Statement(tname, lane, expr, self.span(node), seg, self.span(target.value))

    def index(self, sl: ast.expr, where: ast.AST) -> tuple[int | None, bool]:
        """(lag, lane) of a subscript: [t] [t-1] [t, n] [n]."""
        elts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        if len(elts) > 2:
            raise self.error("at most two indices: time t and the state axis n", self.span(where))
        lag: int | None = None
        lane = False
        for i, e in enumerate(elts):
            if isinstance(e, ast.Name) and e.id == STATE_AXIS:
                if lane or i != len(elts) - 1:
                    raise self.error("the state axis n comes last, once: x[t, n]", self.span(e))
                lane = True
                continue
            if i != 0:
                raise self.error("the second index can only be the state axis n", self.span(e))
            lag = self.time(e)
        return lag, lane

    def time(self, e: ast.expr) -> int:
        if isinstance(e, ast.Name) and e.id == TIME_AXIS:
            return 0
        if (isinstance(e, ast.BinOp) and isinstance(e.left, ast.Name) and e.left.id == TIME_AXIS
                and isinstance(e.op, ast.Add | ast.Sub) and isinstance(e.right, ast.Constant)
                and type(e.right.value) is int):
            k = e.right.value if isinstance(e.op, ast.Sub) else -e.right.value
            if k < 0:
                raise self.error(f"t+{-k} refers to the future; a recurrence reads only the "
                                 "present (t) and the past (t-1, t-2, ...)"[:200], self.span(e))
            if k > MAX_LAG:
                raise self.error(f"lags beyond t-{MAX_LAG} are not supported", self.span(e))
            return int(k)
        raise self.error("a time index must be t or t-k with an integer k", self.span(e))

    # -- expressions -------------------------------------------------------------------------
    def expr(self, root: ast.expr) -> Expr:
        """Convert a Python expression into the language's tree, bottom-up and without
        recursion (a sum of thousands of terms is a chain thousands of nodes deep)."""
        stack: list[tuple[ast.expr, int | None]] = [(root, None)]
        results: list[_Built] = []
        while stack:
            node, arity = stack.pop()
            if arity is None:
                operands = self.enter(node)
                if operands:
                    stack.append((node, len(operands)))
                    stack.extend((o, None) for o in reversed(operands))
                    continue
                arity = 0
            args = results[len(results) - arity:] if arity else []
            if arity:
                del results[len(results) - arity:]
            built = self.build(node, args)
            depth = _depth(built.expr, args)
            if depth > MAX_DEPTH:
                raise self.error(f"the recurrence nests functions, powers and parentheses more "
                                 f"than {MAX_DEPTH} levels deep here", built.expr.span)
            results.append(_Built(built.expr, built.value, built.power, depth))
        return results[0].expr

    def enter(self, node: ast.expr) -> tuple[ast.expr, ...]:
        """Checks of a node that need none of its operands; its operands to convert first."""
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.error(_too_many(), self.span(node))
        span = self.span(node)
        if isinstance(node, ast.Constant | ast.Name | ast.Subscript):
            return ()
        if isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub | ast.UAdd):
                raise self.error(f"the operator {type(node.op).__name__} is not in the language",
                                 span)
            return (node.operand,)
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise self.error(f"the operator {type(node.op).__name__} is not in the language "
                                 "(use + - * / **)", span)
            return (node.left, node.right)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                raise self.error("only the functions of the language can be called "
                                 f"({', '.join(sorted(FUNCTIONS))})", span)
            fname = node.func.id
            if fname not in FUNCTIONS:
                raise self.error(f"unknown function '{fname}'; the language has "
                                 f"{', '.join(sorted(FUNCTIONS))}"[:300], self.span(node.func))
            if node.keywords:
                raise self.error(f"{fname}() takes no keyword arguments", span)
            want = 2 if fname in BINARY_FUNCTIONS else 1
            if len(node.args) != want or any(isinstance(a, ast.Starred) for a in node.args):
                raise self.error(f"{fname}() takes {want} argument{'s' * (want > 1)}", span)
            return tuple(node.args)
        kinds = {ast.Attribute: "attribute access", ast.Lambda: "lambda",
                 ast.ListComp: "comprehension", ast.GeneratorExp: "comprehension",
                 ast.SetComp: "comprehension", ast.DictComp: "comprehension",
                 ast.Compare: "comparison", ast.BoolOp: "boolean operator",
                 ast.IfExp: "conditional expression", ast.NamedExpr: "':=' assignment",
                 ast.JoinedStr: "string", ast.Await: "await", ast.Yield: "yield",
                 ast.YieldFrom: "yield", ast.Starred: "'*' unpacking"}
        what = kinds.get(type(node), type(node).__name__)
        raise self.error(f"{what} is not part of the recurrence language", span)

    def build(self, node: ast.expr, args: list[_Built]) -> _Built:
        """The node of the language, from its converted operands."""
        span = self.span(node)
        if isinstance(node, ast.Constant):
            return self.number(node, span)
        if isinstance(node, ast.Name):
            self.check_name(node.id, span, indexed=False)
            return _Built(Ref(node.id, None, False, span))
        if isinstance(node, ast.Subscript):
            if not isinstance(node.value, ast.Name):
                raise self.error("only names can be indexed", span)
            self.check_name(node.value.id, self.span(node.value), indexed=True)
            lag, lane = self.index(node.slice, node)
            return _Built(Ref(node.value.id, lag, lane, span))
        if isinstance(node, ast.UnaryOp):
            (operand,) = args
            op: Literal["-", "+"] = "-" if isinstance(node.op, ast.USub) else "+"
            value = None
            if operand.value is not None:
                value = -operand.value if op == "-" else operand.value
            return _Built(Unary(op, operand.expr, span), value, operand.power)
        if isinstance(node, ast.BinOp):
            return self.binary(_BINOPS[type(node.op)], args[0], args[1], span)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        call = Call(node.func.id, tuple(a.expr for a in args), span)
        values = [a.value for a in args]
        # sympy merges a power inside abs() and sqrt() with one outside: abs(x**8)**8 is x**64
        power = args[0].power if call.func in ("abs", "sqrt") else None
        if power is not None and call.func == "sqrt":
            power /= 2
        if call.func in REDUCTIONS or any(v is None for v in values):
            return _Built(call, None, power)
        return _Built(call, self.constant(_call_value(call.func, values), span), power)

    def check_name(self, name: str, span: Span, indexed: bool) -> None:
        if name in (TIME_AXIS, STATE_AXIS):
            if indexed:
                raise self.error(f"'{name}' cannot be indexed", span)
            raise self.error(f"'{name}' is an index and can only appear inside [...]", span)
        if name in FUNCTIONS:
            if indexed:
                raise self.error(f"'{name}' cannot be indexed", span)
            raise self.error(f"'{name}' is a function: call it, as in {name}(x[t])", span)
        if name in RESERVED_NAMES:
            raise self.error(f"'{name}' is reserved and cannot name an input or a parameter: "
                             f"{RESERVED_NAMES[name]}", span)

    def number(self, node: ast.Constant, span: Span) -> _Built:
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.error(f"only numbers are allowed as constants, not {v!r}"[:200], span)
        text = self.segment(span)
        if isinstance(v, float) and not math.isfinite(v):
            raise self.error(f"the number {text} is not finite (it overflows even float64)",
                             span)
        if abs(v) > MAX_CONSTANT:
            raise self.error(f"the number {text} is too large: constants must fit in float32 "
                             f"(|x| <= {MAX_CONSTANT:.4g})", span)
        if v != 0 and abs(v) < MIN_CONSTANT:
            raise self.error(f"the number {text} is too small: it would become 0 in float32 "
                             f"(non-zero constants need |x| >= {MIN_CONSTANT:.4g})", span)
        return _Built(Num(float(v), span), float(v))

    def binary(self, op: Literal["+", "-", "*", "/", "**"], left: _Built, right: _Built,
               span: Span) -> _Built:
        node = Binary(op, left.expr, right.expr, span)
        # the exponent a power of this node would multiply: sympy merges (x**a)**b into
        # x**(a*b) and distributes a power over a product, (x**a * y)**b = x**(a*b) * y**b
        power = None
        if op in "*/" and (left.power is not None or right.power is not None):
            power = max(abs(left.power or 0.0), abs(right.power or 0.0))
        if op == "**":
            if not _is_number(right.expr) or right.value is None:
                raise self.error("the exponent of ** must be a number", right.expr.span)
            p = right.value
            if abs(p) > MAX_EXPONENT:
                raise self.error(f"the exponent {self.segment(right.expr.span)} is too large: "
                                 f"exponents of ** are limited to |p| <= {MAX_EXPONENT}",
                                 right.expr.span)
            power = abs(p) * (left.power if left.power is not None else 1.0)
            if power > MAX_EXPONENT:
                raise self.error(f"a power of a power: the exponents multiply to {power:g}; "
                                 f"exponents of ** are limited to |p| <= {MAX_EXPONENT}", span)
        if op == "/" and right.value == 0:
            raise self.error("division by zero", span)
        if left.value is None or right.value is None:
            return _Built(node, None, power)
        a, b = left.value, right.value
        try:
            if op == "+":
                value: float | complex = a + b
            elif op == "-":
                value = a - b
            elif op == "*":
                value = a * b
            elif op == "/":
                value = a / b
            else:
                value = a ** b
        except ZeroDivisionError:
            raise self.error(f"the constant `{self.segment(span)}` divides by zero",
                             span) from None
        except OverflowError:
            value = math.inf
        return _Built(node, self.constant(value, span), power)

    def constant(self, value: float | complex | None, span: Span) -> float:
        """Check the value of a constant subexpression: a finite real within float32's range."""
        text = self.segment(span)
        if value is None or isinstance(value, complex) or math.isnan(value):
            raise self.error(f"the constant `{text}` is not a real number", span)
        if math.isinf(value) or abs(value) > MAX_CONSTANT:
            shown = f"{value:.3g}" if math.isfinite(value) else "infinite"
            raise self.error(f"the constant `{text}` is {shown}: constants must fit in float32 "
                             f"(|x| <= {MAX_CONSTANT:.4g})", span)
        return float(value)

    # -- semantic checks ---------------------------------------------------------------------
_FAMILY = {"+": "+", "-": "+", "*": "*", "/": "*", "**": "**"}


def _depth(e: Expr, args: list[_Built]) -> int:
    """Nesting depth as sympy will see it: a chain of + and - (or of * and /) is one level,
    and so is a run of unary signs."""
    if not args:
        return 0
    if isinstance(e, Unary):
        return args[0].depth if isinstance(e.operand, Unary) else args[0].depth + 1
    if (isinstance(e, Binary) and isinstance(e.left, Binary) and e.op != "**"
            and _FAMILY[e.left.op] == _FAMILY[e.op]):
        return max(args[0].depth, args[1].depth + 1)
    return 1 + max(a.depth for a in args)


def _too_many() -> str:
    return (f"the recurrence has more than {MAX_NODES} terms (names, numbers, operators and "
            "calls): split it, or sum the inputs before the scan")


def _call_value(func: str, args: list[float | None]) -> float | complex | None:
    """The value of a function of constants (None: not a real number)."""
    x = args[0]
    assert x is not None
    try:
        if func == "exp":
            return math.exp(x)
        if func == "log":
            return math.log(x) if x > 0 else (-math.inf if x == 0 else None)
        if func == "sqrt":
            return math.sqrt(x) if x >= 0 else None
        if func == "tanh":
            return math.tanh(x)
        if func == "abs":
            return abs(x)
        if func == "sigmoid":
            return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
        if func == "softplus":
            return max(x, 0.0) + math.log1p(math.exp(-abs(x)))
        y = args[1]
        assert y is not None
        return max(x, y) if func == "max" else min(x, y)
    except OverflowError:
        return math.inf


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
