"""Lowering of the ``sequential`` plan: one thread per sequence, warp tiles of 32 sequences x
``steps`` time steps staged through shared memory (``scan.warp_tile``), coalesced along time.

With a lane sum in the block (``scan.lane_sum {scheme = "lanes-in-block"}``) a block runs
``floor(B / N)`` whole channels, the N lanes of a channel in consecutive threads. Each thread
leaves its lane's terms of the sums over n in the tile, in place of inputs it has read; after a
barrier the block sums them, one (channel, step) cell a thread at a time (consecutive threads
on consecutive steps: conflict-free reads of the tile, the readout written coalesced along
time), and the states are written only when the plan stores them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import sympy
from mlir.dialects import arith, memref, scf
from mlir.ir import (
    Attribute,
    InsertionPoint,
    Value,
)

from explorer.codegen.emit import (
    ExprEmitter,
    add_i,
    ceil_div,
    cf,
    ci,
    f32,
    lt_i,
    mul_i,
)
from explorer.codegen.gen import Gen, Seq, scan_io
from explorer.codegen.hoist import split_channel
from explorer.codegen.options import SHARED_LIMIT, Options
from explorer.codegen.threads import WARP, Threads, for_loop, if_else, if_then, min_i
from explorer.errors import OptionError

#: rows of a sequential tile loaded before they are stored (loads in flight per thread)
LOAD_BATCH = 8
#: cells of a warp's channel rows a thread loads (and computes the channel values of) at once
CHANNEL_BATCH = 2
#: shared memory a block's tiles may take: the longest tile (32, 16 or 8 steps) that fits
TILE_SHARED = SHARED_LIMIT // 2
#: the same for a vector state, whose blocks stage more arrays (the lanes' own and the
#: channel rows): shorter tiles, more blocks an SM. Measured on an H100, Mamba's preset at
#: 8 x 1536 channels, N = 16, L = 2048 (five staged arrays): tiles of 32 steps 2.93 ms (two
#: blocks an SM), 16 steps 2.58 ms, 8 steps 2.47 ms
VECTOR_TILE_SHARED = SHARED_LIMIT // 8


@dataclass(frozen=True)
class SeqLayout:
    """Workgroup memory of the sequential kernel: per warp, ``buffers`` tiles of 32 x (TT+1)."""

    steps: int                    # TT: time steps per tile
    inputs: tuple[str, ...]       # staged timed inputs, buffer q = inputs[q]
    private: tuple[bool, ...]     # row = own sequence (else row = channel - first channel)
    #: buffer that holds output o on its way out: the states and readouts written per
    #: sequence (Gen.scan_outputs), then the lane terms of the sums over n
    out_buffer: tuple[int, ...]
    buffers: int
    warps: int
    #: channel values (:mod:`explorer.codegen.hoist`), computed where a warp stages its
    #: channels' rows and staged there like inputs (their names are in ``inputs``)
    values: tuple[tuple[str, Any], ...] = ()
    #: the inputs without the lane axis that the channel rows load (staged, or read by values)
    channel_raw: tuple[str, ...] = ()
    #: the element's coefficients (A row by row, then b) and the lane terms, rewritten with
    #: the channel values (empty: the form's own)
    element: tuple[Any, ...] = ()
    terms: tuple[Any, ...] = ()
    #: the lane readouts (name -> expression) with the channel values in them
    readouts: tuple[tuple[str, Any], ...] = ()

    @property
    def floats(self) -> int:
        return self.warps * self.buffers * WARP * (self.steps + 1)


def seq_layout(form: Any, options: Options, stored: Any = None, lane_sum: Any = None
               ) -> SeqLayout:
    """The tile layout for a plan storing ``stored`` with the lane sum ``lane_sum`` (see
    :func:`explorer.codegen.gen.scan_io`)."""
    io = scan_io(form, stored, lane_sum)
    lanes = set(form.recurrence.lane_names)
    element: tuple[Any, ...] = ()
    terms: tuple[Any, ...] = ()
    values: tuple[tuple[str, Any], ...] = ()
    readouts: tuple[tuple[str, Any], ...] = ()
    if form.vector:
        # what a channel's lanes share is computed once per (channel, step)
        split = split_channel(form, io.lane_terms, io.outer, io.readouts)
        element, terms, values = split.element, split.terms, split.values
        readouts = split.readouts
        used = set(split.lane_inputs) | set(split.channel_inputs)
        raw = split.channel_raw
    else:
        used = set(io.inputs)
        raw = ()
    # the inputs of each sequence, and those the lane-summed readouts read per channel; then
    # the channel values
    inputs = tuple(n for n in form.inputs if n in used) + tuple(n for n, _ in values)
    private = tuple((not form.vector) or n in lanes for n in inputs)
    own = [q for q, p in enumerate(private) if p]
    nout = len(io.outputs) + len(io.lane_terms)
    # an output reuses the buffer of an input read only by its own thread (in place, after
    # the read of the same step); the others get buffers of their own
    out_buffer = tuple(own[o] if o < len(own) else len(inputs) + o - len(own)
                       for o in range(nout))
    buffers = len(inputs) + max(0, nout - len(own))
    warps = int(options.block_size) // WARP
    room = VECTOR_TILE_SHARED if form.vector else TILE_SHARED
    for steps in (32, 16, 8):
        layout = SeqLayout(steps, inputs, private, out_buffer, buffers, warps, values, raw,
                           element, terms, readouts)
        if layout.floats * 4 <= room:
            return layout
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
    fused = bool(gen.io.lane_readouts)
    if fused:
        # floor(B / N) whole channels a block: the sequences of channel c are consecutive
        per_block = arith.divui(ci(bs), gen.N)
        span = mul_i(per_block, gen.N)
    else:
        span = ci(bs)
    block_s0 = mul_i(bid, span)
    # the block's sequences end here (the threads past it have none)
    block_end = min_i(add_i(block_s0, span), CN)

    def where(warp: Value, q: int, r: Value, col: Value) -> Value:
        return add_i(mul_i(add_i(mul_i(add_i(mul_i(warp, ci(lay.buffers)), ci(q)), ci(WARP)),
                                 r), ci(P)), col)

    def warp_of(tid: Value) -> tuple[Value, Value, Value, Value]:
        warp = arith.divui(tid, ci(WARP))
        lane = arith.remui(tid, ci(WARP))
        s0 = add_i(block_s0, mul_i(warp, ci(WARP)))
        return warp, lane, s0, arith.divui(s0, gen.N)

    values = dict(lay.values)
    # the element and the lane terms as the walk computes them: with the channel values
    if lay.element:
        A = sympy.Matrix(S, S, lay.element[:S * S])
        b = sympy.Matrix(lay.element[S * S:])
    else:
        A, b = gen.form.A, gen.form.b
    terms = lay.terms or gen.io.lane_terms
    # parameters of a sequence: those its element and terms read (the channel values' own are
    # read where they are computed)
    outs_exprs = dict(lay.readouts)
    read = {s.name for e in (*A, *b, *terms, *outs_exprs.values()) for s in e.free_symbols} \
        if lay.element else set(gen.scan_params)
    seq_names = ({n for n in lay.inputs if n not in values}
                 | {n for n in read if n in gen.scan_params or n in gen.io.params})

    def setup(tid: Value) -> tuple[Value, Seq]:
        s_raw = add_i(block_s0, tid)
        s = min_i(s_raw, arith.subi(block_end, ci(1)))
        seq = gen.seq(arith.divui(s, gen.N), arith.remui(s, gen.N), seq_names)
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
                s = min_i(add_i(s0, r), arith.subi(block_end, ci(1)))
                for q, name in enumerate(lay.inputs):
                    if not lay.private[q]:
                        continue
                    row = s
                    if name in gen.row_div:    # a row per block of channels
                        c = arith.divui(s, gen.N)
                        row = gen.lane_row(name, c, arith.subi(s, mul_i(c, gen.N)))
                    with gen.loc(name):
                        v = gen.load_timed(name, mul_i(row, gen.L), t)
                    vals.append((where(warp, q, r, col), v))
            # the batch's loads are all in flight before its first store
            for at, v in vals:
                memref.store(v, stage, [at])
        if any(lay.private):
            batches(batch)
        if not all(lay.private):
            load_channels(warp, lane, s0, c0, t0)

    def load_channels(warp: Value, lane: Value, s0: Value, c0: Value, t0: Value) -> None:
        """The rows of the warp's channels alone (N lanes a channel: about 32 / N rows):
        their inputs, and the channel values computed from them."""
        last_t = arith.subi(gen.L, ci(1))
        s_last = min_i(add_i(s0, ci(WARP - 1)), arith.subi(block_end, ci(1)))
        # a warp past the block's sequences has no channel
        rows = arith.select(lt_i(s0, block_end),
                            add_i(arith.subi(arith.divui(s_last, gen.N), c0), ci(1)), ci(0))
        staged = [(q, name) for q, name in enumerate(lay.inputs) if not lay.private[q]]
        params = {s.name for e in values.values() for s in e.free_symbols
                  if s.name not in gen.timed}

        def step(m: Value, _: list[Value]) -> list[Value]:
            out: list[tuple[Value, Value]] = []
            for j in range(CHANNEL_BATCH):
                idx = add_i(lane, mul_i(add_i(mul_i(m, ci(CHANNEL_BATCH)), ci(j)), ci(WARP)))
                # a cell past the warp's rows repeats its last row (the same values)
                r = min_i(arith.divui(idx, ci(tt)), arith.subi(rows, ci(1)))
                col = arith.remui(idx, ci(tt))
                t = min_i(add_i(t0, col), last_t)
                c = min_i(add_i(c0, r), arith.subi(gen.C, ci(1)))
                raw: dict[str, Value] = {}
                for name in lay.channel_raw:
                    with gen.loc(name):
                        raw[name] = gen.load_timed(name, mul_i(c, gen.L), t)
                par = gen.seq(c, ci(0), params).params if values else {}

                def lookup(sym: sympy.Symbol, raw: dict[str, Value] = raw,
                           par: dict[str, Value] = par) -> Value:
                    return raw[sym.name] if sym.name in raw else par[sym.name]
                emit = ExprEmitter(lookup)
                for q, name in staged:
                    with gen.statement_locs.get(gen.states[0]) or nullcontext():
                        v = emit(values[name]) if name in values else raw[name]
                    out.append((where(warp, q, r, col), v))
            for at, v in out:
                memref.store(v, stage, [at])
            return []
        for_loop(ci(0), ceil_div(mul_i(rows, ci(tt)), ci(WARP * CHANNEL_BATCH)), ci(1), step)

    added = set(gen.form.recurrence.lane_readouts) if gen.form.vector else set()

    def store_tile(tid: Value, t0: Value) -> None:
        warp, lane, s0, _ = warp_of(tid)

        def batch(mb: Value) -> None:
            for r, col in cells(lane, mb):
                t = add_i(t0, col)
                srow = add_i(s0, r)
                ok = arith.andi(lt_i(srow, block_end), lt_i(t, gen.L))

                def put(r: Value = r, col: Value = col, t: Value = t, srow: Value = srow
                        ) -> None:
                    for o, name in enumerate(gen.scan_outputs):
                        v = memref.load(stage, [where(warp, lay.out_buffer[o], r, col)])
                        if name in added:   # a lane readout: added into its row
                            gen.added_stream(name, arith.divui(srow, gen.N),
                                             arith.remui(srow, gen.N)).store(v, t)
                            continue
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
            t = add_i(t0, k)
            hn = alg.apply(gen.leaf_from(seq, vals.__getitem__, A, b, t), h)
            gen.last_state_at(seq, t, hn)
            outs = gen.outputs_at(seq, hn, vals.__getitem__, outs_exprs)
            if fused:
                outs += gen.lane_terms_at(seq, hn, vals.__getitem__, terms)
            for o, v in enumerate(outs):
                memref.store(v, stage, [where(warp, lay.out_buffer[o], lane, k)])
            return hn
        if isinstance(steps, int):
            for k in range(steps):
                h = step(ci(k), h)
            return h
        return for_loop(ci(0), steps, ci(1), step, h)

    def sum_lanes(tid: Value, t0: Value, steps: int | Value) -> None:
        """The lane-summed readouts of the block's channels over the tile: thread ``tid``
        takes the cells (channel g, step k) ``tid, tid + B, ...``, k the faster."""
        first_term = len(gen.scan_outputs)
        nterms = len(gen.io.lane_terms)
        at = {name: q for q, name in enumerate(lay.inputs)}
        block_c0 = mul_i(bid, per_block)

        def cell(idx: Value, _: list[Value]) -> list[Value]:
            g = arith.divui(idx, ci(tt))
            k = arith.remui(idx, ci(tt))
            c = add_i(block_c0, g)
            ok = lt_i(c, gen.C)
            if not isinstance(steps, int) or steps < tt:
                ok = arith.andi(ok, lt_i(k, steps if not isinstance(steps, int) else ci(steps)))
            lane0 = mul_i(g, gen.N)    # the block's thread of lane 0 of channel c

            def go() -> None:
                def lane(n: Value, acc: list[Value]) -> list[Value]:
                    j = add_i(lane0, n)
                    w, r = arith.divui(j, ci(WARP)), arith.remui(j, ci(WARP))
                    return [arith.addf(acc[i], memref.load(
                        stage, [where(w, lay.out_buffer[first_term + i], r, k)]))
                        for i in range(nterms)]
                sums = for_loop(ci(0), gen.N, ci(1), lane, [cf(0.0)] * nterms)
                # the channel's own inputs, staged by the warp that holds its lane 0
                w0 = arith.divui(lane0, ci(WARP))
                row = arith.subi(c, arith.divui(add_i(block_s0, mul_i(w0, ci(WARP))), gen.N))

                def timed(name: str) -> Value:
                    return memref.load(stage, [where(w0, at[name], row, k)])
                ys = gen.lane_readouts_at(gen.channel_params(c), sums, timed)
                t = add_i(t0, k)
                for name, y in zip(gen.io.lane_readouts, ys, strict=True):
                    memref.store(y, gen.arrays[name], [gen.at(mul_i(c, gen.L), t)])
            if_then(ok, go)
            return []
        for_loop(tid, mul_i(per_block, ci(tt)), ci(bs), cell)

    def tile(t0: Value, steps: int | Value, h: list[Value], seq_of: Any) -> list[Value]:
        th.each(lambda tid: load_tile(tid, t0))
        th.warp_sync()
        if th.gpu:
            s_raw, seq = seq_of
            h = if_else(lt_i(s_raw, block_end), [f32()] * S,
                        lambda: walk(th.tid, seq, t0, h, steps), lambda: h)
        else:
            assert hs is not None

            def host_walk(tid: Value) -> None:
                s_raw, seq = setup(tid)

                def go() -> None:
                    hh = [memref.load(hs, [add_i(mul_i(tid, ci(S)), ci(i))]) for i in range(S)]
                    hh = walk(tid, seq, t0, hh, steps)
                    for i, v in enumerate(hh):
                        memref.store(v, hs, [add_i(mul_i(tid, ci(S)), ci(i))])
                if_then(lt_i(s_raw, block_end), go)
            th.each(host_walk)
        if fused:
            # a channel's lanes may lie in several warps: the whole block's terms are in
            th.barrier()
            th.each(lambda tid: sum_lanes(tid, t0, steps))
        else:
            th.warp_sync()
        if gen.scan_outputs:
            th.each(lambda tid: store_tile(tid, t0))
        if fused:
            th.barrier()     # the tile is read by every warp before the next one is staged
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
