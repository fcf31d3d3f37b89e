"""Lowering of the grid level of a tree plan (``scan.grid {scheme = "chunked"}``): the blocks of
the reduce, carry and scan kernels over the chunks of each sequence, and the readout kernel that
sums a vector state's lanes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlir.dialects import arith, memref
from mlir.ir import (
    Value,
)

from explorer.codegen.contract import READOUT_CHUNK_TILES
from explorer.codegen.emit import (
    Element,
    add_i,
    ceil_div,
    ci,
    f32,
    mul_i,
)
from explorer.codegen.gen import Gen, Stream
from explorer.codegen.lower_block import block_scan
from explorer.codegen.options import Options
from explorer.codegen.threads import Threads, for_loop, if_else, if_then, min_i, padded
from explorer.frontend.names import AGGREGATES, CARRIES


@dataclass(frozen=True)
class ScanShapes:
    """Workgroup arrays of the Blelloch kernels: (stage buffers, aggregate buffers) sizes."""

    stage: int          # floats per stage buffer (tile, padded)
    #: floats per aggregate buffer: block_size (padded), then the total slot, and with the
    #: look-back grid the slot through which it hands the state before the tile to the block
    agg: int


def blelloch_shapes(options: Options) -> ScanShapes:
    slots = 2 if options.grid == "lookback" else 1
    return ScanShapes(padded(options.tile), padded(options.block_size) + slots)


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
