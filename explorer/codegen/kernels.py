"""Stage 4, code generation: ``AffineForm`` + ``Options`` -> MLIR module (gpu or host dialects).

The module is built with the MLIR Python bindings in a fresh ``Context``; its text is the result
(``BuiltModule.text``), so nothing MLIR-owned outlives the call.

Data layout (see the kernel ABI): every array is a flat, contiguous float32 buffer; inputs are
``(C, L)`` / ``(C, N, L)``, parameters ``(C,)`` / ``(C, N)``, initial states ``(C,)`` / ``(C, N)``,
outputs ``(C, L)`` / ``(C, N, L)``; then ``C``, ``N``, ``L`` as int64, then the workspaces and
the int64 ``time_chunk`` (Blelloch only). A sequence is one ``(channel c, lane n)`` pair,
numbered ``s = c * N + n``.

The same kernel bodies are emitted for both targets. On ``cuda`` a phase runs once per thread
and phases are separated by barriers; on ``cpu`` every kernel becomes a host function
``<kernel>_grid`` that loops over the blocks of its grid, and each phase is a loop over the
threads of the block (barriers vanish: the loop finishes a phase for every thread first).
Workgroup memory becomes a host buffer. So the host run executes the GPU plan step by step,
indices, masks and chunk carries included.

Strategies:

* ``sequential``: one thread per sequence, ``block_size`` sequences per block. Each warp owns
  32 consecutive sequences and walks time in tiles of ``32 x TT`` (sequences x steps), staged
  through workgroup memory: the loads and stores of a tile are coalesced along time
  (consecutive threads touch consecutive addresses), then every thread walks its own row of
  the tile out of workgroup memory with the state in registers. Rows are padded by one float
  so that the column walk is free of bank conflicts. Inputs without the lane axis of a vector
  recurrence are staged once per channel (row ``c - c0``), not once per lane.
* ``blelloch``: a block scans one time chunk of one sequence in tiles of
  ``block_size * elements_per_thread`` elements. A tile is loaded coalesced into workgroup
  memory (the next tile's loads are issued before this tile's tree is walked); each thread
  composes its ``elements_per_thread`` consecutive elements in registers; the Blelloch
  up-sweep and down-sweep run over the ``block_size`` thread aggregates in workgroup memory
  (one padding slot every 32 entries against bank conflicts; ``gpu.barrier`` between levels);
  each thread then applies its exclusive prefix to its own elements and the states leave
  through workgroup memory, coalesced. A sequence may be cut into chunks of ``time_chunk``
  steps handled by different blocks, with three kernels: ``_reduce`` (each chunk's aggregate
  into a workspace), ``_carry`` (one block per sequence scans the aggregates into the state at
  the start of each chunk) and the scan itself, which starts each chunk from its carry. The
  first two run only when ``L > time_chunk``. ``time_chunk`` is a kernel argument chosen by the
  runtime for each call (the manifest's ``chunk_rule``, see
  :func:`explorer.runtime.artifact.choose_time_chunk`): a whole sequence per block (12 bytes
  an element, one kernel) when there are enough sequences to keep the GPU busy, else the
  fewest chunks that give enough blocks (the inputs are then read twice: 20 bytes an element).

Readouts ``y[t] = f(state, inputs)`` are computed with the state in the scan kernel when the
recurrence has no lane axis. With a lane axis (``sum(C[t, n] * h[t, n])``) a readout needs all
``N`` lanes of a channel, which live in different threads or blocks: a last kernel
(``<prefix>_readout``) reads the states back and reduces over the lanes (grid
``C * N * ceil(L / time_chunk)``: ``N * ceil(L / time_chunk)`` blocks per channel, each owning
an equal range of time steps, threads along time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import sympy
from mlir.dialects import arith, func, gpu, memref, nvvm, scf
from mlir.ir import (
    Attribute,
    Context,
    FunctionType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    MemRefType,
    Module,
    ShapedType,
    Type,
    UnitAttr,
    Value,
)

from explorer.codegen.emit import (
    Algebra,
    Element,
    ExprEmitter,
    add_i,
    ceil_div,
    cf,
    ci,
    f32,
    lt_i,
    mul_i,
    to_index,
)
from explorer.codegen.options import SHARED_LIMIT, STATIC_SHARED_LIMIT, Options
from explorer.errors import CompileError, OptionError
from explorer.frontend.names import AGGREGATES, CARRIES, TIME_CHUNK, h0_name

KERNEL_PREFIX = "scanweaver"
WARP = 32
#: rows of a sequential tile loaded before they are stored (loads in flight per thread)
LOAD_BATCH = 8
#: the readout kernel's time_chunk, in blocks of threads: with N lanes a block covers about
#: READOUT_CHUNK_TILES * block_size / N steps
READOUT_CHUNK_TILES = 16
#: the host functions of the CPU target that emulate one kernel's grid end with this
GRID_SUFFIX = "_grid"
#: chunk rule, in units of the device's resident-block slots (SMs x blocks/SM): blocks wanted
#: when chunking, and the sequences from which each runs whole in one block. Measured on an
#: H200 (bench/kernel_speed.py, 2112 slots; ratio to copy, unchunked against the best chunked):
#: 16 sequences 0.05 / 0.53, 256: 0.64 / 0.56, 512: 0.85 / 0.56, 1024: 0.83 / 0.52; chunked,
#: 1 to 4 times the slots in blocks are within a few percent of each other
CHUNK_FILL = 2.0
UNCHUNKED_FROM = 0.1


@dataclass(frozen=True)
class Locations:
    """Where the kernels' ops come from in the recurrence: MLIR locations of each name's first
    use and of each statement (see :mod:`explorer.passes.lower`)."""

    names: dict[str, Any] = field(default_factory=dict)
    statements: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of the module and how to launch it (block, grid rule, shared memory)."""

    name: str
    role: str                     # "scan", "reduce", "carry" or "readout"
    block: tuple[int, int, int]
    sequences_per_block: int      # grid_x = ceil(C * N / sequences_per_block) [* chunks]
    shared_bytes: int = 0         # dynamic shared memory to pass at launch
    static_shared_bytes: int = 0  # shared memory declared in the kernel itself
    # an int, or TIME_CHUNK: the value of the size argument of that name (chosen per call)
    time_chunk: int | str | None = None  # grid_x *= ceil(L / time_chunk); block = seq*chunks+k
    launch_when_longer_than: int | str | None = None  # launched only when L > this
    min_blocks_per_sm: int = 0    # occupancy asked of ptxas (0: none)

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "block": list(self.block),
                               "sequences_per_block": self.sequences_per_block,
                               "shared_bytes": self.shared_bytes}
        if self.time_chunk is not None:
            out["time_chunk"] = self.time_chunk
        if self.launch_when_longer_than is not None:
            out["launch_when_longer_than"] = self.launch_when_longer_than
        return out

    def grid(self, C: int, N: int, L: int, time_chunk: int | None = None) -> int:
        """grid_x of one launch (0: not launched), the rule the runtime follows;
        ``time_chunk``: the per-call value, for the kernels that take it."""
        def value(v: int | str | None) -> int | None:
            if isinstance(v, str):
                if time_chunk is None:
                    raise ValueError(f"{self.name}: give the time_chunk of the call")
                return time_chunk
            return v
        longer = value(self.launch_when_longer_than)
        if longer is not None and L <= longer:
            return 0
        blocks = -(-(C * N) // self.sequences_per_block)
        chunk = value(self.time_chunk)
        if chunk is not None:
            blocks *= -(-L // chunk)
        return blocks


@dataclass
class BuiltModule:
    """The MLIR module of one compile, as text, with what a launcher needs to know."""

    text: str
    kernel_name: str                  # the scan kernel (cuda) or host function (cpu)
    args: list[dict[str, Any]]        # manifest "args", in kernel parameter order
    block: tuple[int, int, int]
    sequences_per_block: int
    shared_bytes: int
    target: str = "cuda"
    kernels: list[KernelSpec] = field(default_factory=list)   # launch in this order
    static_shared_bytes: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------
def kernel_args(form: Any, options: Options | None = None, grid: Any = None
                ) -> list[dict[str, Any]]:
    """The manifest ``args`` of the kernel ABI, in parameter order (workspaces last)."""
    lanes = set(form.recurrence.lane_names)
    out: list[dict[str, Any]] = []
    for name in form.inputs:
        out.append({"name": name, "role": "input", "timed": True, "lane": name in lanes,
                    "dtype": "float32"})
    for name in form.params:
        out.append({"name": name, "role": "param", "timed": False, "lane": name in lanes,
                    "dtype": "float32"})
    for state in form.recurrence.states:
        out.append({"name": h0_name(state), "role": "h0", "timed": False,
                    "lane": bool(form.vector), "dtype": "float32"})
    for name in form.outputs:
        out.append({"name": name, "role": "output", "timed": True,
                    "lane": bool(form.output_is_lane(name)), "dtype": "float32"})
    for name in ("C", "N", "L"):
        out.append({"name": name, "role": "size", "timed": False, "lane": False,
                    "dtype": "int64"})
    if options is not None and options.strategy != "sequential":
        alg = Algebra(form.A)
        for name, per in ((AGGREGATES, alg.width), (CARRIES, alg.S)):
            out.append({"name": name, "role": "workspace", "timed": False, "lane": False,
                        "dtype": "float32", "per_chunk": per, "time_chunk": TIME_CHUNK})
        out.append({"name": TIME_CHUNK, "role": "size", "timed": False, "lane": False,
                    "dtype": "int64", "chunk_rule": chunk_rule(options, grid)})
    return out


def chunk_rule(options: Options, grid: Any = None) -> dict[str, Any]:
    """The manifest's rule for the per-call ``time_chunk`` (whole tiles; when chunking, never
    fewer than ``chunk_tiles`` tiles a chunk): the plan's ``scan.grid`` when given."""
    if grid is not None:
        return {"tile": grid.tile, "min_tiles": grid.min_tiles, "fill": grid.fill,
                "unchunked_from": grid.unchunked_from}
    return {"tile": options.tile, "min_tiles": options.chunk_tiles, "fill": CHUNK_FILL,
            "unchunked_from": UNCHUNKED_FROM}


#: workspace of the chunked Blelloch scan: per (sequence, chunk), the chunk's aggregate
#: (layout ``[sequence][entry][chunk]``) and the state before the chunk (``[sequence][i][chunk]``);
#: their names, the per-call chunk length TIME_CHUNK (a size, after the workspaces) and the
#: initial-state argument h0_name(state) are owned by explorer.frontend.names, which refuses them
#: as names of a recurrence


# --------------------------------------------------------------------------------------------
# structured control flow helpers
# --------------------------------------------------------------------------------------------
Body = Callable[[Value, list[Value]], Sequence[Value]]


def for_loop(lb: Value, ub: Value, step: Value, body: Body,
             iters: Sequence[Value] = ()) -> list[Value]:
    loop = scf.ForOp(lb, ub, step, list(iters))
    with InsertionPoint(loop.body):
        out = body(loop.induction_variable, list(loop.inner_iter_args))
        scf.yield_(list(out))
    return list(loop.results)


def if_then(cond: Value, then: Callable[[], None]) -> None:
    op = scf.IfOp(cond)
    with InsertionPoint(op.then_block):
        then()
        scf.yield_([])


def if_else(cond: Value, types: Sequence[Type], then: Callable[[], Sequence[Value]],
            other: Callable[[], Sequence[Value]]) -> list[Value]:
    op = scf.IfOp(cond, list(types), has_else=True)
    with InsertionPoint(op.then_block):
        scf.yield_(list(then()))
    with InsertionPoint(op.else_block):
        scf.yield_(list(other()))
    return list(op.results)


def flat_memref() -> MemRefType:
    return MemRefType.get([ShapedType.get_dynamic_size()], f32())


def min_i(a: Value, b: Value) -> Value:
    return arith.minui(a, b)


def pad(i: Value) -> Value:
    """Position ``i`` of a padded workgroup array: one spare slot after every 32 entries."""
    return add_i(i, arith.shrui(i, ci(5)))


def padded(n: int) -> int:
    return n + n // WARP


# --------------------------------------------------------------------------------------------
# threads: the same phase code on the GPU (one thread) and on the host (a loop over threads)
# --------------------------------------------------------------------------------------------
class Threads:
    """How the threads of a block are realised: ``gpu`` (thread id, barriers) or host loops."""

    def __init__(self, gpu_target: bool, block_size: int, tid: Value | None = None) -> None:
        self.gpu = gpu_target
        self.bs = block_size
        self.tid = tid

    def each(self, fn: Callable[[Value], None], count: int | None = None) -> None:
        """Run ``fn(tid)`` for the threads ``tid < count`` (all threads by default)."""
        n = self.bs if count is None else count
        if self.gpu:
            assert self.tid is not None
            tid = self.tid
            if n >= self.bs:
                fn(tid)
            else:
                if_then(lt_i(tid, ci(n)), lambda: fn(tid))
            return

        def body(t: Value, _: list[Value]) -> list[Value]:
            fn(t)
            return []
        for_loop(ci(0), ci(n), ci(1), body)

    def barrier(self) -> None:
        if self.gpu:
            gpu.barrier()

    def warp_sync(self) -> None:
        if self.gpu:
            nvvm.bar_warp_sync(arith.constant(IntegerType.get_signless(32), -1))


def _select(cond: Value, a: Element, b: Element, alg: Algebra) -> Element:
    return alg.pack([arith.select(cond, x, y) for x, y in zip(a.values(), b.values(),
                                                                  strict=True)])


# --------------------------------------------------------------------------------------------
# the generator: loads, the element of a position, outputs
# --------------------------------------------------------------------------------------------
@dataclass
class Seq:
    """Index values and hoisted parameters of one sequence (c, n)."""

    c: Value
    n: Value
    timed_base: dict[str, Value]
    params: dict[str, Value]
    state_base: Value          # offset of (c, n, t=0) in a lane-wide output / (c, 0) otherwise
    readout_base: Value        # offset of (c, t=0) in a readout


@dataclass
class Stream:
    """A row of a timed array read or written by position: ``array[row + t]``, or
    ``array[row + last - t]`` when ``last`` (L - 1) is given: a scan backwards in time."""

    array: Value
    row: Value
    last: Value | None = None
    loc: Any = None       # the location of the term that reads it, for its loads

    def load(self, t: Value) -> Value:
        with self.loc or nullcontext():
            return memref.load(self.array, [self.at(t)])

    def at(self, t: Value) -> Value:
        return add_i(self.row, t if self.last is None else arith.subi(self.last, t))


class Gen:
    """Emits the pieces shared by every strategy and target."""

    def __init__(self, form: Any, options: Options, arrays: dict[str, Value],
                 C: Value, N: Value, L: Value) -> None:
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
        # readouts computed with the state (no lane axis); vector ones get their own kernel
        self.scan_readouts = {} if form.vector else self.readouts
        used = set(self.coeff_names)
        if self.scan_readouts:
            used |= self.readout_names
        #: timed inputs a scan kernel reads, in a fixed order, and the parameters
        self.scan_inputs = [n for n in form.inputs if n in used]
        self.scan_params = {n for n in used if n not in self.timed}
        #: timed inputs the coefficients alone read (the reduce kernel)
        self.coeff_inputs = [n for n in form.inputs if n in self.coeff_names]
        #: outputs of a scan kernel: the states, then the readouts computed with them
        self.scan_outputs = [*self.states, *self.scan_readouts]

    # -- sequence setup ---------------------------------------------------------------------
    def seq(self, c: Value, n: Value, names: set[str]) -> Seq:
        lane_row = add_i(mul_i(c, self.N), n)
        timed_base: dict[str, Value] = {}
        params: dict[str, Value] = {}
        for name in sorted(names):
            if name in self.timed:
                timed_base[name] = mul_i(lane_row if name in self.lanes else c, self.L)
            elif name in self.arrays:
                at = lane_row if name in self.lanes else c
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
                return memref.load(self.arrays[name], [self.at(seq.timed_base[name], t)])
        return seq.params[name]

    def initial_state(self, seq: Seq) -> list[Value]:
        """The state vector before t = 0: h0 for ``h[t-1]``, zero for older lags."""
        at = add_i(mul_i(seq.c, self.N), seq.n) if self.form.vector else seq.c
        out = []
        for name, lag in self.form.components:
            if lag == 0:
                out.append(memref.load(self.arrays[h0_name(name)], [at]))
            else:
                out.append(cf(0.0))
        return out

    def _last(self) -> Value | None:
        return arith.subi(self.L, ci(1)) if self.reverse else None

    def in_streams(self, seq: Seq, names: Sequence[str]) -> list[Stream]:
        return [Stream(self.arrays[n], seq.timed_base[n], self._last(), self.locs.get(n))
                for n in names]

    def out_streams(self, seq: Seq) -> list[Stream]:
        last = self._last()
        return ([Stream(self.arrays[s], seq.state_base, last) for s in self.states]
                + [Stream(self.arrays[r], seq.readout_base, last) for r in self.scan_readouts])

    def leaf_from(self, seq: Seq, timed: Callable[[str], Value]) -> Element:
        """Element (A_t, b_t); ``timed(name)`` gives the value of a timed input at t."""
        def lookup(s: sympy.Symbol) -> Value:
            return timed(s.name) if s.name in self.timed else seq.params[s.name]
        return self.alg.leaf(self.form.A, self.form.b, ExprEmitter(lookup))

    def outputs_at(self, seq: Seq, h: Sequence[Value], timed: Callable[[str], Value]
                   ) -> list[Value]:
        """Values of :attr:`scan_outputs` at one position from the state there."""
        out = [h[self.state_out[s]] for s in self.states]
        for name, expr in self.scan_readouts.items():
            def lookup(sym: sympy.Symbol) -> Value:
                if sym in self.state_index:
                    return h[self.state_index[sym]]
                return timed(sym.name) if sym.name in self.timed else seq.params[sym.name]
            with self.statement_locs.get(name) or nullcontext():
                out.append(ExprEmitter(lookup)(expr))
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

        for name, expr in self.readouts.items():
            with self.statement_locs.get(name) or nullcontext():
                y = ExprEmitter(outer, lane_sum)(expr)
                memref.store(y, self.arrays[name], [self.at(mul_i(c, self.L), t)])


# --------------------------------------------------------------------------------------------
# sequential: warp tiles of 32 sequences x TT steps, staged through workgroup memory
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeqLayout:
    """Workgroup memory of the sequential kernel: per warp, ``buffers`` tiles of 32 x (TT+1)."""

    steps: int                    # TT: time steps per tile
    inputs: tuple[str, ...]       # staged timed inputs, buffer q = inputs[q]
    private: tuple[bool, ...]     # row = own sequence (else row = channel - first channel)
    out_buffer: tuple[int, ...]   # buffer that holds output o on its way out
    buffers: int
    warps: int

    @property
    def floats(self) -> int:
        return self.warps * self.buffers * WARP * (self.steps + 1)


def seq_layout(form: Any, options: Options) -> SeqLayout:
    alg_free = {s.name for s in (*form.A.free_symbols, *form.b.free_symbols)}
    readouts = {} if form.vector else dict(form.readouts)
    used = set(alg_free) | {s.name for e in readouts.values() for s in e.free_symbols}
    inputs = tuple(n for n in form.inputs if n in used)
    lanes = set(form.recurrence.lane_names)
    private = tuple((not form.vector) or n in lanes for n in inputs)
    own = [q for q, p in enumerate(private) if p]
    nout = len(form.recurrence.states) + len(readouts)
    # an output reuses the buffer of an input read only by its own thread (in place, after
    # the read of the same step); the others get buffers of their own
    out_buffer = tuple(own[o] if o < len(own) else len(inputs) + o - len(own)
                       for o in range(nout))
    buffers = len(inputs) + max(0, nout - len(own))
    warps = options.block_size // WARP
    for steps in (32, 16, 8):
        layout = SeqLayout(steps, inputs, private, out_buffer, buffers, warps)
        if layout.floats * 4 <= SHARED_LIMIT // 2:
            return layout
    layout = SeqLayout(8, inputs, private, out_buffer, buffers, warps)
    if layout.floats * 4 > SHARED_LIMIT:
        raise OptionError(f"the sequential kernel stages {buffers} arrays per warp: "
                          f"{layout.floats * 4} bytes of shared memory for block_size "
                          f"{options.block_size}, more than {SHARED_LIMIT}: lower block_size")
    return layout


def sequential_block(gen: Gen, th: Threads, lay: SeqLayout, bid: Value, stage: Value,
                     hs: Value | None) -> None:
    """One block of the sequential strategy (``hs``: per-thread states on the host)."""
    alg = gen.alg
    bs, tt = th.bs, lay.steps
    P = tt + 1
    CN = mul_i(gen.C, gen.N)
    S = alg.S
    nin = len(lay.inputs)
    block_s0 = mul_i(bid, ci(bs))

    def where(warp: Value, q: int, r: Value, col: Value) -> Value:
        return add_i(mul_i(add_i(mul_i(add_i(mul_i(warp, ci(lay.buffers)), ci(q)), ci(WARP)),
                                 r), ci(P)), col)

    def warp_of(tid: Value) -> tuple[Value, Value, Value, Value]:
        warp = arith.divui(tid, ci(WARP))
        lane = arith.remui(tid, ci(WARP))
        s0 = add_i(block_s0, mul_i(warp, ci(WARP)))
        return warp, lane, s0, arith.divui(s0, gen.N)

    def setup(tid: Value) -> tuple[Value, Seq]:
        s_raw = add_i(block_s0, tid)
        s = min_i(s_raw, arith.subi(CN, ci(1)))
        seq = gen.seq(arith.divui(s, gen.N), arith.remui(s, gen.N),
                      set(lay.inputs) | gen.scan_params)
        return s_raw, seq

    def cells(lane: Value, mb: Value) -> list[tuple[Value, Value]]:
        """(row, column) of the tile cells a thread moves in one batch: the warp moves 32
        consecutive cells (along time) per cell index m = mb .. mb + LOAD_BATCH - 1."""
        out = []
        for j in range(LOAD_BATCH):
            idx = add_i(lane, mul_i(add_i(mb, ci(j)), ci(WARP)))
            out.append((arith.divui(idx, ci(tt)), arith.remui(idx, ci(tt))))
        return out

    def batches(body: Callable[[Value], None]) -> None:
        """``body(mb)`` for the batches of a tile, as a loop kept rolled: unrolled, the row
        offsets of the whole tile would be hoisted out of the time loop into registers."""
        def step(mb: Value, _: list[Value]) -> list[Value]:
            body(mb)
            return []
        loop = scf.ForOp(ci(0), ci(tt), ci(LOAD_BATCH), [])
        loop.operation.attributes["loop_annotation"] = Attribute.parse(
            "#llvm.loop_annotation<unroll = <disable = true>>")
        with InsertionPoint(loop.body):
            step(loop.induction_variable, [])
            scf.yield_([])

    def load_tile(tid: Value, t0: Value) -> None:
        warp, lane, s0, c0 = warp_of(tid)
        last_t = arith.subi(gen.L, ci(1))

        def batch(mb: Value) -> None:
            vals: list[tuple[Value, Value]] = []
            for r, col in cells(lane, mb):
                t = min_i(add_i(t0, col), last_t)
                for q, name in enumerate(lay.inputs):
                    if lay.private[q]:
                        row = min_i(add_i(s0, r), arith.subi(CN, ci(1)))
                    else:
                        row = min_i(add_i(c0, r), arith.subi(gen.C, ci(1)))
                    with gen.loc(name):
                        v = memref.load(gen.arrays[name], [gen.at(mul_i(row, gen.L), t)])
                    vals.append((where(warp, q, r, col), v))
            # the batch's loads are all in flight before its first store
            for at, v in vals:
                memref.store(v, stage, [at])
        batches(batch)

    def store_tile(tid: Value, t0: Value) -> None:
        warp, lane, s0, _ = warp_of(tid)

        def batch(mb: Value) -> None:
            for r, col in cells(lane, mb):
                t = add_i(t0, col)
                srow = add_i(s0, r)
                ok = arith.andi(lt_i(srow, CN), lt_i(t, gen.L))

                def put(r: Value = r, col: Value = col, t: Value = t, srow: Value = srow
                        ) -> None:
                    for o, name in enumerate(gen.scan_outputs):
                        v = memref.load(stage, [where(warp, lay.out_buffer[o], r, col)])
                        memref.store(v, gen.arrays[name], [gen.at(mul_i(srow, gen.L), t)])
                if_then(ok, put)
        batches(batch)

    def walk(tid: Value, seq: Seq, t0: Value, h: list[Value], steps: int | Value
             ) -> list[Value]:
        """The thread's own row of the tile: ``steps`` steps from ``h``."""
        warp, lane, _, c0 = warp_of(tid)
        rows = [lane if lay.private[q] else arith.subi(seq.c, c0) for q in range(nin)]

        def step(k: Value, h: list[Value]) -> list[Value]:
            vals = {name: memref.load(stage, [where(warp, q, rows[q], k)])
                    for q, name in enumerate(lay.inputs)}
            hn = alg.apply(gen.leaf_from(seq, vals.__getitem__), h)
            outs = gen.outputs_at(seq, hn, vals.__getitem__)
            for o, v in enumerate(outs):
                memref.store(v, stage, [where(warp, lay.out_buffer[o], lane, k)])
            return hn
        if isinstance(steps, int):
            for k in range(steps):
                h = step(ci(k), h)
            return h
        return for_loop(ci(0), steps, ci(1), step, h)

    def tile(t0: Value, steps: int | Value, h: list[Value], seq_of: Any) -> list[Value]:
        th.each(lambda tid: load_tile(tid, t0))
        th.warp_sync()
        if th.gpu:
            s_raw, seq = seq_of
            h = if_else(lt_i(s_raw, CN), [f32()] * S, lambda: walk(th.tid, seq, t0, h, steps),
                        lambda: h)
        else:
            assert hs is not None

            def host_walk(tid: Value) -> None:
                s_raw, seq = setup(tid)

                def go() -> None:
                    hh = [memref.load(hs, [add_i(mul_i(tid, ci(S)), ci(i))]) for i in range(S)]
                    hh = walk(tid, seq, t0, hh, steps)
                    for i, v in enumerate(hh):
                        memref.store(v, hs, [add_i(mul_i(tid, ci(S)), ci(i))])
                if_then(lt_i(s_raw, CN), go)
            th.each(host_walk)
        th.warp_sync()
        th.each(lambda tid: store_tile(tid, t0))
        return h

    # initial states; full tiles (their steps unrolled), then the ragged tail
    seq_of: Any = None
    h: list[Value] = []
    if th.gpu:
        seq_of = setup(th.tid)
        h = gen.initial_state(seq_of[1])
    else:
        assert hs is not None

        def init(tid: Value) -> None:
            _, seq = setup(tid)
            for i, v in enumerate(gen.initial_state(seq)):
                memref.store(v, hs, [add_i(mul_i(tid, ci(S)), ci(i))])
        th.each(init)
    full = arith.divui(gen.L, ci(tt))

    def full_tile(tix: Value, h: list[Value]) -> list[Value]:
        return tile(mul_i(tix, ci(tt)), tt, h, seq_of)
    h = for_loop(ci(0), full, ci(1), full_tile, h)
    t_tail = mul_i(full, ci(tt))
    rest = arith.subi(gen.L, t_tail)

    def tail() -> None:
        tile(t_tail, rest, h, seq_of)
    if_then(lt_i(ci(0), rest), tail)


def ks_sweep(th: Threads, alg: Algebra, off: int, load: Callable[[Value], Element],
             store: Callable[[Value, Element], None]) -> None:
    """One Kogge-Stone level over the block's aggregates: every ``i >= off`` takes
    ``x[i] o x[i - off]`` of the previous level. On the GPU each thread reads both into
    registers, a barrier, then writes; on the host the threads run from the last down, so a
    position is read before the lower position it depends on is overwritten."""
    def combined(i: Value) -> Element:
        return alg.combine(load(pad(i)), load(pad(arith.subi(i, ci(off)))))
    if th.gpu:
        assert th.tid is not None
        tid = th.tid
        ok = arith.cmpi(arith.CmpIPredicate.uge, tid, ci(off))
        # thread tid < off reads its own slot (kept as it is): no out-of-range read
        safe = arith.select(ok, tid, ci(off))
        new = _select(ok, combined(safe), load(pad(tid)), alg)
        th.barrier()
        store(pad(tid), new)
        return

    def body(j: Value, _: list[Value]) -> list[Value]:
        i = arith.subi(ci(th.bs - 1), j)
        store(pad(i), combined(i))
        return []
    for_loop(ci(0), ci(th.bs - off), ci(1), body)


# --------------------------------------------------------------------------------------------
# tree strategies: one block scans positions [begin, end) of one row in tiles
# --------------------------------------------------------------------------------------------
def block_scan(gen: Gen, th: Threads, E: int, stage: Sequence[Value], aggbuf: Sequence[Value],
               ins: Sequence[Stream], outs: Sequence[Stream],
               element: Callable[[list[Value]], Element],
               outputs: Callable[[list[Value], list[Value]], list[Value]] | None,
               begin: Value, end: Value, init: list[Value], mode: str) -> list[Value]:
    """Scan ``[begin, end)`` in tiles of ``block_size * E`` positions.

    ``mode``: ``"reduce"`` returns the aggregate of the range (no output); ``"inclusive"``
    writes ``outputs(state after t, inputs at t)`` at every t, ``"exclusive"`` the same with
    the state before t. ``init`` is the state before ``begin`` (ignored by ``reduce``).
    """
    alg = gen.alg
    bs = th.bs
    T = bs * E
    sweeps = gen.sweeps
    kogge_stone = any(sw.phase == "scan" for sw in sweeps)
    nin = len(ins)
    last = arith.subi(end, ci(1))
    total_slot = ci(padded(bs))

    def load_tile(t0: Value, tid: Value) -> list[Value]:
        vals = []
        for k in range(E):
            t = min_i(add_i(t0, add_i(ci(k * bs), tid)), last)
            vals += [s.load(t) for s in ins]
        return vals

    def put_tile(tid: Value, vals: list[Value]) -> None:
        for k in range(E):
            i = pad(add_i(ci(k * bs), tid))
            for q in range(nin):
                memref.store(vals[k * nin + q], stage[q], [i])

    def agg_load(i: Value) -> Element:
        return alg.pack([memref.load(b, [i]) for b in aggbuf])

    def agg_store(i: Value, e: Element) -> None:
        for b, v in zip(aggbuf, e.values(), strict=True):
            memref.store(v, b, [i])

    def staged(p: Value) -> list[Value]:
        return [memref.load(stage[q], [pad(p)]) for q in range(nin)]

    def own(tid: Value, t0: Value) -> list[Element]:
        """The thread's E consecutive elements, the identity past the end."""
        out = []
        for j in range(E):
            p = add_i(mul_i(tid, ci(E)), ci(j))
            e = element(staged(p))
            out.append(_select(lt_i(add_i(t0, p), end), e, alg.identity(), alg))
        return out

    reduce = mode == "reduce"
    carry0 = alg.identity().values() if reduce else list(init)
    nc = len(carry0)
    start = list(carry0) + (load_tile(begin, th.tid) if th.gpu else [])   # type: ignore[arg-type]

    def one_tile(tix: Value, it: list[Value]) -> list[Value]:
        carry, pref = it[:nc], it[nc:]
        t0 = add_i(begin, mul_i(tix, ci(T)))
        # 1. the tile into workgroup memory (prefetched on the GPU), coalesced
        if th.gpu:
            put_tile(th.tid, pref)      # type: ignore[arg-type]
        else:
            th.each(lambda tid: put_tile(tid, load_tile(t0, tid)))
        th.barrier()
        # the next tile's loads go out now and land while this tile is scanned
        nxt = load_tile(add_i(t0, ci(T)), th.tid) if th.gpu else []   # type: ignore[arg-type]
        # 2. each thread composes its E consecutive elements
        kept: dict[str, list[Element]] = {}

        def compose(tid: Value) -> None:
            els = own(tid, t0)
            kept["els"] = els
            agg = els[0]
            for e in els[1:]:
                agg = alg.combine(e, agg)
            agg_store(pad(tid), agg)
        th.each(compose)
        th.barrier()
        # 3. the block tree over the bs aggregates, one sweep of the plan per level
        for sw in sweeps:
            if reduce and sw.phase in ("down",):
                continue      # the reduce kernel wants the total alone: the up-sweep gives it
            off = sw.stride
            if sw.phase in ("up", "up_root"):
                root = sw.phase == "up_root" and not reduce

                def up(j: Value, off: int = off, root: bool = root) -> None:
                    ai = add_i(mul_i(j, ci(2 * off)), ci(off - 1))
                    bi = add_i(ai, ci(off))
                    left, right = agg_load(pad(ai)), agg_load(pad(bi))
                    if root:   # the total set aside, the root becomes the identity
                        agg_store(total_slot, alg.combine(right, left))
                        agg_store(pad(ai), alg.identity())
                        agg_store(pad(bi), left)
                    else:
                        agg_store(pad(bi), alg.combine(right, left))
                th.each(up, sw.active)
            elif sw.phase == "down":
                def down(j: Value, off: int = off) -> None:
                    ai = add_i(mul_i(j, ci(2 * off)), ci(off - 1))
                    bi = add_i(ai, ci(off))
                    left, right = agg_load(pad(ai)), agg_load(pad(bi))
                    agg_store(pad(ai), right)
                    agg_store(pad(bi), alg.combine(left, right))
                th.each(down, sw.active)
            else:   # scan (Kogge-Stone): i >= off takes x[i] o x[i - off] of the last level
                ks_sweep(th, alg, off, agg_load, agg_store)
            th.barrier()
        if reduce:
            total = agg_load(pad(ci(bs - 1)))
            return alg.combine(total, alg.pack(carry)).values() + nxt
        total = agg_load(pad(ci(bs - 1)) if kogge_stone else total_slot)

        def prefix(tid: Value) -> Element:
            """The exclusive prefix of thread ``tid``'s aggregate."""
            if not kogge_stone:
                return agg_load(pad(tid))
            first = arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0))
            before = agg_load(pad(arith.subi(arith.maxui(tid, ci(1)), ci(1))))
            return _select(first, alg.identity(), before, alg)

        # 5. each thread applies its prefix to its own elements; states out via the stage
        def finish(tid: Value) -> None:
            assert outputs is not None
            h = alg.apply(prefix(tid), carry)
            els = kept["els"] if th.gpu else own(tid, t0)
            for j in range(E):
                p = add_i(mul_i(tid, ci(E)), ci(j))
                vals = staged(p)
                if mode == "exclusive":
                    o = outputs(h, vals)
                    h = alg.apply(els[j], h)
                else:
                    h = alg.apply(els[j], h)
                    o = outputs(h, vals)
                for q, v in enumerate(o):
                    memref.store(v, stage[q], [pad(p)])
        th.each(finish)
        th.barrier()

        def write(tid: Value) -> None:
            for k in range(E):
                i = add_i(ci(k * bs), tid)
                t = add_i(t0, i)

                def put(i: Value = i, t: Value = t) -> None:
                    for q, s in enumerate(outs):
                        memref.store(memref.load(stage[q], [pad(i)]), s.array, [s.at(t)])
                if_then(lt_i(t, end), put)
        th.each(write)
        return alg.apply(total, carry) + nxt

    ntiles = ceil_div(arith.subi(end, begin), ci(T))
    return for_loop(ci(0), ntiles, ci(1), one_tile, start)[:nc]


@dataclass(frozen=True)
class ScanShapes:
    """Workgroup arrays of the Blelloch kernels: (stage buffers, aggregate buffers) sizes."""

    stage: int          # floats per stage buffer (tile, padded)
    agg: int            # floats per aggregate buffer (block_size, padded, + the total slot)


def blelloch_shapes(options: Options) -> ScanShapes:
    return ScanShapes(padded(options.tile), padded(options.block_size) + 1)


def blelloch_block(gen: Gen, th: Threads, role: str, bid: Value, stage: Sequence[Value],
                   aggbuf: Sequence[Value]) -> None:
    """One block of the Blelloch kernels (role scan / reduce / carry)."""
    o = gen.options
    alg = gen.alg
    E = o.elements_per_thread
    assert gen.Tc is not None, "the Blelloch kernels take time_chunk"
    Tc = gen.Tc
    nch = ceil_div(gen.L, Tc)
    w, S = alg.width, alg.S
    aggs, carries = gen.arrays[AGGREGATES], gen.arrays[CARRIES]
    if role == "carry":
        s = bid
        seq = gen.seq(arith.divui(s, gen.N), arith.remui(s, gen.N), set())
        ins = [Stream(aggs, mul_i(add_i(mul_i(s, ci(w)), ci(e)), nch)) for e in range(w)]
        outs = [Stream(carries, mul_i(add_i(mul_i(s, ci(S)), ci(i)), nch)) for i in range(S)]
        block_scan(gen, th, E, stage, aggbuf, ins, outs, alg.pack, lambda h, v: list(h),
                   ci(0), nch, gen.initial_state(seq), "exclusive")
        return
    s = arith.divui(bid, nch)
    k = arith.remui(bid, nch)
    begin = mul_i(k, Tc)
    end = min_i(gen.L, add_i(begin, Tc))
    names = gen.scan_inputs if role == "scan" else gen.coeff_inputs
    seq = gen.seq(arith.divui(s, gen.N), arith.remui(s, gen.N), set(names) | gen.scan_params)
    at = {n: q for q, n in enumerate(names)}

    def element(vals: list[Value]) -> Element:
        return gen.leaf_from(seq, lambda name: vals[at[name]])
    if role == "reduce":
        agg = block_scan(gen, th, E, stage, aggbuf, gen.in_streams(seq, names), [], element,
                         None, begin, end, [], "reduce")

        def put() -> None:
            for e, v in enumerate(agg):
                memref.store(v, aggs, [add_i(mul_i(add_i(mul_i(s, ci(w)), ci(e)), nch), k)])
        if th.gpu:
            assert th.tid is not None
            if_then(arith.cmpi(arith.CmpIPredicate.eq, th.tid, ci(0)), put)
        else:
            put()
        return

    def from_h0() -> list[Value]:
        return gen.initial_state(seq)

    def from_carry() -> list[Value]:
        return [memref.load(carries, [add_i(mul_i(add_i(mul_i(s, ci(S)), ci(i)), nch), k)])
                for i in range(S)]
    init = if_else(arith.cmpi(arith.CmpIPredicate.eq, k, ci(0)), [f32()] * S, from_h0,
                   from_carry)

    def outputs(h: list[Value], vals: list[Value]) -> list[Value]:
        return gen.outputs_at(seq, h, lambda name: vals[at[name]])
    block_scan(gen, th, E, stage, aggbuf, gen.in_streams(seq, names), gen.out_streams(seq),
               element, outputs, begin, end, init, "inclusive")


def readout_block(gen: Gen, th: Threads, bid: Value) -> None:
    """A block of the readout kernel. Its grid is ``C * N * ceil(L / time_chunk)`` blocks:
    ``N * ceil(L / time_chunk)`` per channel, block ``k`` of channel ``c`` owning the k-th
    of as many equal time ranges (threads along time: coalesced)."""
    nch = ceil_div(gen.L, ci(READOUT_CHUNK_TILES * th.bs))
    per_channel = mul_i(gen.N, nch)
    c = arith.divui(bid, per_channel)
    k = arith.remui(bid, per_channel)
    chunk = ceil_div(gen.L, per_channel)
    t0 = mul_i(k, chunk)
    t1 = arith.minui(gen.L, add_i(t0, chunk))

    def thread(tid: Value) -> None:
        def step(t: Value, _: list[Value]) -> list[Value]:
            gen.lane_readout(c, t)
            return []
        for_loop(add_i(t0, tid), t1, ci(th.bs), step)
    th.each(thread)


# --------------------------------------------------------------------------------------------
# module builders
# --------------------------------------------------------------------------------------------
def _array_sizes(args: list[dict[str, Any]], C: Value, N: Value, L: Value,
                 Tc: Value | None) -> dict[str, Value]:
    sizes = {}
    CN = mul_i(C, N)
    for a in args:
        if a["role"] == "size":
            continue
        if a["role"] == "workspace":
            per_call = a["time_chunk"] == TIME_CHUNK
            assert Tc is not None or not per_call
            chunks = ceil_div(L, Tc if per_call and Tc is not None else ci(a["time_chunk"]))
            sizes[a["name"]] = mul_i(mul_i(CN, chunks), ci(a["per_chunk"]))
            continue
        rows = CN if a["lane"] else C
        sizes[a["name"]] = mul_i(rows, L) if a["timed"] else rows
    return sizes


def kernel_specs(form: Any, options: Options) -> list[KernelSpec]:
    """The kernels of a compile, in launch order, with their geometry."""
    bs = options.block_size
    block = (bs, 1, 1)
    alg = Algebra(form.A)
    out: list[KernelSpec] = []
    if options.strategy == "sequential":
        lay = seq_layout(form, options)
        shared = lay.floats * 4 if options.target == "cuda" else 0
        out.append(KernelSpec(f"{KERNEL_PREFIX}_sequential", "scan", block, bs, shared))
    else:
        shapes = blelloch_shapes(options)
        gen_counts = _stage_counts(form, options)
        for role, suffix in (("reduce", "_reduce"), ("carry", "_carry"), ("scan", "")):
            static = (gen_counts[role] * shapes.stage + alg.width * shapes.agg) * 4
            if options.target == "cuda" and static > STATIC_SHARED_LIMIT:
                raise OptionError(
                    f"a Blelloch tile of {options.tile} elements ({gen_counts[role]} staged "
                    f"arrays, elements of {alg.width} floats) needs {static} bytes of shared "
                    f"memory, more than {STATIC_SHARED_LIMIT}: lower block_size * "
                    "elements_per_thread")
            out.append(KernelSpec(
                f"{KERNEL_PREFIX}_{options.strategy}{suffix}", role, block, 1, 0, static,
                time_chunk=None if role == "carry" else TIME_CHUNK,
                launch_when_longer_than=None if role == "scan" else TIME_CHUNK))
    if form.vector and form.readouts:
        out.append(KernelSpec(f"{KERNEL_PREFIX}_readout", "readout", block, 1,
                              time_chunk=READOUT_CHUNK_TILES * bs))
    return out


def _stage_counts(form: Any, options: Options) -> dict[str, int]:
    alg = Algebra(form.A)
    coeff = {s.name for s in (*form.A.free_symbols, *form.b.free_symbols)}
    readouts = {} if form.vector else dict(form.readouts)
    state_syms = set(form.state_symbols)
    used = coeff | {s.name for e in readouts.values() for s in e.free_symbols
                    if s not in state_syms}
    scan_inputs = [n for n in form.inputs if n in used]
    nout = len(form.recurrence.states) + len(readouts)
    return {"scan": max(1, len(scan_inputs), nout),
            "reduce": max(1, len([n for n in form.inputs if n in coeff])),
            "carry": max(alg.width, alg.S)}


def options_for(options: Options, plan: Any) -> Options:
    """The options the emitters follow, with every decision of the plan taken from the plan."""
    from dataclasses import replace

    reverse = plan.grid.direction == "reverse"
    if plan.tree == "none":
        return replace(options, strategy="sequential", block_size=plan.threads, reverse=reverse)
    return replace(options, strategy=plan.tree, block_size=plan.threads,
                   elements_per_thread=plan.elements, chunk_tiles=plan.grid.min_tiles,
                   reverse=reverse)


def lower_plan(module_op: Any, form: Any, options: Options, plan: Any,
               locations: Any = None) -> BuiltModule:
    """Emit the kernels of ``plan`` (read from the ``scan`` ops) at the end of ``module_op``,
    in the current context: the ``gpu`` module and its launcher, or the host functions."""
    import time

    start = time.perf_counter()
    opts = options_for(options, plan)
    if plan.tree == "none" and plan.tile_steps != seq_layout(form, opts).steps:
        raise CompileError(f"the plan's warp tile of {plan.tile_steps} steps is not one this "
                           "lowering can stage in shared memory")
    args = kernel_args(form, opts, plan.grid)
    kernels = kernel_specs(form, opts)
    locs = locations or Locations()
    # every op defaults to the location of the (first) state's statement
    with locs.statements.get(form.recurrence.states[0]) or nullcontext():
        if opts.target == "cuda":
            _cuda_module(module_op, form, opts, args, kernels, plan.sweeps, locs)
        else:
            _cpu_module(module_op, form, opts, args, kernels, plan.sweeps, locs)
    main = next(k for k in kernels if k.role == "scan")
    return BuiltModule(text="", kernel_name=main.name, args=args, block=main.block,
                       sequences_per_block=main.sequences_per_block,
                       shared_bytes=main.shared_bytes, target=opts.target,
                       kernels=kernels, static_shared_bytes=main.static_shared_bytes,
                       seconds=time.perf_counter() - start)


def build_module(form: Any, options: Options, plan: Any = None) -> BuiltModule:
    """The kernels of ``form`` for ``options`` (and the plan ``scan-plan`` would choose) as a
    module of their own, as text: the lowering without the passes before it."""
    from explorer.passes.plan import choose_plan

    with Context(), Location.unknown():
        module = Module.create()
        built = lower_plan(module.operation, form, options,
                           plan if plan is not None else choose_plan(form, options))
        if not module.operation.verify():
            raise CompileError("the generated module does not verify", ir_before=str(module))
        built.text = str(module)
    return built


def _i64() -> IntegerType:
    return IntegerType.get_signless(64)


def _bind(form: Any, options: Options, args: list[dict[str, Any]], values: list[Value],
          as_flat: Callable[[Value, Value], Value], sweeps: tuple[Any, ...],
          locs: Locations) -> Gen:
    # sizes by role: an input may itself be called C (Mamba's readout matrix)
    size = {a["name"]: v for a, v in zip(args, values, strict=False) if a["role"] == "size"}
    by_name = {a["name"]: v for a, v in zip(args, values, strict=False) if a["role"] != "size"}
    C, N, L = (to_index(size[k]) for k in ("C", "N", "L"))
    Tc = to_index(size[TIME_CHUNK]) if TIME_CHUNK in size else None
    sizes = _array_sizes(args, C, N, L, Tc)
    arrays = {name: as_flat(by_name[name], n) for name, n in sizes.items()}
    gen = Gen(form, options, arrays, C, N, L)
    gen.Tc = Tc
    gen.sweeps = sweeps
    gen.reverse = options.reverse
    gen.locs = dict(locs.names)
    gen.statement_locs = dict(locs.statements)
    return gen


def _kernel_body(gen: Gen, spec: KernelSpec, th: Threads, bid: Value,
                 shared: Sequence[Value], hs: Value | None) -> None:
    if spec.role == "readout":
        readout_block(gen, th, bid)
    elif gen.options.strategy == "sequential":
        sequential_block(gen, th, seq_layout(gen.form, gen.options), bid, shared[0], hs)
    else:
        width = gen.alg.width
        stage, aggbuf = shared[:-width], shared[-width:]
        blelloch_block(gen, th, spec.role, bid, stage, aggbuf)


def _shared_arrays(form: Any, options: Options, spec: KernelSpec) -> list[int]:
    """Sizes (floats) of the workgroup arrays of ``spec``."""
    if spec.role == "readout":
        return []
    if options.strategy == "sequential":
        return [seq_layout(form, options).floats]
    shapes = blelloch_shapes(options)
    count = _stage_counts(form, options)[spec.role]
    return [shapes.stage] * count + [shapes.agg] * Algebra(form.A).width


def _cuda_module(module_op: Any, form: Any, options: Options, args: list[dict[str, Any]],
                 kernels: list[KernelSpec], sweeps: tuple[Any, ...], locs: Locations) -> None:
    module_op.attributes["gpu.container_module"] = UnitAttr.get()
    # bare-pointer ABI: a buffer arrives as a 0-d memref (one pointer) and is reshaped to the
    # flat memref<?xf32> of its size inside the kernel
    ptr = MemRefType.get([], f32())
    arg_types: list[Type] = [ptr if a["role"] != "size" else _i64() for a in args]
    ftype = FunctionType.get(arg_types, [])
    bs = options.block_size
    workgroup = Attribute.parse("#gpu.address_space<workgroup>")
    with InsertionPoint(module_op.regions[0].blocks[0]):
        gmod = gpu.GPUModuleOp(f"{KERNEL_PREFIX}_kernels")
        gmod.bodyRegion.blocks.append()
        with InsertionPoint(gmod.bodyRegion.blocks[0]):
            for spec in kernels:
                fn = gpu.GPUFuncOp(ftype, sym_name=spec.name, kernel=True,
                                   known_block_size=[bs, 1, 1])
                if spec.min_blocks_per_sm:
                    # ask ptxas for registers that leave room for this many blocks per SM
                    fn.attributes["nvvm.minctasm"] = IntegerAttr.get(
                        IntegerType.get_signless(32), spec.min_blocks_per_sm)
                static = [] if spec.shared_bytes else _shared_arrays(form, options, spec)
                wg_types: list[Type] = [MemRefType.get([n], f32(), memory_space=workgroup)
                                        for n in static]
                if wg_types:
                    fn.attributes["workgroup_attributions"] = IntegerAttr.get(
                        _i64(), len(wg_types))
                block = fn.body.blocks.append(*arg_types, *wg_types)
                with InsertionPoint(block):
                    values = list(block.arguments)

                    def as_flat(v: Value, size: Value) -> Value:
                        dyn = ShapedType.get_dynamic_size()
                        return memref.reinterpret_cast(flat_memref(), v, [], [size], [], [0],
                                                       [dyn], [1])
                    gen = _bind(form, options, args, values[:len(args)], as_flat, sweeps,
                                locs)
                    shared = values[len(args):]
                    if spec.shared_bytes:
                        raw = gpu.dynamic_shared_memory(MemRefType.get(
                            [ShapedType.get_dynamic_size()], IntegerType.get_signless(8),
                            memory_space=workgroup))
                        view = MemRefType.get([ShapedType.get_dynamic_size()], f32(),
                                              memory_space=workgroup)
                        shared = [memref.view(view, raw, ci(0), [ci(spec.shared_bytes // 4)])]
                    th = Threads(True, bs, gpu.thread_id(gpu.Dimension.x))
                    _kernel_body(gen, spec, th, gpu.block_id(gpu.Dimension.x), shared, None)
                    gpu.return_([])
        _cuda_host_launcher(args, arg_types, kernels)


def _size_value(v: int | str, sizes: dict[str, Value]) -> Value:
    return sizes[v] if isinstance(v, str) else ci(v)


def _sizes_of(args: list[dict[str, Any]], vals: Sequence[Value]) -> dict[str, Value]:
    """Index values of the size arguments (C, N, L and time_chunk when there)."""
    return {a["name"]: to_index(v) for a, v in zip(args, vals, strict=True)
            if a["role"] == "size"}


def _grid_value(spec: KernelSpec, sizes: dict[str, Value]) -> Value:
    blocks = ceil_div(mul_i(sizes["C"], sizes["N"]), ci(spec.sequences_per_block))
    if spec.time_chunk is not None:
        blocks = mul_i(blocks, ceil_div(sizes["L"], _size_value(spec.time_chunk, sizes)))
    return blocks


def _launch_if(spec: KernelSpec, sizes: dict[str, Value], launch: Callable[[], None]) -> None:
    if spec.launch_when_longer_than is None:
        launch()
    else:
        if_then(lt_i(_size_value(spec.launch_when_longer_than, sizes), sizes["L"]), launch)


def _cuda_host_launcher(args: list[dict[str, Any]], arg_types: list[Type],
                        kernels: list[KernelSpec]) -> None:
    """A host function that launches the kernels in order (shown in the IR; the runtime
    launches the PTX itself with the same geometry)."""
    fn = func.FuncOp(f"{KERNEL_PREFIX}_launch", FunctionType.get(arg_types, []))
    block = fn.add_entry_block()
    with InsertionPoint(block):
        vals = list(block.arguments)
        sizes = _sizes_of(args, vals)
        one = ci(1)
        for spec in kernels:
            def launch(spec: KernelSpec = spec) -> None:
                grid = _grid_value(spec, sizes)
                dyn = (arith.constant(IntegerType.get_signless(32), spec.shared_bytes)
                       if spec.shared_bytes else None)
                gpu.launch_func([f"{KERNEL_PREFIX}_kernels", spec.name], (grid, one, one),
                                (ci(spec.block[0]), one, one), kernel_operands=vals,
                                dynamic_shared_memory_size=dyn)
            _launch_if(spec, sizes, launch)
        func.return_([])


def _cpu_module(module_op: Any, form: Any, options: Options, args: list[dict[str, Any]],
                kernels: list[KernelSpec], sweeps: tuple[Any, ...], locs: Locations) -> None:
    """Host code: one ``<kernel>_grid(args..., grid)`` per kernel that runs its blocks one
    after the other and the threads of a block phase by phase, and the entry
    ``scanweaver_<strategy>(args...)`` that launches them in order like the GPU runtime."""
    arg_types: list[Type] = [flat_memref() if a["role"] != "size" else _i64() for a in args]
    bs = options.block_size
    with InsertionPoint(module_op.regions[0].blocks[0]):
        grid_fns = {}
        for spec in kernels:
            fn = func.FuncOp(spec.name + GRID_SUFFIX,
                             FunctionType.get([*arg_types, _i64()], []))
            fn.attributes["llvm.emit_c_interface"] = UnitAttr.get()
            grid_fns[spec.name] = fn
            block = fn.add_entry_block()
            with InsertionPoint(block):
                values = list(block.arguments)
                gen = _bind(form, options, args, values[:len(args)], lambda v, size: v,
                            sweeps, locs)
                shared = [memref.alloc(MemRefType.get([n], f32()), [], [])
                          for n in _shared_arrays(form, options, spec)]
                hs = None
                if options.strategy == "sequential" and spec.role == "scan":
                    hs = memref.alloc(MemRefType.get([bs * gen.alg.S], f32()), [], [])
                th = Threads(False, bs)

                def one_block(b: Value, _: list[Value], gen: Gen = gen, spec: KernelSpec = spec,
                              shared: list[Value] = shared, hs: Value | None = hs,
                              th: Threads = th) -> list[Value]:
                    _kernel_body(gen, spec, th, b, shared, hs)
                    return []
                for_loop(ci(0), to_index(values[-1]), ci(1), one_block)
                for buf in [*shared, *([hs] if hs is not None else [])]:
                    memref.dealloc(buf)
                func.return_([])
        entry = func.FuncOp(f"{KERNEL_PREFIX}_{options.strategy}",
                            FunctionType.get(arg_types, []))
        entry.attributes["llvm.emit_c_interface"] = UnitAttr.get()
        block = entry.add_entry_block()
        with InsertionPoint(block):
            vals = list(block.arguments)
            sizes = _sizes_of(args, vals)
            for spec in kernels:
                def launch(spec: KernelSpec = spec) -> None:
                    grid = arith.index_cast(_i64(), _grid_value(spec, sizes))
                    func.call([], spec.name + GRID_SUFFIX, [*vals, grid])
                _launch_if(spec, sizes, launch)
            func.return_([])
