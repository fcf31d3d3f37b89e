"""Lowering of the fused backward (:mod:`explorer.passes.fused_adjoint`): one kernel, one block a
channel, its threads ``T = threads * elements`` steps at a time from the last tile.

For each tile and lane (a loop over n) the block

1. loads its steps of the lane's inputs (each thread its own consecutive ``elements``, in
   16-byte vectors where it can: the ``direct`` layout), builds the forward's elements
   ``(a_t, b_t)`` and composes them, scans them over the warps (``gpu.shuffle up``, the warps'
   totals through shared memory) and recomputes ``h_{t-1}`` and ``h_t`` from the saved state
   before the tile (``scan.recompute``);
2. builds the adjoint's elements ``(a_t, a_t c_t)`` and scans them the other way: suffixes,
   ``gpu.shuffle down``, the later warps' totals composed first (``scan.adjoint {tree =
   "suffix"}``): the thread's ``mu`` after its last step, then ``lam_t = c_t + mu_{t+1}`` step
   by step back;
3. adds each step's gradient terms where the plan says (``scan.gradient {over}``): sums over the
   lanes in registers (stored per step after the lanes), per-lane terms through shared memory
   into coalesced ``red.global.add`` (rows shared by channels), sums over time per lane by warp
   shuffles and over time and lanes, each added by the block into the parameter's row its
   channel reads (``c % rows``: one row for the channels that share it, zeroed before).

Three barriers a lane: after the forward's warp totals, after the adjoint's, after the terms
put into shared memory. The adjoint's carry between tiles (``mu`` at the tile's first step) is
kept in the initial state's gradient, which it is after the first tile. GPU only.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import sympy
from mlir.dialects import arith, gpu, memref
from mlir.ir import (
    ArrayAttr,
    Attribute,
    DictAttr,
    FunctionType,
    InsertionPoint,
    IntegerAttr,
    MemRefType,
    ShapedType,
    Type,
    UnitAttr,
    Value,
)

from explorer.codegen.contract import KERNEL_PREFIX, BuiltModule, KernelSpec
from explorer.codegen.emit import (
    ExprEmitter,
    add_i,
    c32,
    ceil_div,
    cf,
    ci,
    constants_in,
    f32,
    lt_i,
    mul_i,
    to_index,
)
from explorer.codegen.gen import Stream
from explorer.codegen.threads import WARP, flat_memref, for_loop, if_else, if_then, pad, padded
from explorer.codegen.tiles import direct_write, held_value, rows_aligned, tile_loads
from explorer.frontend.names import h0_name
from explorer.passes.backward import VECTOR
from explorer.passes.fused_adjoint import LAM
from explorer.runtime.contract import INT_ROLES

Pair = tuple[Value, Value]


def backward_args(fa: Any, every: int) -> list[dict[str, Any]]:
    """The kernel's arguments, in the kernel ABI's conventions (``kernel_args``): the forward's
    inputs, the saved states (one step in ``every``, the tile: the state at each tile's last
    step, ``h[..., every-1::every]``), the cotangents, the parameters, the initial state, then the
    gradients (an input's shaped like it, a lane input's added into its rows, a parameter's
    per channel, the initial state's), the sizes, row divisors and moduli."""
    rec = fa.form.recurrence
    lanes = set(rec.lane_names)
    out: list[dict[str, Any]] = []

    def arg(name: str, role: str, timed: bool, lane: bool, **kw: Any) -> None:
        out.append({"name": name, "role": role, "timed": timed, "lane": lane,
                    "dtype": "float32", **kw})
    for x in rec.inputs:
        arg(x, "input", True, x in lanes)
    arg(fa.saved, "input", True, True, every=every)
    for o, name in fa.cotangents.items():
        arg(name, "input", True, o in rec.states)
    for p in rec.params:
        arg(p, "param", False, p in lanes)
    arg(h0_name(fa.state), "h0", False, True)
    for g in fa.gradients:
        if g.over == "rows":
            arg(g.target, "output", True, True, reset=True)
        elif g.over == "lanes":
            arg(g.target, "output", True, False)
        elif g.over == "first":
            arg(g.target, "output", False, True)
        else:   # a parameter's: added into the row of its channel (zeroed first)
            arg(g.target, "output", False, g.over == "time", reset=True)
    for name in ("C", "N", "L"):
        out.append({"name": name, "role": "size", "timed": False, "lane": False,
                    "dtype": "int64"})
    for a in list(out):
        if a["role"] in ("input", "output") and a["lane"] and a["timed"]:
            out.append({"name": a["name"], "role": "rowmap", "timed": False, "lane": False,
                        "dtype": "int64"})
    for p in rec.params:
        out.append({"name": p, "role": "rowmod", "timed": False, "lane": False,
                    "dtype": "int64"})
    return out


def kernel_spec(fa: Any, threads: int, elements: int) -> KernelSpec:
    return KernelSpec(f"{KERNEL_PREFIX}_backward", "scan", (threads, 1, 1), 1, 0,
                      4 * sum(_shared_sizes(fa, threads, elements)), channels="block")


def _shared_sizes(fa: Any, threads: int, elements: int) -> list[int]:
    """Floats of each workgroup array: the warps' forward and adjoint totals, the warps' sums
    (per time-summed gradient, and one for the last reduction), a stage per row gradient."""
    warps = threads // WARP
    red = warps * max(1, len(fa.by_over("time")))
    return [2 * warps, 2 * warps, red] + [padded(threads * elements)] * len(fa.by_over("rows"))


def build(module_op: Any, fa: Any, threads: int, elements: int, locs: Any = None
          ) -> BuiltModule:
    """Emit the backward kernel and its launcher at the end of ``module_op``."""
    from explorer.codegen.kernels import _array_sizes, _cuda_host_launcher, _i64

    args = backward_args(fa, threads * elements)
    spec = kernel_spec(fa, threads, elements)
    module_op.attributes["gpu.container_module"] = UnitAttr.get()
    ptr = MemRefType.get([], f32())
    arg_types: list[Type] = [ptr if a["role"] not in INT_ROLES else _i64() for a in args]
    workgroup = Attribute.parse("#gpu.address_space<workgroup>")
    sizes_f = _shared_sizes(fa, threads, elements)
    wg_types: list[Type] = [MemRefType.get([n], f32(), memory_space=workgroup) for n in sizes_f]
    loc = (locs.statements.get(fa.state) if locs is not None else None)
    with InsertionPoint(module_op.regions[0].blocks[0]), (loc or nullcontext()):
        gmod = gpu.GPUModuleOp(f"{KERNEL_PREFIX}_kernels")
        gmod.bodyRegion.blocks.append()
        with InsertionPoint(gmod.bodyRegion.blocks[0]):
            fn = gpu.GPUFuncOp(FunctionType.get(arg_types, []), sym_name=spec.name, kernel=True,
                               known_block_size=list(spec.block))
            fn.attributes["workgroup_attributions"] = IntegerAttr.get(_i64(), len(wg_types))
            fn.attributes["workgroup_attrib_attrs"] = ArrayAttr.get([
                DictAttr.get({"llvm.align": IntegerAttr.get(_i64(), 16)}) for _ in wg_types])
            block = fn.body.blocks.append(*arg_types, *wg_types)
            with InsertionPoint(block), constants_in(block):
                values = list(block.arguments)
                vals = values[:len(args)]
                size = {a["name"]: to_index(v) for a, v in zip(args, vals) if a["role"] == "size"}
                row_div, row_mod = ({a["name"]: to_index(v) for a, v in zip(args, vals)
                                     if a["role"] == r} for r in ("rowmap", "rowmod"))
                C, N, L = size["C"], size["N"], size["L"]
                n_of = _array_sizes(args, C, N, L, None, row_div, row_mod)
                dyn = ShapedType.get_dynamic_size()
                arrays = {a["name"]: memref.reinterpret_cast(
                    flat_memref(), v, [], [n_of[a["name"]]], [], [0], [dyn], [1])
                    for a, v in zip(args, vals) if a["role"] not in INT_ROLES}
                _Kernel(fa, threads, elements, arrays, N, L, row_div, row_mod,
                        values[len(args):]).emit()
                gpu.return_([])
        _cuda_host_launcher(args, arg_types, [spec])
    return BuiltModule(text="", kernel_name=spec.name, args=args, block=spec.block,
                       sequences_per_block=1, shared_bytes=0, target="cuda", kernels=[spec],
                       static_shared_bytes=spec.static_shared_bytes)


def _comb(later: Pair, earlier: Pair) -> Pair:
    """The affine map ``earlier`` then ``later``."""
    return (arith.mulf(later[0], earlier[0]),
            arith.addf(arith.mulf(later[0], earlier[1]), later[1]))


def _sel(cond: Value, x: Pair, y: Pair) -> Pair:
    return arith.select(cond, x[0], y[0]), arith.select(cond, x[1], y[1])


def _shfl(v: Value, by: int, mode: Any) -> Value:
    return gpu.shuffle(v, c32(by), c32(WARP), mode)[0]


class _Kernel:
    def __init__(self, fa: Any, threads: int, elements: int, arrays: dict[str, Value], N: Value,
                 L: Value, row_div: dict[str, Value], row_mod: dict[str, Value],
                 shared: Sequence[Value]) -> None:
        self.fa, self.bs, self.E = fa, threads, elements
        self.T = threads * elements
        self.warps = threads // WARP
        self.arrays, self.N, self.L = arrays, N, L
        self.row_div, self.row_mod = row_div, row_mod
        self.wf, self.wr, self.red = shared[:3]
        self.stages = list(shared[3:])
        self.rec = fa.form.recurrence
        self.lanes = set(self.rec.lane_names)
        self.row_base: dict[str, Value] = {}
        self.prow: dict[str, Value] = {}

    # -- indices -----------------------------------------------------------------------------
    def lane_row(self, name: str, c: Value, n: Value) -> Value:
        """The first index of lane n's row of a lane array of channel c (timed: times L):
        the channel's first row (its division by the row divisor made once a kernel) plus
        n rows."""
        steps = self.K if name == self.fa.saved else self.L   # (the saved states: a step a tile)
        base = self.row_base.get(name)
        if base is None:   # (every lane array's is made at the kernel's start)
            r = arith.divui(c, self.row_div[name]) if name in self.row_div else c
            base = mul_i(mul_i(r, self.N), steps)
        return add_i(base, mul_i(n, steps))

    def param(self, name: str, n: Value) -> Value:
        r = self.prow[name]
        i = add_i(mul_i(r, self.N), n) if name in self.lanes else r
        return memref.load(self.arrays[name], [i])

    # -- the kernel --------------------------------------------------------------------------
    def emit(self) -> None:
        fa, bs, E, T = self.fa, self.bs, self.E, self.T
        tid = gpu.thread_id(gpu.Dimension.x)
        c = gpu.block_id(gpu.Dimension.x)
        self.tid, self.c = tid, c
        # the row of each parameter the block's channel reads (its remainder by the row
        # modulus), made at the kernel's start
        self.prow = {p: arith.remui(c, self.row_mod[p]) if p in self.row_mod else c
                     for p in self.rec.params}
        self.lane_id = arith.remui(tid, ci(WARP))
        self.warp = arith.divui(tid, ci(WARP))
        nch = ceil_div(self.L, ci(T))
        self.K = arith.divui(self.L, ci(T))   # the saved states' steps: a tile's last each
        for a_ in backward_args(fa, T):
            if a_["lane"] and a_["timed"] and a_["role"] in ("input", "output"):
                self.row_base[a_["name"]] = self.lane_row(a_["name"], c, ci(0))
        # every lane row of the lane inputs aligned for the 16-byte loads: checked once (the
        # rows are L apart and the tiles start at multiples of T); a tile that is not whole
        # takes the element-by-element loads anyway
        lane_arrays = [self.arrays[x] for x in self.rec.inputs if x in self.lanes]
        lane_arrays += [self.arrays[name] for o, name in fa.cotangents.items()
                        if o in self.rec.states]
        self.lane_aligned = rows_aligned(lane_arrays, self.L, ci(0), VECTOR) \
            if lane_arrays else None
        chan_in = [x for x in self.rec.inputs if x not in self.lanes]
        chan_in += [name for o, name in fa.cotangents.items() if o not in self.rec.states]
        alls = fa.by_over("all")

        def chunk(kk: Value, accs: list[Value]) -> list[Value]:
            k = arith.subi(arith.subi(nch, ci(1)), kk)
            t0 = mul_i(k, ci(T))
            last = arith.subi(self.L, ci(1))
            streams = [Stream(self.arrays[x], mul_i(c, self.L)) for x in chan_in]
            loaded = tile_loads(streams, tid, t0, last, E, bs, VECTOR, direct=True)
            chan = [{x: held_value(loaded, j, q, len(chan_in), VECTOR)
                     for q, x in enumerate(chan_in)} for j in range(E)]
            pos = [add_i(t0, add_i(mul_i(tid, ci(E)), ci(j))) for j in range(E)]
            valid = [lt_i(p, self.L) for p in pos]
            nsum = len(fa.by_over("lanes")) + len(fa.sums)
            start = [cf(0.0)] * (E * nsum) + list(accs)

            def lane(n: Value, it: list[Value]) -> list[Value]:
                return self.lane(k, nch, t0, n, chan, valid, it, nsum)
            out = for_loop(ci(0), self.N, ci(1), lane, start)
            sums, accs = out[:E * nsum], out[E * nsum:]
            accs = self.after_lanes(c, t0, chan, valid, sums, nsum, accs)
            return accs
        accs = for_loop(ci(0), nch, ci(1), chunk, [cf(0.0)] * len(alls))
        # the channel's parameters: the block's sum, added by thread 0 into the parameter's
        # row of the channel (the channels that share it add into one)
        for q, g in enumerate(alls):
            total = self.block_sum(accs[q], 0)
            row = self.prow[g.of]

            def put(total: Value = total, dst: Value = self.arrays[g.target],
                    at: Value = row) -> None:
                memref.atomic_rmw(arith.AtomicRMWKind.addf, total, dst, [at])
            if_then(arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0)), put)

    def emitter(self, values: dict[str, Value], sums: dict[sympy.Expr, Value] | None = None
                ) -> ExprEmitter:
        def lookup(sym: sympy.Symbol) -> Value:
            return values[sym.name]
        return ExprEmitter(lookup, (lambda arg: sums[arg]) if sums is not None else None)

    def lane(self, k: Value, nch: Value, t0: Value, n: Value, chan: list[dict[str, Value]],
             valid: list[Value], it: list[Value], nsum: int) -> list[Value]:
        fa, E, c, tid = self.fa, self.E, self.c, self.tid
        sums, accs = list(it[:E * nsum]), list(it[E * nsum:])
        lane_in = [x for x in self.rec.inputs if x in self.lanes]
        lane_in += [name for o, name in fa.cotangents.items() if o in self.rec.states]
        streams = [Stream(self.arrays[x], self.lane_row(x, c, n)) for x in lane_in]
        last = arith.subi(self.L, ci(1))
        loaded = tile_loads(streams, tid, t0, last, E, self.bs, VECTOR, direct=True,
                            aligned=self.lane_aligned)
        params = {p: self.param(p, n) for p in self.rec.params}
        env = [dict(chan[j], **params, **{x: held_value(loaded, j, q, len(lane_in), VECTOR)
                                          for q, x in enumerate(lane_in)}) for j in range(E)]
        em = [self.emitter(env[j]) for j in range(E)]
        one, zero = cf(1.0), cf(0.0)
        # past the end (the last tile) the loads repeat the last step: the forward's states
        # there follow the valid ones and are never read, and the adjoint's elements there
        # have c = 0, so mu stays the zero it starts from in the last tile: no masks on a, b
        a = [em[j](fa.a) for j in range(E)]
        b = [em[j](fa.b) for j in range(E)]
        # 1. the forward: the thread's aggregate, its warp's prefix, the warps' before it
        agg: Pair = (one, zero)
        for j in range(E):
            agg = _comb((a[j], b[j]), agg)
        inc = agg
        for s in (1, 2, 4, 8, 16):
            o = (_shfl(inc[0], s, gpu.ShuffleMode.UP), _shfl(inc[1], s, gpu.ShuffleMode.UP))
            inc = _sel(arith.cmpi(arith.CmpIPredicate.uge, self.lane_id, ci(s)),
                       _comb(inc, o), inc)
        self.warp_total(self.wf, inc, WARP - 1)
        ex = (_shfl(inc[0], 1, gpu.ShuffleMode.UP), _shfl(inc[1], 1, gpu.ShuffleMode.UP))
        ex = _sel(arith.cmpi(arith.CmpIPredicate.eq, self.lane_id, ci(0)), (one, zero), ex)
        gpu.barrier()
        before: Pair = (one, zero)
        for w in range(self.warps - 1):
            tot = (memref.load(self.wf, [ci(2 * w)]), memref.load(self.wf, [ci(2 * w + 1)]))
            before = _sel(arith.cmpi(arith.CmpIPredicate.ugt, self.warp, ci(w)),
                          _comb(tot, before), before)
        pre = _comb(ex, before)
        first = arith.cmpi(arith.CmpIPredicate.eq, k, ci(0))
        saved_at = arith.subi(arith.maxui(k, ci(1)), ci(1))   # the tile before's last step
        h_saved = memref.load(self.arrays[fa.saved], [add_i(self.lane_row(fa.saved, c, n),
                                                            saved_at)])
        h0 = memref.load(self.arrays[h0_name(fa.state)], [add_i(mul_i(c, self.N), n)])
        h = arith.addf(arith.mulf(pre[0], arith.select(first, h0, h_saved)), pre[1])
        lanes_g, rows_g, time_g, all_g = (fa.by_over(o) for o in ("lanes", "rows", "time", "all"))
        time_acc = [zero] * len(time_g)
        base = mul_i(tid, ci(E))

        def terms(j: int, with_lam: bool) -> None:
            """Step j's gradient terms that read lam (or those that do not), added where the
            plan says: a lane gradient's into the stage at once (its registers freed)."""
            e = em[j]

            def mine(x: Any) -> bool:
                return x != 0 and bool(x.has(LAM)) == with_lam
            for q, g in enumerate(lanes_g):
                if mine(g.lane):
                    i = j * nsum + q
                    sums[i] = arith.addf(sums[i], e(g.lane))
            if not with_lam:
                for q, arg in enumerate(fa.sums):
                    i = j * nsum + len(lanes_g) + q
                    sums[i] = arith.addf(sums[i], e(arg))
            for q, g in enumerate(rows_g):
                if mine(g.lane) or (g.lane == 0 and not with_lam):
                    v = e(g.lane) if g.lane != 0 else zero
                    memref.store(v, self.stages[q], [pad(add_i(base, ci(j)))])
            for q, g in enumerate(time_g):
                if mine(g.lane):
                    time_acc[q] = arith.addf(time_acc[q], arith.select(valid[j], e(g.lane),
                                                                       zero))
            for q, g in enumerate(all_g):
                if mine(g.lane):
                    accs[q] = arith.addf(accs[q], arith.select(valid[j], e(g.lane), zero))
        for j in range(E):
            env[j][str(fa.h_prev)] = h
            h = arith.addf(arith.mulf(a[j], h), b[j])
            env[j][str(fa.h)] = h
            terms(j, False)
        # 2. the adjoint: mu = a (c + mu'), scanned from the end
        cs = [arith.select(valid[j], em[j](fa.inject), zero) for j in range(E)]
        ragg: Pair = (one, zero)
        for j in reversed(range(E)):
            ragg = _comb((a[j], arith.mulf(a[j], cs[j])), ragg)
        rinc = ragg
        for s in (1, 2, 4, 8, 16):
            o = (_shfl(rinc[0], s, gpu.ShuffleMode.DOWN),
                 _shfl(rinc[1], s, gpu.ShuffleMode.DOWN))
            rinc = _sel(lt_i(add_i(self.lane_id, ci(s)), ci(WARP)), _comb(rinc, o), rinc)
        self.warp_total(self.wr, rinc, 0)
        rex = (_shfl(rinc[0], 1, gpu.ShuffleMode.DOWN), _shfl(rinc[1], 1, gpu.ShuffleMode.DOWN))
        rex = _sel(arith.cmpi(arith.CmpIPredicate.eq, self.lane_id, ci(WARP - 1)), (one, zero),
                   rex)
        gpu.barrier()
        after: Pair = (one, zero)
        for w in reversed(range(1, self.warps)):
            tot = (memref.load(self.wr, [ci(2 * w)]), memref.load(self.wr, [ci(2 * w + 1)]))
            after = _sel(arith.cmpi(arith.CmpIPredicate.ult, self.warp, ci(w)),
                         _comb(tot, after), after)
        rpre = _comb(rex, after)
        carry_at = add_i(mul_i(c, self.N), n)
        gh0 = self.arrays[fa.by_over("first")[0].target]
        lastk = arith.cmpi(arith.CmpIPredicate.eq, k, arith.subi(nch, ci(1)))
        mu_in = arith.select(lastk, zero, memref.load(gh0, [carry_at]))
        mu = arith.addf(arith.mulf(rpre[0], mu_in), rpre[1])
        # 3. the terms, step by step back (those without lam were added in the forward walk)
        for j in reversed(range(E)):
            lam = arith.addf(cs[j], mu)
            mu = arith.mulf(a[j], lam)
            env[j]["lam[t]"] = lam
            terms(j, True)
        # the lanes' sums over time: each warp's, then thread 0 adds the warps'
        for q, v in enumerate(time_acc):
            self.warp_total_scalar(self.red, self.warp_reduce(v), q * self.warps)
        gpu.barrier()
        rows_at = [(q, self.arrays[g.target], self.lane_row(g.target, c, n))
                   for q, g in enumerate(rows_g)]

        def adds(guarded: bool) -> list[Value]:
            """The stage's values added into the rows, a warp's adds on consecutive words;
            ``guarded``: only the steps before L (the last tile, where it ends early)."""
            for q, out, row in rows_at:
                for i in range(E):
                    p = add_i(ci(i * self.bs), tid)
                    t = add_i(t0, p)

                    def add(p: Value = p, t: Value = t, q: int = q, out: Value = out,
                            row: Value = row) -> None:
                        memref.atomic_rmw(arith.AtomicRMWKind.addf,
                                          memref.load(self.stages[q], [pad(p)]), out,
                                          [add_i(row, t)])
                    if guarded:
                        if_then(lt_i(t, self.L), add)
                    else:
                        add()
            return []
        if rows_at:
            whole = arith.cmpi(arith.CmpIPredicate.ule, add_i(t0, ci(self.T)), self.L)
            if_else(whole, [], lambda: adds(False), lambda: adds(True))
        is0 = arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0))

        def lead() -> None:
            memref.store(mu, gh0, [carry_at])
            for q, g in enumerate(time_g):
                total = memref.load(self.red, [ci(q * self.warps)])
                for w in range(1, self.warps):
                    total = arith.addf(total, memref.load(self.red, [ci(q * self.warps + w)]))
                # added into the lane of the parameter's row (shared by channels: one sum)
                at = add_i(mul_i(self.prow[g.of], self.N), n)
                memref.atomic_rmw(arith.AtomicRMWKind.addf, total, self.arrays[g.target], [at])
        if_then(is0, lead)
        return sums + accs

    def after_lanes(self, c: Value, t0: Value, chan: list[dict[str, Value]], valid: list[Value],
                    sums: list[Value], nsum: int, accs: list[Value]) -> list[Value]:
        """The gradients of the channel's inputs at the thread's steps (the lanes' sums and
        the readouts' terms), stored; the channel parameters' readout terms, added up."""
        fa, E = self.fa, self.E
        lanes_g, all_g = fa.by_over("lanes"), fa.by_over("all")
        vals: list[list[Value]] = []
        accs = list(accs)
        params = {p: self.param(p, ci(0)) for p in self.rec.params if p not in self.lanes}
        for j in range(E):
            held = {arg: sums[j * nsum + len(lanes_g) + q] for q, arg in enumerate(fa.sums)}
            e = self.emitter(dict(chan[j], **params), held)
            row = []
            for q, g in enumerate(lanes_g):
                v = sums[j * nsum + q]
                if g.outer != 0:
                    v = arith.addf(v, e(g.outer))
                row.append(v)
            vals.append(row)
            for q, g in enumerate(all_g):
                if g.outer != 0:
                    accs[q] = arith.addf(accs[q], arith.select(valid[j], e(g.outer), cf(0.0)))
        outs = [Stream(self.arrays[g.target], mul_i(c, self.L)) for g in lanes_g]
        if outs:
            direct_write(outs, vals, t0, self.tid, E, VECTOR, self.L)
        return accs

    # -- reductions --------------------------------------------------------------------------
    def warp_total(self, buf: Value, x: Pair, lane: int) -> None:
        w2 = mul_i(self.warp, ci(2))

        def put() -> None:
            memref.store(x[0], buf, [w2])
            memref.store(x[1], buf, [add_i(w2, ci(1))])
        if_then(arith.cmpi(arith.CmpIPredicate.eq, self.lane_id, ci(lane)), put)

    def warp_total_scalar(self, buf: Value, v: Value, at: int) -> None:
        if_then(arith.cmpi(arith.CmpIPredicate.eq, self.lane_id, ci(0)),
                lambda: memref.store(v, buf, [add_i(self.warp, ci(at))]))

    def warp_reduce(self, v: Value) -> Value:
        for s in (16, 8, 4, 2, 1):
            v = arith.addf(v, _shfl(v, s, gpu.ShuffleMode.XOR))
        return v

    def block_sum(self, v: Value, at: int) -> Value:
        """The block's sum of ``v`` (every thread gets it), through ``red``."""
        v = self.warp_reduce(v)
        gpu.barrier()
        self.warp_total_scalar(self.red, v, at)
        gpu.barrier()
        total = memref.load(self.red, [ci(at)])
        for w in range(1, self.warps):
            total = arith.addf(total, memref.load(self.red, [ci(at + w)]))
        return total
