"""The expression tree of the recurrence language (:mod:`explorer.frontend.recurrence` reads
text into it): nodes with their spans in the text, statements, and the walks over them.
Our own tree, so that nothing of Python's leaks through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeVar


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


class _Node:
    """Equality, hash and repr of an expression without recursion: a sum of thousands of terms
    is a chain thousands of nodes deep, deeper than Python's recursion limit."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Node):
            return NotImplemented
        return _tokens(self) == _tokens(other)  # type: ignore[arg-type]

    def __hash__(self) -> int:
        return hash(_tokens(self))  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({to_text(self)!r})"  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False, repr=False)
class Num(_Node):
    value: float
    span: Span = field(compare=False)


@dataclass(frozen=True, eq=False, repr=False)
class Ref(_Node):
    """A name, possibly indexed: ``A`` (lag None), ``x[t]`` (lag 0), ``h[t-1, n]`` (lag 1, lane)."""

    name: str
    lag: int | None
    lane: bool
    span: Span = field(compare=False)


@dataclass(frozen=True, eq=False, repr=False)
class Unary(_Node):
    op: Literal["-", "+"]
    operand: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True, eq=False, repr=False)
class Binary(_Node):
    op: Literal["+", "-", "*", "/", "**"]
    left: Expr
    right: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True, eq=False, repr=False)
class Call(_Node):
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
    #: where the defined name is written (``h`` of ``h[t] = ...``)
    target_span: Span | None = field(compare=False, default=None)


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of a node, left to right."""
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Call):
        return e.args
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Yield every node of an expression, parents first, left to right (no recursion)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


T = TypeVar("T")


def fold(expr: Expr, visit: Callable[[Expr, list[T]], T]) -> T:
    """``visit(node, [results of its operands])`` bottom-up, left to right, without recursion.

    Every computation over a whole expression goes through here (or :func:`walk`): a legal
    recurrence may be a chain of thousands of terms, deeper than Python's recursion limit.
    """
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    results: list[T] = []
    while stack:
        node, expanded = stack.pop()
        kids = children(node)
        if expanded or not kids:
            k = len(kids)
            args = results[len(results) - k:] if k else []
            if k:
                del results[len(results) - k:]
            results.append(visit(node, args))
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(kids))
    return results[0]


def _tokens(expr: Expr) -> tuple[object, ...]:
    """The tree as a flat tuple (pre-order, with arities): equal tuples, equal trees."""
    out: list[object] = []
    for node in walk(expr):
        if isinstance(node, Num):
            out.append(("num", node.value))
        elif isinstance(node, Ref):
            out.append(("ref", node.name, node.lag, node.lane))
        elif isinstance(node, Unary | Binary):
            out.append((type(node).__name__, node.op))
        else:
            out.append(("call", node.func, len(node.args)))
    return tuple(out)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "**": 4}
_ATOM = 5


def to_text(expr: Expr) -> str:
    """Render an expression back to the language, with only the parentheses it needs."""

    def wrap(part: tuple[str, int], min_precedence: int) -> str:
        text, p = part
        return f"({text})" if p < min_precedence else text

    def visit(e: Expr, parts: list[tuple[str, int]]) -> tuple[str, int]:
        if isinstance(e, Num):
            v = e.value
            return (repr(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(v)), _ATOM
        if isinstance(e, Ref):
            if e.lag is None:
                return (f"{e.name}[n]" if e.lane else e.name), _ATOM
            t = "t" if e.lag == 0 else f"t-{e.lag}"
            return (f"{e.name}[{t}, n]" if e.lane else f"{e.name}[{t}]"), _ATOM
        if isinstance(e, Unary):
            return f"{e.op}{wrap(parts[0], 3)}", 3
        if isinstance(e, Binary):
            p = _PRECEDENCE[e.op]
            if e.op == "**":
                return f"{wrap(parts[0], p + 1)} ** {wrap(parts[1], p)}", p
            # the right operand of - and / binds tighter: a - (b - c)
            right_p = p + 1 if e.op in "-/" else p
            return f"{wrap(parts[0], p)} {e.op} {wrap(parts[1], right_p)}", p
        assert isinstance(e, Call)
        return f"{e.func}({', '.join(text for text, _ in parts)})", _ATOM

    return fold(expr, visit)[0]
