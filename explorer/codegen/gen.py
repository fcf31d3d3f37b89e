"""What every level of the lowering shares: what the scan kernels read and write
(:class:`ScanIO`, from the plan's stored outputs and lane sum), a sequence's indices and
parameters, the loads of its timed inputs (forwards or backwards in time), the scan element at
a position, the outputs from the state, and the readouts; each op located at the recurrence
term it comes from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import sympy
from mlir.dialects import arith, memref
from mlir.ir import (
    IndexType,
    IntegerType,
    Value,
)

from explorer.codegen.emit import (
    Algebra,
    Element,
    ExprEmitter,
    add_i,
    cf,
    ci,
    is_lane_sum,
    mul_i,
)
from explorer.codegen.hoist import PREFIX as CHANNEL_VALUE
from explorer.codegen.options import Options
from explorer.codegen.threads import for_loop, if_then, select_element
from explorer.errors import CompileError
from explorer.frontend.names import h0_name, last_name


@dataclass(frozen=True)
class ScanIO:
    """What the scan kernels read and write, given the outputs the plan stores and its lane
    sum (one owner for the code generator, the shared-memory layouts and the kernel list)."""

    #: states the scan kernels write: those stored, and every state a readout kernel reads back
    states: tuple[str, ...]
    #: readouts computed beside the state (a recurrence without lanes; a vector one's lane
    #: readouts, a value per lane), those stored
    readouts: tuple[str, ...]
    #: readouts summed over the lanes inside the scan kernel (a fused lane sum)
    lane_readouts: tuple[str, ...]
    #: the distinct arguments of their sums over n: each lane's term, per step
    lane_terms: tuple[sympy.Expr, ...]
    #: timed inputs read per sequence (the coefficients, the readouts beside the state, the
    #: lane terms), in the order of the recurrence's inputs
    inputs: tuple[str, ...]
    #: parameters read per sequence
    params: frozenset[str]
    #: names the lane-summed readouts read outside their sums (per channel, once per step)
    outer: frozenset[str]
    #: readouts a readout kernel computes after the scan, reading the states back
    read_back: tuple[str, ...] = ()
    #: states whose last state (``<state>_last``) is stored, once a sequence by its thread
    last: tuple[str, ...] = ()

    @property
    def outputs(self) -> tuple[str, ...]:
        """What a thread writes per sequence and step: the states, then the readouts."""
        return self.states + self.readouts


def scan_io(form: Any, stored: Sequence[str] | None = None, lane_sum: Any = None) -> ScanIO:
    """:class:`ScanIO` of ``form`` storing ``stored`` (all when None), lane sum ``lane_sum``."""
    from explorer.passes.outputs import last_states

    rec = form.recurrence
    kept = tuple(form.outputs) if stored is None else tuple(stored)
    state_syms = set(form.state_symbols)
    read_back = lane_sum is not None and not lane_sum.fused
    states = tuple(s for s in rec.states if s in kept or read_back)
    # a vector state's readouts beside the state are its lane readouts (a value per lane)
    beside = rec.lane_readouts if form.vector else rec.readouts
    readouts = tuple(r for r in beside if r in kept)
    lane_readouts = (tuple(lane_sum.readouts) if lane_sum is not None and lane_sum.fused
                     else ())
    terms: list[sympy.Expr] = []
    outer: set[str] = set()
    for r in lane_readouts:
        for arg in lane_sum_args(form.readouts[r]):
            if arg not in terms:
                terms.append(arg)
        outer |= {s.name for s in outer_symbols(form.readouts[r]) if s not in state_syms}
    used = {s.name for s in (*form.A.free_symbols, *form.b.free_symbols)}
    for r in readouts:
        used |= {s.name for s in form.readouts[r].free_symbols if s not in state_syms}
    for arg in terms:
        used |= {s.name for s in arg.free_symbols if s not in state_syms}
    timed = set(form.inputs)
    return ScanIO(states, readouts, lane_readouts, tuple(terms),
                  tuple(n for n in form.inputs if n in used),
                  frozenset(n for n in used if n not in timed), frozenset(outer),
                  tuple(lane_sum.readouts) if read_back else (), last_states(rec, kept))


def lane_sum_args(expr: sympy.Basic) -> list[sympy.Expr]:
    """The arguments of the sums over n in ``expr``, in the order met."""
    out: list[sympy.Expr] = []
    for node in sympy.preorder_traversal(expr):
        if is_lane_sum(node) and node.args[0] not in out:
            out.append(node.args[0])
    return out


def outer_symbols(expr: sympy.Basic) -> set[sympy.Symbol]:
    """The symbols ``expr`` reads outside its sums over n."""
    out: set[sympy.Symbol] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if is_lane_sum(e):
            continue
        if isinstance(e, sympy.Symbol):
            out.add(e)
        else:
            stack.extend(e.args)
    return out


@dataclass(frozen=True)
class Locations:
    """Where the kernels' ops come from in the recurrence: MLIR locations of each name's first
    use and of each statement (see :mod:`explorer.passes.lower`)."""

    names: dict[str, Any] = field(default_factory=dict)
    statements: dict[str, Any] = field(default_factory=dict)


@dataclass
class Seq:
    """Index values and hoisted parameters of one sequence (c, n)."""

    c: Value
    n: Value
    timed_base: dict[str, Value]
    params: dict[str, Value]
    state_base: Value          # offset of (c, n, t=0) in a lane-wide output / (c, 0) otherwise
    readout_base: Value        # offset of (c, t=0) in a readout


def offset_load(array: Value, row: Value, time: Value, k: int, limit: Value) -> Value:
    """``array[row + time + k]``, zero where ``time + k`` is outside ``0 .. limit`` (the
    index clamped into the row, so that no access leaves it: ``time`` itself may be outside
    the row, at a position past the end that a tile loads ahead)."""
    tk = add_i(time, ci(k))
    ok = arith.andi(arith.cmpi(arith.CmpIPredicate.sle, tk, limit),
                    arith.cmpi(arith.CmpIPredicate.sge, tk, ci(0)))
    safe = arith.maxsi(arith.minsi(tk, limit), ci(0))
    return arith.select(ok, memref.load(array, [add_i(row, safe)]), cf(0.0))


@dataclass
class Stream:
    """A row of a timed array read or written by position: ``array[row + t]``, or
    ``array[row + last - t]`` when ``last`` (L - 1) is given: a scan backwards in time.

    ``end_first`` associates the reverse index as ``(row + last) - t`` (the row's end is
    invariant in a tile loop) rather than ``row + (last - t)``. Which one ptxas allocates
    better depends on the kernel (ptxas 13.0, sm_90): the reverse look-back kernel of the
    affine scan spills 216 bytes with the second and 36 with the first (171 -> 89 us at
    16 x 2^20 on an H100), while the selective scan adjoint's lane loop, whose rows move
    with each lane, spills 428 bytes with the second and 744 with the first, 2.4x slower."""

    array: Value
    row: Value
    last: Value | None = None
    loc: Any = None       # the location of the term that reads it, for its loads
    end_first: bool = False
    #: read in place at time ``t + offset`` (the plan's ``scan.read``), zero outside
    #: ``0 .. limit`` (``limit``: L - 1, given with an offset)
    offset: int = 0
    limit: Value | None = None
    #: added into the output (a lane readout: channels that share its row sum there)
    accumulate: bool = False

    def store(self, v: Value, t: Value) -> None:
        """Write ``v`` at scan position ``t``: stored, or added (``memref.atomic_rmw addf``)."""
        if self.accumulate:
            memref.atomic_rmw(arith.AtomicRMWKind.addf, v, self.array, [self.at(t)])
        else:
            memref.store(v, self.array, [self.at(t)])

    def load(self, t: Value) -> Value:
        with self.loc or nullcontext():
            if self.offset:
                assert self.limit is not None
                return offset_load(self.array, self.row, self.time(t), self.offset, self.limit)
            return memref.load(self.array, [self.at(t)])

    def time(self, t: Value) -> Value:
        """The time of scan position ``t``."""
        return t if self.last is None else arith.subi(self.last, t)

    def at(self, t: Value) -> Value:
        if self.last is None:
            return add_i(self.row, t)
        if self.end_first:
            return arith.subi(add_i(self.row, self.last), t)
        return add_i(self.row, arith.subi(self.last, t))


class Gen:
    """Emits the pieces shared by every strategy and target."""

    def __init__(self, form: Any, options: Options, arrays: dict[str, Value],
                 C: Value, N: Value, L: Value, io: ScanIO | None = None) -> None:
        self.form = form
        self.options = options
        #: the levels of the block tree, read from the plan
        self.sweeps: tuple[Any, ...] = ()
        #: the plan scans backwards in time: position t of the scan is time L - 1 - t
        self.reverse = False
        #: locations in the recurrence: of a name's first use, and of each statement
        self.locs: dict[str, Any] = {}
        self.statement_locs: dict[str, Any] = {}
        self.alg = Algebra(form.A)
        self.arrays = arrays
        self.C, self.N, self.L = C, N, L
        #: the per-call chunk length (Blelloch), set when the arguments are bound
        self.Tc: Value | None = None
        #: inputs read in place at another time (``scan.read``): name -> offset
        self.offsets: dict[str, int] = dict(options.read_offsets)
        #: a varlen plan's segment marks (``scan.segments``), set when the arguments are bound
        self.marks: Value | None = None
        #: the inputs that may come with a row per block of channels, and the channels that
        #: share a row (arguments of the call), set when the arguments are bound
        self.row_div: dict[str, Value] = {}
        #: the parameters' row counts (channel c reads row ``c % modulus``; call arguments)
        self.row_mod: dict[str, Value] = {}
        self.lanes = set(form.recurrence.lane_names)
        self.timed = set(form.inputs)
        self.states = tuple(form.recurrence.states)
        self.state_index = {sym: i for i, sym in enumerate(form.state_symbols)}
        self.state_out = {s: form.components.index((s, 0)) for s in self.states}
        self.readouts = dict(form.readouts)
        self.coeff_names = {s.name for s in (*form.A.free_symbols, *form.b.free_symbols)}
        self.readout_names = {s.name for e in self.readouts.values() for s in e.free_symbols
                              if s not in self.state_index}
        for name in self.coeff_names:
            if name not in self.arrays:
                raise CompileError(f"the coefficients use {name!r}, which is neither an input "
                                   "nor a parameter")
        #: what the scan kernels read and write (the plan's outputs and lane sum)
        self.io = io if io is not None else scan_io(form)
        self.scan_readouts = {r: self.readouts[r] for r in self.io.readouts}
        #: timed inputs a scan kernel reads, in a fixed order, and the parameters
        self.scan_inputs = list(self.io.inputs)
        self.scan_params = set(self.io.params)
        #: timed inputs the coefficients alone read (the reduce kernel)
        self.coeff_inputs = [n for n in form.inputs if n in self.coeff_names]
        #: outputs of a scan kernel: the states it writes, then the readouts computed with them
        self.scan_outputs = list(self.io.outputs)

    # -- sequence setup ---------------------------------------------------------------------
    def lane_row(self, name: str, c: Value, n: Value) -> Value:
        """The row of lane n of channel c in ``name`` (an input or lane readout): one a
        (channel, lane), or a (block of channels, lane) where channels share rows."""
        div = self.row_div.get(name)
        return add_i(mul_i(c if div is None else arith.divui(c, div), self.N), n)

    def seq(self, c: Value, n: Value, names: set[str]) -> Seq:
        lane_row = add_i(mul_i(c, self.N), n)
        timed_base: dict[str, Value] = {}
        params: dict[str, Value] = {}
        for name in sorted(names):
            if name in self.timed:
                row = (self.lane_row(name, c, n) if name in self.row_div else
                       lane_row if name in self.lanes else c)
                timed_base[name] = mul_i(row, self.L)
            elif name in self.arrays:
                row = arith.remui(c, self.row_mod[name]) if name in self.row_mod else c
                at = add_i(mul_i(row, self.N), n) if name in self.lanes else row
                with self.loc(name):
                    params[name] = memref.load(self.arrays[name], [at])
            else:
                raise CompileError(f"the coefficients use {name!r}, which is neither an input "
                                   "nor a parameter")
        state_base = mul_i(lane_row if self.form.vector else c, self.L)
        return Seq(c, n, timed_base, params, state_base, mul_i(c, self.L))

    def loc(self, name: str) -> Any:
        """The location of ``name``'s term in the recurrence (a context for the ops that
        read it), or no change."""
        return self.locs.get(name) or nullcontext()

    def at(self, row_start: Value, t: Value) -> Value:
        """Index of scan position ``t`` in a timed row starting at ``row_start``."""
        return add_i(row_start, arith.subi(arith.subi(self.L, ci(1)), t) if self.reverse else t)

    def value(self, seq: Seq, name: str, t: Value) -> Value:
        if name in seq.timed_base:
            with self.loc(name):
                return self.load_timed(name, seq.timed_base[name], t)
        return seq.params[name]

    def load_timed(self, name: str, row_start: Value, t: Value) -> Value:
        """Timed input ``name`` at scan position ``t`` of the row starting at ``row_start``
        (at its offset in time, :attr:`offsets`)."""
        k = self.offsets.get(name, 0)
        if not k:
            return memref.load(self.arrays[name], [self.at(row_start, t)])
        return Stream(self.arrays[name], row_start, self._last(), offset=k,
                      limit=arith.subi(self.L, ci(1))).load(t)

    def _state_at(self, seq: Seq, j: Value | None) -> Value:
        """Where a state of ``seq`` is in an initial or last state array: ``(c, n)`` of
        ``(C, N)`` (``c`` of ``(C,)``), in the j-th such block of a packed batch."""
        at = add_i(mul_i(seq.c, self.N), seq.n) if self.form.vector else seq.c
        if j is None:
            return at
        return add_i(mul_i(j, mul_i(self.C, self.N) if self.form.vector else self.C), at)

    def initial_state(self, seq: Seq, j: Value | None = None) -> list[Value]:
        """The state vector before t = 0 (of the j-th sequence of a packed batch): h0 for
        ``h[t-1]``, zero for older lags."""
        at = self._state_at(seq, j)
        out = []
        for name, lag in self.form.components:
            if lag == 0:
                out.append(memref.load(self.arrays[h0_name(name)], [at]))
            else:
                out.append(cf(0.0))
        return out

    def mark_at(self, t: Value) -> tuple[Value, Value, Value]:
        """(sequence j, starts here, ends here) at scan position ``t`` of a varlen plan, from
        its segment marks (per time step ``4 j + first + 2 last``, exact in float32: see
        :func:`explorer.runtime.contract.segment_marks`); backwards in time the sequence
        starts at its last step. ``t`` is clamped to the sequence (positions past its end are
        read by the trees and then dropped)."""
        assert self.marks is not None
        tc = arith.minui(t, arith.subi(self.L, ci(1)))
        raw = memref.load(self.marks, [self.at(ci(0), tc)])
        m = arith.index_cast(IndexType.get(), arith.fptoui(IntegerType.get_signless(64), raw))
        flags = arith.remui(m, ci(4))
        first = arith.cmpi(arith.CmpIPredicate.ne, arith.remui(flags, ci(2)), ci(0))
        last = arith.cmpi(arith.CmpIPredicate.ne, arith.divui(flags, ci(2)), ci(0))
        return arith.divui(m, ci(4)), *((last, first) if self.reverse else (first, last))

    def last_state_hook(self, seq: Seq) -> Callable[[Value, list[Value]], None] | None:
        """:meth:`last_state_at` of ``seq`` for a block scan (None: no last state stored)."""
        if not self.io.last:
            return None
        return lambda t, h: self.last_state_at(seq, t, h)

    def last_state_at(self, seq: Seq, t: Value, h: Sequence[Value]) -> None:
        """Store the last states the plan keeps (:attr:`ScanIO.last`) when scan position
        ``t`` (< L) is the last step of its sequence: ``h`` is the state after it."""
        if not self.io.last:
            return
        if self.marks is not None:
            j, _, end = self.mark_at(t)
        else:
            j, end = None, arith.cmpi(arith.CmpIPredicate.eq, t, arith.subi(self.L, ci(1)))

        def put() -> None:
            at = self._state_at(seq, j)
            for s in self.io.last:
                memref.store(h[self.state_out[s]], self.arrays[last_name(s)], [at])
        if_then(end, put)

    def _last(self) -> Value | None:
        return arith.subi(self.L, ci(1)) if self.reverse else None

    def in_streams(self, seq: Seq, names: Sequence[str], end_first: bool = True) -> list[Stream]:
        limit = arith.subi(self.L, ci(1)) if any(n in self.offsets for n in names) else None
        return [Stream(self.arrays[n], seq.timed_base[n], self._last(), self.locs.get(n),
                       end_first, self.offsets.get(n, 0), limit) for n in names]

    def out_streams(self, seq: Seq, end_first: bool = True) -> list[Stream]:
        last = self._last()
        return ([Stream(self.arrays[s], seq.state_base, last, None, end_first)
                 for s in self.io.states]
                + [self.added_stream(r, seq.c, seq.n, end_first) if self.form.output_is_lane(r)
                   else Stream(self.arrays[r], seq.readout_base, last, None, end_first)
                   for r in self.scan_readouts])

    def added_stream(self, name: str, c: Value, n: Value, end_first: bool = False) -> Stream:
        """The row of lane readout ``name`` that lane n of channel c adds into (``c //
        divisor`` where channels share rows)."""
        return Stream(self.arrays[name], mul_i(self.lane_row(name, c, n), self.L),
                      self._last(), None, end_first, accumulate=True)

    def staged(self, name: str) -> bool:
        """Read at each position (a timed input, or a channel value): not a parameter."""
        return name in self.timed or name.startswith(CHANNEL_VALUE)

    def leaf_from(self, seq: Seq, timed: Callable[[str], Value], A: Any = None,
                  b: Any = None, t: Value | None = None) -> Element:
        """Element (A_t, b_t); ``timed(name)`` gives the value of a timed input (or a channel
        value) at t. ``A`` and ``b``: the coefficients as computed (by default the form's).

        In a varlen plan (``scan.segments``) ``t``, the scan position, is required: where a
        sequence starts the element becomes ``(0, A_t h0_j + b_t)``, ``h0_j`` the initial
        state of that sequence, so whatever came before is forgotten (a segmented scan: the
        one place that knows of sequence boundaries besides the last states)."""
        def lookup(s: sympy.Symbol) -> Value:
            return timed(s.name) if self.staged(s.name) else seq.params[s.name]
        e = self.alg.leaf(self.form.A if A is None else A, self.form.b if b is None else b,
                          ExprEmitter(lookup))
        if self.marks is None:
            return e
        if t is None:
            raise CompileError("a varlen plan builds every leaf with its scan position")
        j, start, _ = self.mark_at(t)
        # a load and a select at every element, not a branch: measured on an H100 (packed
        # Mamba preset, 8 sequences x 1536 channels, 2^17 steps, chunked blelloch) a branch
        # that reads the initial state only at starts took 20.4 ms against 18.9 ms
        fresh = self.alg.pack([cf(0.0)] * len(e.A) + self.alg.apply(e, self.initial_state(seq, j)))
        return select_element(start, fresh, e, self.alg)

    def outputs_at(self, seq: Seq, h: Sequence[Value], timed: Callable[[str], Value],
                   exprs: dict[str, sympy.Expr] | None = None) -> list[Value]:
        """Values of :attr:`scan_outputs` at one position from the state there (``exprs``:
        readouts computed otherwise, with the channel values of a lane loop in them)."""
        out = [h[self.state_out[s]] for s in self.io.states]
        for name, expr in self.scan_readouts.items():
            def lookup(sym: sympy.Symbol) -> Value:
                if sym in self.state_index:
                    return h[self.state_index[sym]]
                return timed(sym.name) if self.staged(sym.name) else seq.params[sym.name]
            with self.statement_locs.get(name) or nullcontext():
                out.append(ExprEmitter(lookup)((exprs or {}).get(name, expr)))
        return out

    def lane_terms_at(self, seq: Seq, h: Sequence[Value], timed: Callable[[str], Value],
                      terms: Sequence[sympy.Expr] = ()) -> list[Value]:
        """This lane's term of each sum over n (:attr:`ScanIO.lane_terms`, or ``terms``, the
        same computed otherwise) at one position, from its state there."""
        def lookup(sym: sympy.Symbol) -> Value:
            if sym in self.state_index:
                return h[self.state_index[sym]]
            return timed(sym.name) if self.staged(sym.name) else seq.params[sym.name]
        emit = ExprEmitter(lookup)
        with self.statement_locs.get(self.io.lane_readouts[0]) or nullcontext():
            return [emit(arg) for arg in (terms or self.io.lane_terms)]

    def channel_params(self, c: Value) -> dict[str, Value]:
        """The parameters the lane-summed readouts read outside their sums, of channel c."""
        return self.seq(c, ci(0), {n for n in self.io.outer if n not in self.timed}).params

    def lane_readouts_at(self, params: dict[str, Value], sums: Sequence[Value],
                         timed: Callable[[str], Value]) -> list[Value]:
        """The values of :attr:`ScanIO.lane_readouts` of one channel at one step, given the
        sums over the lanes of each term (``sums``, in :attr:`ScanIO.lane_terms` order), its
        parameters and ``timed(name)``, a timed input of the channel at the step."""
        by_term = dict(zip(self.io.lane_terms, sums, strict=True))

        def outer(sym: sympy.Symbol) -> Value:
            if sym in self.state_index or sym.name in self.lanes:
                raise CompileError(f"readout uses {sym} outside sum(...): a lane-indexed value "
                                   "must be summed over n")
            return timed(sym.name) if sym.name in self.timed else params[sym.name]
        out = []
        for name in self.io.lane_readouts:
            with self.statement_locs.get(name) or nullcontext():
                out.append(ExprEmitter(outer, by_term.__getitem__)(self.readouts[name]))
        return out

    def lane_readout(self, c: Value, t: Value) -> None:
        """Readouts of a vector recurrence at (c, t): sums over the N lanes of channel c."""
        csq = self.seq(c, ci(0), {n for n in self.readout_names if n not in self.lanes})

        def outer(sym: sympy.Symbol) -> Value:
            if sym in self.state_index or sym.name in self.lanes:
                raise CompileError(f"readout uses {sym} outside sum(...): a lane-indexed value "
                                   "must be summed over n")
            return self.value(csq, sym.name, t)

        def lane_sum(arg: sympy.Expr) -> Value:
            def body(m: Value, acc: list[Value]) -> list[Value]:
                msq = self.seq(c, m, {s.name for s in arg.free_symbols
                                      if s not in self.state_index})
                lane_row = add_i(mul_i(c, self.N), m)

                def inner(sym: sympy.Symbol) -> Value:
                    if sym in self.state_index:
                        name, lag = self.form.components[self.state_index[sym]]
                        if lag != 0:
                            raise CompileError(f"readout reads {sym}: only the current state "
                                               "can be read in a lane sum")
                        return memref.load(self.arrays[name],
                                           [self.at(mul_i(lane_row, self.L), t)])
                    return self.value(msq, sym.name, t)
                return [arith.addf(acc[0], ExprEmitter(inner)(arg))]
            return for_loop(ci(0), self.N, ci(1), body, [cf(0.0)])[0]

        for name in self.io.read_back:
            with self.statement_locs.get(name) or nullcontext():
                y = ExprEmitter(outer, lane_sum)(self.readouts[name])
                memref.store(y, self.arrays[name], [self.at(mul_i(c, self.L), t)])
