"""Stage 4, code generation: ``AffineForm`` + ``Options`` -> MLIR module (gpu or host dialects).

The module is built with the MLIR Python bindings in a fresh ``Context``; its text is the result
(``BuiltModule.text``), so nothing MLIR-owned outlives the call.

Data layout (see the kernel ABI): every array is a flat, contiguous float32 buffer; inputs are
``(C, L)`` / ``(C, N, L)``, parameters ``(C,)`` / ``(C, N)``, initial states ``(C,)`` / ``(C, N)``,
outputs ``(C, L)`` / ``(C, N, L)``; then ``C``, ``N``, ``L`` as int64. A sequence is one
``(channel c, lane n)`` pair, numbered ``s = c * N + n``.

Strategies (target ``cuda``; ``cpu`` runs the same plan with loops in place of threads):

* ``sequential``: one thread per sequence, a loop over time carrying the state in registers.
  Consecutive threads own consecutive sequences, so at each step a warp reads 32 addresses
  ``L`` elements apart (one cache line each, reused by the next steps from L1); parameters and
  the lane-independent inputs of a vector recurrence are shared by the ``N`` threads of a
  channel (broadcast loads).
* ``blelloch``: one block per sequence (``sequences_per_block = 1``). The block walks the
  sequence in tiles of ``block_size * elements_per_thread`` elements: coalesced loads of the
  coefficients, the element ``(A_t, b_t)`` written to shared memory (one array per stored
  entry), the Blelloch up-sweep and down-sweep (``gpu.barrier`` after every level) giving the
  exclusive prefix inside the tile, then each position's state ``P_t h_prev`` from the state
  ``h_prev`` carried from the previous tile. The tail tile is padded with identity elements.

Readouts ``y[t] = f(state, inputs)`` are computed with the state in the scan kernel when the
recurrence has no lane axis. With a lane axis (``sum(C[t, n] * h[t, n])``) a readout needs all
``N`` lanes of a channel, which live in different threads or blocks: a second kernel
(``<name>_readout``) reads the states back and reduces over the lanes. It uses the same launch
rule (grid = ceil(C * N / sequences_per_block), one block per (channel, time chunk)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
from mlir.dialects import arith, func, gpu, memref, scf
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
from explorer.codegen.options import STATIC_SHARED_LIMIT, Options
from explorer.errors import CompileError, OptionError

KERNEL_PREFIX = "scanweaver"


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of the module and how to launch it (block, grid rule, shared memory)."""

    name: str
    role: str                     # "scan" or "readout"
    block: tuple[int, int, int]
    sequences_per_block: int      # grid_x = ceil(C * N / sequences_per_block)
    shared_bytes: int = 0         # dynamic shared memory to pass at launch
    static_shared_bytes: int = 0  # shared memory declared in the kernel itself

    def manifest(self) -> dict[str, Any]:
        return {"name": self.name, "block": list(self.block),
                "sequences_per_block": self.sequences_per_block,
                "shared_bytes": self.shared_bytes}


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
def kernel_args(form: Any) -> list[dict[str, Any]]:
    """The manifest ``args`` of the kernel ABI, in parameter order."""
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
    return out


def h0_name(state: str) -> str:
    """Name of the initial-state argument of ``state`` (``h`` -> ``h0``)."""
    return f"{state}0"


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


# --------------------------------------------------------------------------------------------
# the generator: loads, the element of a position, stores
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


class Gen:
    """Emits the pieces shared by every strategy and target."""

    def __init__(self, form: Any, options: Options, arrays: dict[str, Value],
                 C: Value, N: Value, L: Value) -> None:
        self.form = form
        self.options = options
        self.alg = Algebra(form.A)
        self.arrays = arrays
        self.C, self.N, self.L = C, N, L
        self.lanes = set(form.recurrence.lane_names)
        self.timed = set(form.inputs)
        self.states = tuple(form.recurrence.states)
        self.state_index = {sym: i for i, sym in enumerate(form.state_symbols)}
        self.state_out = {s: form.components.index((s, 0)) for s in self.states}
        self.readouts = dict(form.readouts)
        self.coeff_names = {s.name for s in (*form.A.free_symbols, *form.b.free_symbols)}
        self.readout_names = {s.name for e in self.readouts.values() for s in e.free_symbols
                              if s not in self.state_index}

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
                params[name] = memref.load(self.arrays[name], [at])
            else:
                raise CompileError(f"the coefficients use {name!r}, which is neither an input "
                                   "nor a parameter")
        state_base = mul_i(lane_row if self.form.vector else c, self.L)
        return Seq(c, n, timed_base, params, state_base, mul_i(c, self.L))

    def value(self, seq: Seq, name: str, t: Value) -> Value:
        if name in seq.timed_base:
            return memref.load(self.arrays[name], [add_i(seq.timed_base[name], t)])
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

    def leaf(self, seq: Seq, t: Value) -> Element:
        emit = ExprEmitter(lambda s: self.value(seq, s.name, t))
        return self.alg.leaf(self.form.A, self.form.b, emit)

    def masked_leaf(self, seq: Seq, t: Value) -> Element:
        """The element at t, or the identity past the end of the sequence."""
        vals = if_else(lt_i(t, self.L), [f32()] * self.alg.width,
                       lambda: self.leaf(seq, t).values(),
                       lambda: self.alg.identity().values())
        return self.alg.pack(vals)

    # -- outputs -----------------------------------------------------------------------------
    def store_step(self, seq: Seq, t: Value, h: Sequence[Value]) -> None:
        """Write the states at t, and the readouts when they need no other lane."""
        for s in self.states:
            memref.store(h[self.state_out[s]], self.arrays[s], [add_i(seq.state_base, t)])
        if self.form.vector:
            return
        for name, expr in self.readouts.items():
            def lookup(sym: sympy.Symbol) -> Value:
                if sym in self.state_index:
                    return h[self.state_index[sym]]
                return self.value(seq, sym.name, t)
            y = ExprEmitter(lookup)(expr)
            memref.store(y, self.arrays[name], [add_i(seq.readout_base, t)])

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
                                           [add_i(mul_i(lane_row, self.L), t)])
                    return self.value(msq, sym.name, t)
                return [arith.addf(acc[0], ExprEmitter(inner)(arg))]
            return for_loop(ci(0), self.N, ci(1), body, [cf(0.0)])[0]

        for name, expr in self.readouts.items():
            y = ExprEmitter(outer, lane_sum)(expr)
            memref.store(y, self.arrays[name], [add_i(mul_i(c, self.L), t)])

    # -- the sequential scan of one sequence ----------------------------------------------------
    def sequential(self, s: Value) -> None:
        c = arith.divui(s, self.N)
        n = arith.remui(s, self.N)
        seq = self.seq(c, n, self.coeff_names | self.readout_names)

        def step(t: Value, h: list[Value]) -> list[Value]:
            hn = self.alg.apply(self.leaf(seq, t), h)
            self.store_step(seq, t, hn)
            return hn
        for_loop(ci(0), self.L, ci(1), step, self.initial_state(seq))


# --------------------------------------------------------------------------------------------
# Blelloch over tiles
# --------------------------------------------------------------------------------------------
class Tile:
    """Storage of one tile of elements: one buffer per stored entry of the element."""

    def __init__(self, gen: Gen, buffers: Sequence[Value]) -> None:
        self.gen = gen
        self.buffers = list(buffers)

    def load(self, i: Value) -> Element:
        return self.gen.alg.pack([memref.load(b, [i]) for b in self.buffers])

    def store(self, i: Value, e: Element) -> None:
        for b, v in zip(self.buffers, e.values(), strict=True):
            memref.store(v, b, [i])


def blelloch(gen: Gen, s: Value, tile: Tile, first: Value, stride: Value,
             barrier: Callable[[], None], positions: Callable[[Callable[[Value, int], None],
                                                                Value], None],
             keep: Callable[[Value, int, Element], None],
             kept: Callable[[Value, int], Element], single: Callable[[Callable[[], None]], None]
             ) -> None:
    """The tiled Blelloch scan of sequence ``s``.

    ``first``/``stride`` enumerate the pairs a thread combines at one tree level (thread id and
    block size on the GPU, 0 and 1 on the host); ``positions(fn, base)`` calls ``fn(i, k)`` for
    the tile positions this thread owns; ``keep``/``kept`` hold a position's own element from
    the load to the output phase; ``single(fn)`` runs ``fn`` on one thread.
    """
    alg = gen.alg
    T = gen.options.tile
    levels = T.bit_length() - 1
    c = arith.divui(s, gen.N)
    n = arith.remui(s, gen.N)
    seq = gen.seq(c, n, gen.coeff_names | gen.readout_names)
    tile_len = ci(T)

    def one_tile(tix: Value, hprev: list[Value]) -> list[Value]:
        base = mul_i(tix, tile_len)

        # 1. load: element (A_t, b_t) of every position, identity past the end
        def load(i: Value, k: int) -> None:
            e = gen.masked_leaf(seq, add_i(base, i))
            tile.store(i, e)
            keep(i, k, e)
        positions(load, base)
        barrier()

        # 2. up-sweep: x[bi] = x[bi] o x[ai] with ai = off*(2j+1)-1, bi = ai + off
        def up(d: Value, _: list[Value]) -> list[Value]:
            off = arith.shli(ci(1), d)
            pairs = arith.shrui(tile_len, add_i(d, ci(1)))

            def pair(j: Value, _: list[Value]) -> list[Value]:
                ai = arith.subi(mul_i(off, add_i(mul_i(j, ci(2)), ci(1))), ci(1))
                bi = add_i(ai, off)
                tile.store(bi, alg.combine(tile.load(bi), tile.load(ai)))
                return []
            for_loop(first, pairs, stride, pair)
            barrier()
            return []
        for_loop(ci(0), ci(levels), ci(1), up)

        # 3. the tile's total, then the root becomes the identity
        last = ci(T - 1)
        total = tile.load(last)
        barrier()
        single(lambda: tile.store(last, alg.identity()))
        barrier()

        # 4. down-sweep: (x[ai], x[bi]) = (x[bi], x[ai] o x[bi]), exclusive prefixes
        def down(dd: Value, _: list[Value]) -> list[Value]:
            d = arith.subi(ci(levels - 1), dd)
            off = arith.shli(ci(1), d)
            pairs = arith.shrui(tile_len, add_i(d, ci(1)))

            def pair(j: Value, _: list[Value]) -> list[Value]:
                ai = arith.subi(mul_i(off, add_i(mul_i(j, ci(2)), ci(1))), ci(1))
                bi = add_i(ai, off)
                left = tile.load(ai)
                right = tile.load(bi)
                tile.store(ai, right)
                tile.store(bi, alg.combine(left, right))
                return []
            for_loop(first, pairs, stride, pair)
            barrier()
            return []
        for_loop(ci(0), ci(levels), ci(1), down)

        # 5. states: h_t = (x_t o prefix_t) h_prev; write the valid positions
        def out(i: Value, k: int) -> None:
            t = add_i(base, i)
            prefix = alg.combine(kept(i, k), tile.load(i))
            h = alg.apply(prefix, hprev)
            if_then(lt_i(t, gen.L), lambda: gen.store_step(seq, t, h))
        positions(out, base)
        barrier()
        return alg.apply(total, hprev)

    ntiles = ceil_div(gen.L, tile_len)
    for_loop(ci(0), ntiles, ci(1), one_tile, gen.initial_state(seq))


# --------------------------------------------------------------------------------------------
# module builders
# --------------------------------------------------------------------------------------------
def _array_sizes(form: Any, args: list[dict[str, Any]], C: Value, N: Value, L: Value
                 ) -> dict[str, Value]:
    sizes = {}
    CN = mul_i(C, N)
    for a in args:
        if a["role"] == "size":
            continue
        rows = CN if a["lane"] else C
        sizes[a["name"]] = mul_i(rows, L) if a["timed"] else rows
    return sizes


def _check_shared(form: Any, options: Options, alg: Algebra) -> int:
    if options.strategy != "blelloch" or options.target != "cuda":
        return 0
    need = options.tile * alg.width * 4
    if need > STATIC_SHARED_LIMIT:
        raise OptionError(
            f"a Blelloch tile of {options.tile} elements of {alg.width} floats needs {need} "
            f"bytes of shared memory, more than {STATIC_SHARED_LIMIT}: lower block_size * "
            "elements_per_thread")
    return need


def build_module(form: Any, options: Options) -> BuiltModule:
    """Build the MLIR module of ``form`` for ``options`` and return it as text."""
    import time

    start = time.perf_counter()
    args = kernel_args(form)
    with Context(), Location.unknown():
        alg = Algebra(form.A)
        shared = _check_shared(form, options, alg)
        if options.target == "cuda":
            module, kernels = _cuda_module(form, options, args, alg)
        else:
            module, kernels = _cpu_module(form, options, args)
        if not module.operation.verify():
            raise CompileError("the generated module does not verify", ir_before=str(module))
        text = str(module)
    first = kernels[0]
    return BuiltModule(text=text, kernel_name=first.name, args=args, block=first.block,
                       sequences_per_block=first.sequences_per_block,
                       shared_bytes=first.shared_bytes, target=options.target,
                       kernels=kernels, static_shared_bytes=shared,
                       seconds=time.perf_counter() - start)


def _i64() -> IntegerType:
    return IntegerType.get_signless(64)


def _cuda_module(form: Any, options: Options, args: list[dict[str, Any]], alg: Algebra
                 ) -> tuple[Module, list[KernelSpec]]:
    module = Module.create()
    module.operation.attributes["gpu.container_module"] = UnitAttr.get()
    # bare-pointer ABI: a buffer arrives as a 0-d memref (one pointer) and is reshaped to the
    # flat memref<?xf32> of its size inside the kernel
    ptr = MemRefType.get([], f32())
    arg_types: list[Type] = [ptr if a["role"] != "size" else _i64() for a in args]
    ftype = FunctionType.get(arg_types, [])
    bs = options.block_size
    scan_name = f"{KERNEL_PREFIX}_{options.strategy}"
    kernels = [KernelSpec(scan_name, "scan", (bs, 1, 1),
                          1 if options.strategy == "blelloch" else bs, 0,
                          _check_shared(form, options, alg))]
    if form.vector and form.readouts:
        kernels.append(KernelSpec(f"{KERNEL_PREFIX}_readout", "readout", (bs, 1, 1), 1))

    workgroup = Attribute.parse("#gpu.address_space<workgroup>")
    with InsertionPoint(module.body):
        gmod = gpu.GPUModuleOp(f"{KERNEL_PREFIX}_kernels")
        gmod.bodyRegion.blocks.append()
        with InsertionPoint(gmod.bodyRegion.blocks[0]):
            for spec in kernels:
                fn = gpu.GPUFuncOp(ftype, sym_name=spec.name, kernel=True,
                                   known_block_size=[bs, 1, 1])
                wg_types: list[Type] = []
                if spec.role == "scan" and options.strategy == "blelloch":
                    wg_types = [MemRefType.get([options.tile], f32(), memory_space=workgroup)
                                ] * alg.width
                    fn.attributes["workgroup_attributions"] = IntegerAttr.get(
                        _i64(), len(wg_types))
                block = fn.body.blocks.append(*arg_types, *wg_types)
                with InsertionPoint(block):
                    _cuda_kernel_body(form, options, args, spec, list(block.arguments))
                    gpu.return_([])
        _cuda_host_launcher(options, args, arg_types, kernels)
    return module, kernels


def _bind(form: Any, options: Options, args: list[dict[str, Any]], values: list[Value],
          as_flat: Callable[[Value, Value], Value]) -> Gen:
    # sizes by role: an input may itself be called C (Mamba's readout matrix)
    size = {a["name"]: v for a, v in zip(args, values, strict=False) if a["role"] == "size"}
    by_name = {a["name"]: v for a, v in zip(args, values, strict=False) if a["role"] != "size"}
    C, N, L = (to_index(size[k]) for k in ("C", "N", "L"))
    sizes = _array_sizes(form, args, C, N, L)
    arrays = {name: as_flat(by_name[name], n) for name, n in sizes.items()}
    return Gen(form, options, arrays, C, N, L)


def _cuda_kernel_body(form: Any, options: Options, args: list[dict[str, Any]],
                      spec: KernelSpec, values: list[Value]) -> None:
    def as_flat(v: Value, size: Value) -> Value:
        dyn = ShapedType.get_dynamic_size()
        return memref.reinterpret_cast(flat_memref(), v, [], [size], [], [0], [dyn], [1])

    gen = _bind(form, options, args, values[:len(args)], as_flat)
    tid = gpu.thread_id(gpu.Dimension.x)
    bid = gpu.block_id(gpu.Dimension.x)
    bs = ci(options.block_size)
    if spec.role == "readout":
        # block b = c * N + k owns channel c, time chunk k of ceil(L / N) steps
        c = arith.divui(bid, gen.N)
        k = arith.remui(bid, gen.N)
        chunk = ceil_div(gen.L, gen.N)
        t0 = mul_i(k, chunk)
        t1 = arith.minui(gen.L, add_i(t0, chunk))

        def step(t: Value, _: list[Value]) -> list[Value]:
            gen.lane_readout(c, t)
            return []
        for_loop(add_i(t0, tid), t1, bs, step)
        return
    if options.strategy == "sequential":
        s = add_i(mul_i(bid, bs), tid)
        if_then(lt_i(s, mul_i(gen.C, gen.N)), lambda: gen.sequential(s))
        return

    tile = Tile(gen, values[len(args):])
    E = options.elements_per_thread
    regs: dict[int, Element] = {}

    def positions(fn: Callable[[Value, int], None], base: Value) -> None:
        for k in range(E):     # position k * block_size + tid: coalesced across the block
            fn(add_i(mul_i(ci(k), bs), tid), k)

    def keep(i: Value, k: int, e: Element) -> None:
        regs[k] = e

    def single(fn: Callable[[], None]) -> None:
        if_then(arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0)), fn)

    blelloch(gen, bid, tile, tid, bs, lambda: gpu.barrier(), positions, keep,
             lambda i, k: regs[k], single)


def _cuda_host_launcher(options: Options, args: list[dict[str, Any]], arg_types: list[Type],
                        kernels: list[KernelSpec]) -> None:
    """A host function that launches the kernels in order (shown in the IR; the runtime
    launches the PTX itself with the same geometry)."""
    fn = func.FuncOp(f"{KERNEL_PREFIX}_launch", FunctionType.get(arg_types, []))
    block = fn.add_entry_block()
    with InsertionPoint(block):
        vals = list(block.arguments)
        size = {a["name"]: v for a, v in zip(args, vals, strict=True) if a["role"] == "size"}
        C, N = to_index(size["C"]), to_index(size["N"])
        one = ci(1)
        for spec in kernels:
            grid = ceil_div(mul_i(C, N), ci(spec.sequences_per_block))
            gpu.launch_func([f"{KERNEL_PREFIX}_kernels", spec.name], (grid, one, one),
                            (ci(spec.block[0]), one, one), kernel_operands=vals)
        func.return_([])


def _cpu_module(form: Any, options: Options, args: list[dict[str, Any]]
                ) -> tuple[Module, list[KernelSpec]]:
    module = Module.create()
    arg_types: list[Type] = [flat_memref() if a["role"] != "size" else _i64() for a in args]
    name = f"{KERNEL_PREFIX}_{options.strategy}"
    with InsertionPoint(module.body):
        fn = func.FuncOp(name, FunctionType.get(arg_types, []))
        fn.attributes["llvm.emit_c_interface"] = UnitAttr.get()
        block = fn.add_entry_block()
        with InsertionPoint(block):
            gen = _bind(form, options, args, list(block.arguments), lambda v, size: v)
            CN = mul_i(gen.C, gen.N)
            if options.strategy == "sequential":
                def seq_body(s: Value, _: list[Value]) -> list[Value]:
                    gen.sequential(s)
                    return []
                for_loop(ci(0), CN, ci(1), seq_body)
            else:
                _cpu_blelloch(gen, options, CN)
            if form.vector and form.readouts:
                def chan(c: Value, _: list[Value]) -> list[Value]:
                    def step(t: Value, _: list[Value]) -> list[Value]:
                        gen.lane_readout(c, t)
                        return []
                    for_loop(ci(0), gen.L, ci(1), step)
                    return []
                for_loop(ci(0), gen.C, ci(1), chan)
            func.return_([])
    return module, [KernelSpec(name, "scan", (1, 1, 1), 1)]


def _cpu_blelloch(gen: Gen, options: Options, CN: Value) -> None:
    T = options.tile
    tmem = MemRefType.get([T], f32())
    width = gen.alg.width
    bufs = [memref.alloc(tmem, [], []) for _ in range(width)]
    kept_bufs = [memref.alloc(tmem, [], []) for _ in range(width)]
    tile = Tile(gen, bufs)
    kept = Tile(gen, kept_bufs)

    def positions(fn: Callable[[Value, int], None], base: Value) -> None:
        def body(i: Value, _: list[Value]) -> list[Value]:
            fn(i, 0)
            return []
        for_loop(ci(0), ci(T), ci(1), body)

    def seq_body(s: Value, _: list[Value]) -> list[Value]:
        blelloch(gen, s, tile, ci(0), ci(1), lambda: None, positions,
                 lambda i, k, e: kept.store(i, e), lambda i, k: kept.load(i),
                 lambda fn: fn())
        return []
    for_loop(ci(0), CN, ci(1), seq_body)
    for b in bufs + kept_bufs:
        memref.dealloc(b)
