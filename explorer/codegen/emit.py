"""Code generation helpers: sympy expressions -> arith/math ops, and the scan element algebra.

Everything here emits at the current MLIR insertion point (``with InsertionPoint(...)``) inside
an active ``Context`` and ``Location``, except the constants of :func:`ci`, :func:`cf` and
:func:`cint` while a function is built inside :func:`constants_in`: those are made once a
function, at the top of its entry block.

* :class:`ExprEmitter` turns a sympy tree (Add, Mul, Pow with integer or +-1/2 exponents, exp,
  log, tanh, sqrt, Abs, Max, Min, symbols, numbers) into ``arith``/``math`` ops on f32 values.
  Symbols are resolved through a callback (which emits the loads), ``LaneSum`` through another.
* :class:`Algebra` is the associative operator of the scan,
  ``(A2, b2) o (A1, b1) = (A2 A1, A2 b1 + b2)``, on values held as SSA values. Only the entries
  of ``A`` that can be non-zero in some product of elements are kept (the structural closure
  of the sparsity pattern of ``A_t``, plus the diagonal for the identity).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from math import copysign as math_copysign

import sympy
from mlir.dialects import arith, math
from mlir.ir import (
    Block,
    F32Type,
    FloatAttr,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Operation,
    Value,
)

from explorer.errors import CompileError
from explorer.passes.lanesum import Sigmoid, Softplus


# --------------------------------------------------------------------------------------------
# small op helpers
# --------------------------------------------------------------------------------------------
def f32() -> F32Type:
    return F32Type.get()


def index() -> IndexType:
    return IndexType.get()


class ConstantPool:
    """The index, f32 and integer constants of one function, each made once, at the top of the
    function's entry block (where they dominate every use in the function), in the order
    first asked for. A kernel asks for the same small constants thousands of times (offsets,
    strides, the identity element); made once each, the module ``scan-lower`` writes is a
    quarter smaller and every pass after it has less to fold."""

    def __init__(self, entry: Block) -> None:
        self.entry = entry
        self.values: dict[tuple[object, ...], Value] = {}
        self.last: Operation | None = None

    def get(self, key: tuple[object, ...], make: Callable[[], Value]) -> Value:
        found = self.values.get(key)
        if found is not None:
            return found
        with InsertionPoint.at_block_begin(self.entry):
            value = make()
        op = value.owner
        if self.last is not None:
            op.move_after(self.last)
        self.last = op
        self.values[key] = value
        return value


class _Pools(threading.local):
    """The pools in effect, innermost last, per thread (compiles may run in several)."""

    def __init__(self) -> None:
        self.stack: list[ConstantPool] = []


_POOLS = _Pools()


@contextmanager
def constants_in(entry: Block) -> Iterator[ConstantPool]:
    """Make the constants :func:`ci` and :func:`cf` ask for while the body runs at the top of
    ``entry``, a function's entry block, once each."""
    pool = ConstantPool(entry)
    _POOLS.stack.append(pool)
    try:
        yield pool
    finally:
        _POOLS.stack.pop()


def cf(value: float) -> Value:
    """An f32 constant (the function's, inside :func:`constants_in`)."""
    v = float(value)

    def make() -> Value:
        return arith.constant(f32(), FloatAttr.get(f32(), v))
    if not _POOLS.stack or v != v:   # NaN: equal to nothing, not pooled
        return make()
    return _POOLS.stack[-1].get(("f32", v, math_copysign(1.0, v)), make)


def ci(value: int) -> Value:
    """An index constant (the function's, inside :func:`constants_in`)."""
    v = int(value)

    def make() -> Value:
        return arith.constant(index(), IntegerAttr.get(index(), v))
    if not _POOLS.stack:
        return make()
    return _POOLS.stack[-1].get(("index", v), make)


def cint(bits: int, value: int) -> Value:
    """A signless integer constant of ``bits`` bits (i1, i32, i64; the function's, inside
    :func:`constants_in`)."""
    v = int(value)

    def make() -> Value:
        return arith.constant(IntegerType.get_signless(bits), v)
    if not _POOLS.stack:
        return make()
    return _POOLS.stack[-1].get((f"i{bits}", v), make)


def ci64(value: int) -> Value:
    return cint(64, value)


def c32(value: int) -> Value:
    """An i32 constant (shuffle offsets and widths, flags)."""
    return cint(32, value)


def to_index(v: Value) -> Value:
    return arith.index_cast(index(), v)


def add_i(a: Value, b: Value) -> Value:
    return arith.addi(a, b)


def mul_i(a: Value, b: Value) -> Value:
    return arith.muli(a, b)


def lt_i(a: Value, b: Value) -> Value:
    return arith.cmpi(arith.CmpIPredicate.slt, a, b)


def eq_i(a: Value, b: Value) -> Value:
    return arith.cmpi(arith.CmpIPredicate.eq, a, b)


def ceil_div(a: Value, b: Value) -> Value:
    return arith.ceildivui(a, b)


# --------------------------------------------------------------------------------------------
# sympy -> arith / math
# --------------------------------------------------------------------------------------------
SymbolLookup = Callable[[sympy.Symbol], Value]
LaneSumLookup = Callable[[sympy.Expr], Value]


def is_lane_sum(expr: sympy.Basic) -> bool:
    return getattr(expr.func, "__name__", "") == "LaneSum"


class ExprEmitter:
    """Emit a sympy expression as f32 arith/math ops; common subexpressions emitted once.

    ``lookup(symbol)`` returns the value of an input, parameter or state symbol (it emits the
    load the first time it is asked); ``lane_sum(arg)`` emits the sum of ``arg`` over the lanes.
    The memo is valid for the block the emitter was created for only.
    """

    def __init__(self, lookup: SymbolLookup, lane_sum: LaneSumLookup | None = None) -> None:
        self.lookup = lookup
        self.lane_sum = lane_sum
        self.memo: dict[sympy.Basic, Value] = {}

    def __call__(self, expr: sympy.Basic) -> Value:
        expr = sympy.sympify(expr)
        hit = self.memo.get(expr)
        if hit is None:
            hit = self._emit(expr)
            self.memo[expr] = hit
        return hit

    # ---------------------------------------------------------------------------------------
    def _emit(self, e: sympy.Basic) -> Value:
        if e.is_Number or isinstance(e, sympy.NumberSymbol):
            return cf(float(e))
        if isinstance(e, sympy.Symbol):
            return self.lookup(e)
        if isinstance(e, sympy.Add):
            return self._add(e)
        if isinstance(e, sympy.Mul):
            return self._mul(e)
        if isinstance(e, sympy.Pow):
            return self._pow(e.base, e.exp)
        if isinstance(e, sympy.exp):
            return math.exp(self(e.args[0]))
        if isinstance(e, sympy.log):
            if len(e.args) != 1:
                raise CompileError(f"log with a base is not supported: {e}")
            return math.log(self(e.args[0]))
        if isinstance(e, sympy.tanh):
            return math.tanh(self(e.args[0]))
        if isinstance(e, Sigmoid):   # 1 / (1 + exp(-x)): 1 / inf is 0, no overflow
            one = cf(1.0)
            return arith.divf(one, arith.addf(one, math.exp(arith.negf(self(e.args[0])))))
        if isinstance(e, Softplus):
            # max(x, 0) + log(1 + exp(-|x|)): exp of a non-positive number, no overflow; as
            # log(1 + exp(x)) did, 0 below x = -16.6 (log1p would keep those tiny values, at
            # a longer libdevice call in the lane loop)
            x = self(e.args[0])
            tail = math.log(arith.addf(cf(1.0), math.exp(arith.negf(math.absf(x)))))
            return arith.addf(arith.maximumf(x, cf(0.0)), tail)
        if isinstance(e, sympy.Abs):
            return math.absf(self(e.args[0]))
        if isinstance(e, sympy.Max | sympy.Min):
            op = arith.maximumf if isinstance(e, sympy.Max) else arith.minimumf
            return _balanced([self(a) for a in e.args], op)
        if is_lane_sum(e):
            if self.lane_sum is None:
                return self(e.args[0])      # one lane: the sum is the term itself
            return self.lane_sum(e.args[0])
        raise CompileError(f"cannot generate code for {type(e).__name__}: {e}")

    def _add(self, e: sympy.Add) -> Value:
        pos: list[Value] = []
        neg: list[Value] = []
        for term in sympy.Add.make_args(e):
            coeff, rest = term.as_coeff_Mul()
            if coeff.is_negative:
                neg.append(self(-coeff * rest))
            else:
                pos.append(self(term))
        if not pos:
            return arith.negf(_balanced(neg, arith.addf))
        out = _balanced(pos, arith.addf)
        return arith.subf(out, _balanced(neg, arith.addf)) if neg else out

    def _mul(self, e: sympy.Mul) -> Value:
        coeff, rest = e.as_coeff_Mul()
        num: list[Value] = []
        den: list[Value] = []
        if coeff != 1 and coeff != -1:
            num.append(cf(abs(float(coeff))))
        for f in sympy.Mul.make_args(rest):
            if isinstance(f, sympy.Pow) and f.exp.is_number and f.exp.is_negative:
                den.append(self._pow(f.base, -f.exp))
            else:
                num.append(self(f))
        out = _balanced(num, arith.mulf) if num else cf(1.0)
        if den:
            out = arith.divf(out, _balanced(den, arith.mulf))
        if coeff.is_negative:
            out = arith.negf(out)
        return out

    def _pow(self, base: sympy.Basic, exp: sympy.Basic) -> Value:
        if exp.is_Integer:
            k = int(exp)
            if k == 0:
                return cf(1.0)
            p = self._int_pow(self(base), abs(k))
            return arith.divf(cf(1.0), p) if k < 0 else p
        if exp == sympy.Rational(1, 2):
            return math.sqrt(self(base))
        if exp == sympy.Rational(-1, 2):
            return math.rsqrt(self(base))
        return math.powf(self(base), self(exp))

    @staticmethod
    def _int_pow(x: Value, k: int) -> Value:
        """x**k by repeated squaring (k >= 1)."""
        result: Value | None = None
        square = x
        while k:
            if k & 1:
                result = square if result is None else arith.mulf(result, square)
            k >>= 1
            if k:
                square = arith.mulf(square, square)
        assert result is not None
        return result


# --------------------------------------------------------------------------------------------
# the scan element (A, b) and its operator
# --------------------------------------------------------------------------------------------
def closure_pattern(A: sympy.Matrix) -> tuple[tuple[int, int], ...]:
    """Entries of A that may be non-zero in the identity or any product of A_t's."""
    S = A.shape[0]
    leaf = {(i, j) for i in range(S) for j in range(S) if A[i, j] != 0}
    pattern = set(leaf) | {(i, i) for i in range(S)}
    while True:
        grown = pattern | {(i, j) for (i, k) in pattern for (k2, j) in leaf if k == k2}
        if grown == pattern:
            break
        pattern = grown
    return tuple(sorted(pattern))


@dataclass
class Element:
    """One scan element held in SSA values: ``A[(i, j)]`` for the kept entries and ``b[i]``."""

    A: dict[tuple[int, int], Value]
    b: list[Value]

    def values(self) -> list[Value]:
        return [*self.A.values(), *self.b]


class Algebra:
    """The affine operator on elements of a given size and sparsity pattern."""

    def __init__(self, A: sympy.Matrix) -> None:
        self.S = int(A.shape[0])
        self.entries = closure_pattern(A)
        self.scalar = self.S == 1

    @property
    def width(self) -> int:
        """Number of f32 values stored per element."""
        return len(self.entries) + self.S

    def names(self) -> list[str]:
        """Readable names of the stored values, in :meth:`Element.values` order."""
        if self.scalar:
            return ["a", "b"]
        return [f"A{i}{j}" for i, j in self.entries] + [f"b{i}" for i in range(self.S)]

    def pack(self, values: Sequence[Value]) -> Element:
        n = len(self.entries)
        return Element(dict(zip(self.entries, values[:n], strict=True)), list(values[n:]))

    def identity(self) -> Element:
        return Element({(i, j): cf(1.0 if i == j else 0.0) for i, j in self.entries},
                       [cf(0.0) for _ in range(self.S)])

    def leaf(self, A: sympy.Matrix, b: sympy.Matrix, emit: ExprEmitter) -> Element:
        """Element (A_t, b_t) from the coefficient expressions."""
        return Element({(i, j): emit(A[i, j]) for i, j in self.entries},
                       [emit(b[i]) for i in range(self.S)])

    def combine(self, later: Element, earlier: Element) -> Element:
        """``later o earlier`` = (A2 A1, A2 b1 + b2): apply ``earlier`` first."""
        A: dict[tuple[int, int], Value] = {}
        for i, j in self.entries:
            terms = [arith.mulf(later.A[(i, k)], earlier.A[(k, j)])
                     for k in range(self.S) if (i, k) in later.A and (k, j) in earlier.A]
            A[(i, j)] = _sum(terms)
        b = [_sum([arith.mulf(later.A[(i, k)], earlier.b[k])
                   for k in range(self.S) if (i, k) in later.A] + [later.b[i]])
             for i in range(self.S)]
        return Element(A, b)

    def apply(self, e: Element, h: Sequence[Value]) -> list[Value]:
        """``A h + b``: the state after the element, from the state ``h`` before it."""
        return [_sum([arith.mulf(e.A[(i, k)], h[k]) for k in range(self.S) if (i, k) in e.A]
                     + [e.b[i]])
                for i in range(self.S)]


def _sum(vals: Sequence[Value]) -> Value:
    if not vals:
        return cf(0.0)
    return _balanced(vals, arith.addf)


def _balanced(vals: Sequence[Value], op: Callable[[Value, Value], Value]) -> Value:
    """Combine the values pairwise, a tree of depth log2(n) rather than a chain of n.

    A sum of hundreds of terms emitted as a chain made MLIR's canonicalizer superlinear (200
    terms: 13.6 s in ``canonicalize``), and the tree has more instruction-level parallelism.
    """
    level = list(vals)
    while len(level) > 1:
        paired = [op(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]
