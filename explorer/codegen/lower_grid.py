"""Lowering of the grid level of a tree plan (``scan.grid {scheme = "chunked"}``): the blocks of
the reduce, carry and scan kernels over the chunks of each sequence; with a lane sum in the scan
(``scan.lane_sum {scheme = "lane-loop"}``) the scan kernel's blocks over the chunks of each
channel, looping over its lanes; and the readout kernel that sums a vector state's lanes from
the states in memory (``scheme = "readout-kernel"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

import sympy
from mlir.dialects import arith, memref
from mlir.ir import (
    Value,
)

from explorer.codegen.contract import READOUT_CHUNK_TILES
from explorer.codegen.emit import (
    Element,
    ExprEmitter,
    add_i,
    ceil_div,
    cf,
    ci,
    f32,
    lt_i,
    mul_i,
)
from explorer.codegen.gen import Gen, Seq, Stream
from explorer.codegen.hoist import ChannelSplit
from explorer.codegen.lower_block import block_scan, direct_tiles
from explorer.codegen.options import Options
from explorer.codegen.threads import (
    WARP,
    Threads,
    for_loop,
    if_else,
    if_then,
    min_i,
    pad,
    padded,
)
from explorer.codegen.tiles import rows_aligned, tile_loads
from explorer.frontend.names import AGGREGATES, CARRIES


@dataclass(frozen=True)
class ScanShapes:
    """Workgroup arrays of the Blelloch kernels: (stage buffers, aggregate buffers) sizes."""

    stage: int          # floats per stage buffer (tile, padded)
    #: floats per aggregate buffer: block_size (padded), then the total slot, and with the
    #: look-back grid the slot through which it hands the state before the tile to the block
    agg: int


def blelloch_shapes(options: Options, scheme: str, elements: int | None = None,
                    threads: int | None = None) -> ScanShapes:
    """The workgroup buffers of a tree plan's block, on the grid ``scheme``, for a tile of
    ``threads`` threads (default ``block_size``) by ``elements`` a thread (default
    ``elements_per_thread``; the look-back kernel's own)."""
    slots = 2 if scheme == "lookback" else 1
    E = int(options.elements_per_thread) if elements is None else elements
    B = int(options.block_size) if threads is None else threads
    return ScanShapes(padded(B * E), padded(B) + slots)


def blelloch_block(gen: Gen, th: Threads, role: str, bid: Value, stage: Sequence[Value],
                   aggbuf: Sequence[Value]) -> None:
    """One block of the Blelloch kernels (role scan / reduce / carry)."""
    o = gen.options
    alg = gen.alg
    E = int(o.elements_per_thread)
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
        block_scan(gen, th, E, stage, aggbuf, ins, outs, lambda v, t: alg.pack(v),
                   lambda h, v: list(h),
                   ci(0), nch, gen.initial_state(seq), "exclusive")
        return
    s = arith.divui(bid, nch)
    k = arith.remui(bid, nch)
    begin = mul_i(k, Tc)
    end = min_i(gen.L, add_i(begin, Tc))
    names = gen.scan_inputs if role == "scan" else gen.coeff_inputs
    seq = gen.seq(arith.divui(s, gen.N), arith.remui(s, gen.N), set(names) | gen.scan_params)
    at = {n: q for q, n in enumerate(names)}

    def element(vals: list[Value], t: Value) -> Element:
        return gen.leaf_from(seq, lambda name: vals[at[name]], t=t)
    if role == "reduce":
        agg = block_scan(gen, th, E, stage, aggbuf, gen.in_streams(seq, names), [], element,
                         None, begin, end, [], "reduce", direct=direct_tiles(gen, th))

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
               element, outputs, begin, end, init, "inclusive",
               last_state=gen.last_state_hook(seq), direct=direct_tiles(gen, th))


#: resident threads per SM asked of ptxas for the lane-loop scan kernel (as blocks per SM):
#: left alone ptxas gives it 128 registers, 4 blocks of 128 threads an SM, and the kernel is
#: bound by issuing its instructions; asked for 5 it fits 96 registers (56 bytes of spills) and
#: ran 7% faster on an H100 (Mamba preset, 8 x 1536 x 16 x 2048 and x 8192); asked for 6 or 8,
#: the spills cost more than the occupancy gives
LANE_LOOP_THREADS_PER_SM = 640
#: the same for 16 elements a thread, which hold twice the registers: at 640 threads an SM
#: they spilled 344 bytes; at 512 (128 registers, 36 bytes of spills) the bf16 Mamba preset
#: (32 threads a block, fast math) ran 14% faster than with 8 elements at 8 x 1536 x 16 x 8192
#: and 32768 on an H100, where 384 or 320 (168 registers, no spills) ran no faster than 8.
#: Since the two-lane loop (below) 8 and 16 elements run within 7% of each other there, the
#: one or the other ahead by length
LANE_LOOP_THREADS_PER_SM_16 = 512


def lane_loop_threads_per_sm(elements: int) -> int:
    """Resident threads per SM to ask for the lane-loop scan kernel with ``elements`` a
    thread."""
    return LANE_LOOP_THREADS_PER_SM if elements <= 8 else LANE_LOOP_THREADS_PER_SM_16


def spread_rows(gen: Gen, c: Value) -> Value:
    """The channel of the ``c``-th block: ``c`` itself, unless the kernel adds lane readouts
    into rows shared by ``div`` consecutive channels; then consecutive blocks take channels of
    different rows (``(c % G) * div + c // G``, G = C / div rows: a permutation), so that the
    blocks resident at once add into as many rows as there are, not all into one. H100,
    selective scan adjoint with lane gradients at 8 x 1536 x 16 x 2^11 (B and C shared by the
    1536 channels of a batch row; ``bench/grad_speed.py --lane-gradients``): 5.16 -> 4.45 ms."""
    div = next((gen.row_div[r] for r in gen.io.readouts if r in gen.row_div
                and gen.form.output_is_lane(r)), None)
    if div is None:
        return c
    rows = arith.divui(gen.C, div)
    return add_i(mul_i(arith.remui(c, rows), div), arith.divui(c, rows))


def lane_loop_block(gen: Gen, th: Threads, bid: Value, stage: Sequence[Value],
                    aggbuf: Sequence[Value], shared: Sequence[Value], acc: Sequence[Value],
                    split: ChannelSplit) -> None:
    """A block of the scan kernel with the lane sum in it: chunk ``k`` of channel ``c`` (grid
    ``C * ceil(L / time_chunk)``). Tile by tile: the channel's inputs and values at the tile's
    steps go into ``shared`` once (``split``: what the lanes share); then the block scans each
    lane of the channel in turn from that lane's state before the tile (the initial state or
    the chunk's carry at the first tile; then what the lane's last tile left in the chunk's
    carry slot, which this block alone uses), loading only the lane's own inputs (on the GPU the
    next lane's tile, or the next tile's first lane, is loaded while a lane is scanned), each
    thread adding the lane's terms at its positions into ``acc`` (a row of the tile per term);
    then the tile's readouts are written, coalesced, and ``acc`` cleared.

    On the GPU, where no state is streamed out (the fused readout), a thread keeps what it
    needs in registers: its own consecutive positions of a lane's inputs, loaded in vectors
    straight from memory (block_scan's ``direct``: the lane inputs' stage is not used, and LLVM
    drops it), the channel's shared values at those positions (read once a tile for all the
    lanes), and its running sums of the lane terms, which go into ``acc`` once after the lanes
    (nothing to clear)."""
    alg = gen.alg
    E = int(gen.options.elements_per_thread)
    bs = th.bs
    T = bs * E
    assert gen.Tc is not None, "the chunked scan kernels take time_chunk"
    nch = ceil_div(gen.L, gen.Tc)
    c = spread_rows(gen, arith.divui(bid, nch))
    k = arith.remui(bid, nch)
    begin = mul_i(k, gen.Tc)
    end = min_i(gen.L, add_i(begin, gen.Tc))
    lane_names = split.lane_inputs
    at = {n: q for q, n in enumerate(lane_names)}
    at |= {n: len(lane_names) + q for q, n in enumerate(split.channel_staged)}
    S = alg.S
    carries = gen.arrays[CARRIES]
    readouts = gen.io.lane_readouts
    values = dict(split.values)
    lane_outputs = dict(split.readouts)   # the lane readouts, with the channel values in them
    A = sympy.Matrix(S, S, split.element[:S * S])
    b = sympy.Matrix(split.element[S * S:])
    # the channel's parameters (its values' and readouts'), and its timed inputs as streams
    cseq = gen.seq(c, ci(0), set(split.channel_raw) | set(gen.io.outer)
                   | {s.name for e in values.values() for s in e.free_symbols})

    def clear(i: Value) -> None:
        for buf in acc:
            memref.store(cf(0.0), buf, [pad(i)])

    def clear_own(tid: Value) -> None:
        for kk in range(E):
            clear(add_i(ci(kk * bs), tid))
    # on the GPU each thread keeps the sums at its positions in registers through the lanes
    # (block_scan's ``sums``), and leaves them in ``acc`` once per tile
    in_registers = th.gpu
    if not in_registers:
        th.each(clear_own)

    def streams(n: Value) -> tuple[Seq, list[Stream]]:
        seq = gen.seq(c, n, set(lane_names) | gen.scan_params)
        return seq, gen.in_streams(seq, lane_names, end_first=False)

    def stage_channel(t0: Value, t1: Value) -> None:
        """The channel's inputs and values at the tile's steps, into ``shared``."""
        def each(tid: Value) -> None:
            for kk in range(E):
                i = add_i(ci(kk * bs), tid)
                t = min_i(add_i(t0, i), arith.subi(t1, ci(1)))
                raw = {n: gen.value(cseq, n, t) for n in split.channel_raw}

                def lookup(sym: sympy.Symbol, raw: dict[str, Value] = raw) -> Value:
                    return raw[sym.name] if sym.name in raw else cseq.params[sym.name]
                emit = ExprEmitter(lookup)
                with gen.statement_locs.get(gen.states[0]) or nullcontext():
                    for buf, name in zip(shared, split.channel_staged, strict=True):
                        v = emit(values[name]) if name in values else raw[name]
                        memref.store(v, buf, [pad(i)])
        th.each(each)
        th.barrier()

    nterms = len(acc)
    nsums = nterms * E if in_registers else 0
    # in the plan's direct layout (on the GPU; "auto" where no state is streamed out) each
    # thread loads its own consecutive positions of a lane's inputs into registers, in vectors
    direct = direct_tiles(gen, th)
    W = gen.options.vector_elements if direct else 1
    # the lanes' rows are aligned for their wide loads, checked once for all lanes and tiles
    aligned = (rows_aligned([gen.arrays[n] for n in lane_names], gen.L, begin, W)
               if direct and W > 1 and lane_names else None)

    # on the GPU the lane loop carries the rows of the lane inputs of the lane it loads
    # next, starting from the first lane's (the next lane's are one add away, not a multiply)
    ins0 = streams(ci(0))[1] if th.gpu else []
    rows0 = [q.row for q in ins0]
    nrows = len(rows0)

    def at_rows(rows: Sequence[Value]) -> list[Stream]:
        """The lane inputs' streams at these rows."""
        return [replace(q, row=r) for q, r in zip(ins0, rows, strict=True)]

    def tile(tix: Value, pref: list[Value]) -> list[Value]:
        t0 = add_i(begin, mul_i(tix, ci(T)))
        t1 = min_i(end, add_i(t0, ci(T)))
        fresh = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, tix, ci(0)),
                           arith.cmpi(arith.CmpIPredicate.eq, k, ci(0)))
        stage_channel(t0, t1)
        # what the lanes share at the thread's own positions, read once for all the lanes
        shared_held: list[Value] = []
        if direct:
            assert th.tid is not None
            for j in range(E):
                p = add_i(mul_i(th.tid, ci(E)), ci(j))
                shared_held += [memref.load(buf, [pad(p)]) for buf in shared]

        def lane(n: Value, it: list[Value]) -> list[Value]:
            npref = len(it) - nrows - nsums
            pref, rows, sums = it[:npref], it[npref:npref + nrows], it[npref + nrows:]
            s = add_i(mul_i(c, gen.N), n)
            if rows:   # the lane's streams at the rows carried to it (no row computed here)
                seq, ins = gen.seq(c, n, gen.scan_params), at_rows(rows)
            else:
                seq, ins = streams(n)

            def slot(i: int) -> Value:
                return add_i(mul_i(add_i(mul_i(s, ci(S)), ci(i)), nch), k)
            init = if_else(fresh, [f32()] * S, lambda: gen.initial_state(seq),
                           lambda: [memref.load(carries, [slot(i)]) for i in range(S)])

            def element(vals: list[Value], t: Value) -> Element:
                return gen.leaf_from(seq, lambda name: vals[at[name]], A, b, t)

            def outputs(h: list[Value], vals: list[Value]) -> list[Value]:
                return gen.outputs_at(seq, h, lambda name: vals[at[name]], lane_outputs)

            def accumulate(p: Value, h: list[Value], vals: list[Value]) -> list[Value] | None:
                terms = gen.lane_terms_at(seq, h, lambda name: vals[at[name]], split.terms)
                if in_registers:
                    return list(terms)
                for buf, v in zip(acc, terms, strict=True):
                    memref.store(arith.addf(memref.load(buf, [pad(p)]), v), buf, [pad(p)])
                return None
            then = None
            next_rows: list[Value] = []
            if th.gpu:
                # while this lane is scanned, the next lane's tile (after the last lane, the
                # first lane's next tile) is loaded; its rows follow this lane's by L (lane
                # n + 1's row of an input is lane n's plus one), or are the first lane's
                last_lane = arith.cmpi(arith.CmpIPredicate.eq, add_i(n, ci(1)), gen.N)
                next_rows = [arith.select(last_lane, r0, add_i(r, gen.L))
                             for r, r0 in zip(rows, rows0, strict=True)]
                b2 = arith.select(last_lane, add_i(t0, ci(T)), t0)
                then = (at_rows(next_rows), b2, min_i(end, add_i(b2, ci(T))))
            # ragged_total: only the chunk's last tile ends inside a tile, and the state after
            # it (left in the carry slot) is read by no later tile
            outs = gen.out_streams(seq, end_first=False)
            out = block_scan(gen, th, E, stage, aggbuf, ins, outs, element,
                             outputs if gen.scan_outputs else None, t0, t1, init, "inclusive",
                             accumulate=accumulate, extra=shared,
                             prefetched=pref if th.gpu else None, then=then,
                             last_state=gen.last_state_hook(seq), sums=sums, direct=direct,
                             extra_held=shared_held, ragged_total=True, aligned=aligned)
            after, nxt = out[:S], out[S:]

            def keep() -> None:
                for i, v in enumerate(after):
                    memref.store(v, carries, [slot(i)])
            if th.gpu:
                assert th.tid is not None
                if_then(arith.cmpi(arith.CmpIPredicate.eq, th.tid, ci(0)), keep)
            else:
                keep()
            return nxt[:npref] + next_rows + nxt[npref:]
        start = pref + rows0 + [cf(0.0)] * nsums
        if th.gpu and bs <= WARP and gen.marks is None:
            # a block of one warp takes two lanes an iteration (the second where there is one):
            # the tile one lane loads for the next then lands in the registers the next one
            # reads, where a loop of one lane copies it there (a register move an element and
            # lane); measured on an H100 (Mamba preset, warp_shuffle, 32 threads, fast math,
            # L = 8192 and 32768): 3 to 5% less kernel time in fp32 and bf16. Larger blocks
            # keep one lane: Blelloch's 256 threads spilled 244 bytes with two (24 with one).
            # A packed batch (segment marks) keeps one lane too: with two its kernel spilled
            # 272 bytes at 96 registers (none with one) and ran 1.6x slower (10.5 -> 16.5 ms)
            def two(m: Value, it: list[Value]) -> list[Value]:
                n = mul_i(m, ci(2))
                it = lane(n, it)
                n1 = add_i(n, ci(1))
                return if_else(lt_i(n1, gen.N), [v.type for v in it],
                               lambda: lane(n1, it), lambda: it)
            out = for_loop(ci(0), ceil_div(gen.N, ci(2)), ci(1), two, start)
        else:
            out = for_loop(ci(0), gen.N, ci(1), lane, start)
        pref = out[:len(pref)]
        if in_registers:
            # the sums at the thread's positions (tid * E + j) into acc, for coalesced writes
            assert th.tid is not None
            for j in range(E):
                p = add_i(mul_i(th.tid, ci(E)), ci(j))
                for q, buf in enumerate(acc):
                    memref.store(out[len(pref) + nrows + j * nterms + q], buf, [pad(p)])
            th.barrier()

        # the block's last scan ended with a barrier after the terms were added (on the GPU:
        # the barrier after the sums went into acc). The readouts' timed inputs were staged
        # with the channel's (``split.channel_inputs``): read there, not from memory, they cost
        # no wait on memory a position (ncu, H100, bf16 Mamba kernel: a quarter of its stall
        # samples were those loads, each under its position's guard)
        staged_at = {n: q for q, n in enumerate(split.channel_staged) if n in split.channel_inputs}

        def write(tid: Value) -> None:
            for kk in range(E):
                i = add_i(ci(kk * bs), tid)
                t = add_i(t0, i)

                def put(i: Value = i, t: Value = t) -> None:
                    def timed(name: str) -> Value:
                        return memref.load(shared[staged_at[name]], [pad(i)])
                    sums = [memref.load(buf, [pad(i)]) for buf in acc]
                    ys = gen.lane_readouts_at(cseq.params, sums, timed)
                    for name, y in zip(readouts, ys, strict=True):
                        memref.store(y, gen.arrays[name], [gen.at(mul_i(c, gen.L), t)])
                if_then(lt_i(t, t1), put)
                if not in_registers:
                    clear(i)
        th.each(write)
        th.barrier()
        return pref
    # the first lane's first tile, loaded before the loops (GPU)
    first: list[Value] = []
    if th.gpu:
        assert th.tid is not None
        last0 = arith.subi(min_i(end, add_i(begin, ci(T))), ci(1))
        first = tile_loads(ins0, th.tid, begin, last0, E, bs, W, direct, aligned)
    for_loop(ci(0), ceil_div(arith.subi(end, begin), ci(T)), ci(1), tile, first)


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
