"""Lowering of the grid level ``scan.grid {scheme = "lookback"}``: a single-pass scan with
decoupled look-back (Merrill and Garland, "Single-pass Parallel Prefix Scan with Decoupled
Look-back", 2016).

Block ``k`` of a sequence scans one tile (``time_chunk`` steps, one tile). When there are enough
sequences to fill the GPU, each runs whole in one block of the plain scan kernel instead (then
there is nothing to look back at, and that kernel carries none of this code). After its block
tree has the tile's aggregate (a Blelloch tree has it after its up-sweep, before the
down-sweep; a Kogge-Stone tree at its end):

1. thread 0 publishes the aggregate (``chunk_aggregates``), a device-scope fence, then the flag
   1 (``tile_flags``, zeroed by the launcher before every launch);
2. warp 0 looks back over the tiles before ``k``, ``32 * m`` at a time (``scan.lookback``:
   lane ``i`` reads the m tiles ``top - i*m - r``): a ballot finds the nearest tile whose flag
   is 2 (it has published the state after it, ``chunk_carries``); if a tile nearer than that
   one has published nothing yet the warp sleeps a little and reads the window again;
   otherwise the aggregates of the tiles nearer than the nearest 2 are composed in order, in
   each lane and then across the lanes with shuffles, and the walk stops at the 2 (tile -1
   stands for the initial state) or moves ``32 * m`` tiles further back. The walk keeps up
   only if a window spans the tiles that finish during one round trip to memory;
3. lane 0 publishes the state after the tile (flag 2) and hands the state before it to the
   block through workgroup memory; the block applies it to its elements as a carry.

Each element is read once from memory (12 bytes an fp32 affine element, against 20 for the
chunked scan). The wait is safe because blocks are dispatched in the order of their index
(as CUB's single-pass scan assumes): a block waits only on tiles of lower index, which are
resident or done. On the CPU target the blocks run one after another, so the walk (one lane)
always finds the tile before it published.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir.dialects import arith, gpu, llvm, memref, nvvm, scf
from mlir.ir import F32Type, InsertionPoint, IntegerType, Value

from explorer.codegen.contract import TILE_SLOT_WORDS
from explorer.codegen.emit import (
    Algebra,
    Element,
    add_i,
    c32,
    ceil_div,
    cf,
    ci,
    ci64,
    cint,
    f32,
    index,
    mul_i,
)
from explorer.codegen.gen import Gen
from explorer.codegen.lower_block import block_scan, direct_tiles
from explorer.codegen.packed import shares_stage
from explorer.codegen.threads import WARP, Threads, if_then, min_i, padded, shuffle_element
from explorer.frontend.names import AGGREGATES, CARRIES, TILE_FLAGS

#: the flags a block publishes for its tile
NOTHING, AGGREGATE, PREFIX = 0.0, 1.0, 2.0
#: nanoseconds the look-back warp sleeps before reading a window again
BACKOFF_NS = 100


def _i64() -> IntegerType:
    return IntegerType.get_signless(64)


def _i32() -> IntegerType:
    return IntegerType.get_signless(32)


class Memory:
    """Loads, stores and fences of the look-back: device-scope relaxed accesses (so no block
    reads a stale line from its SM's L1) and ``fence.acq_rel.gpu`` on the GPU; plain accesses on
    the host, where blocks run one after another."""

    def __init__(self, gpu_target: bool) -> None:
        self.gpu = gpu_target

    def _address(self, buf: Value, i: Value) -> Value:
        base = arith.index_cast(_i64(), memref.extract_aligned_pointer_as_index(buf))
        offset = arith.muli(arith.index_cast(_i64(), i), ci64(4))
        return llvm.inttoptr(llvm.PointerType.get(), arith.addi(base, offset))

    def load(self, buf: Value, i: Value) -> Value:
        if not self.gpu:
            return memref.load(buf, [i])
        return llvm.load(F32Type.get(), self._address(buf, i),
                         ordering=llvm.AtomicOrdering.monotonic, syncscope="device",
                         alignment=4)

    def store(self, buf: Value, i: Value, v: Value) -> None:
        if not self.gpu:
            memref.store(v, buf, [i])
            return
        llvm.store(v, self._address(buf, i), ordering=llvm.AtomicOrdering.monotonic,
                   syncscope="device", alignment=4)

    def fence(self) -> None:
        if self.gpu:
            llvm.fence(llvm.AtomicOrdering.acq_rel, syncscope="device")

    # the packed protocol: values that announce themselves (see :func:`encode`)
    def load_word(self, buf: Value, i: Value) -> Value:
        """One encoded word (i32)."""
        if not self.gpu:
            return arith.bitcast(_i32(), memref.load(buf, [i]))
        return llvm.load(_i32(), self._address(buf, i), ordering=llvm.AtomicOrdering.monotonic,
                         syncscope="device", alignment=4)

    def store_word(self, buf: Value, i: Value, word: Value) -> None:
        if not self.gpu:
            memref.store(arith.bitcast(F32Type.get(), word), buf, [i])
            return
        llvm.store(word, self._address(buf, i), ordering=llvm.AtomicOrdering.monotonic,
                   syncscope="device", alignment=4)

    def load_pair(self, buf: Value, i: Value) -> tuple[Value, Value]:
        """Two encoded words at ``i`` (even), read at once: one 64-bit access on the GPU, so
        that a reader sees both or neither."""
        if not self.gpu:
            return self.load_word(buf, i), self.load_word(buf, add_i(i, ci(1)))
        pair = llvm.load(_i64(), self._address(buf, i), ordering=llvm.AtomicOrdering.monotonic,
                         syncscope="device", alignment=8)
        return (arith.trunci(_i32(), pair),
                arith.trunci(_i32(), arith.shrui(pair, ci64(32))))

    def store_pair(self, buf: Value, i: Value, lo: Value, hi: Value) -> None:
        if not self.gpu:
            self.store_word(buf, i, lo)
            self.store_word(buf, add_i(i, ci(1)), hi)
            return
        pair = arith.ori(arith.extui(_i64(), lo),
                         arith.shli(arith.extui(_i64(), hi), ci64(32)))
        llvm.store(pair, self._address(buf, i), ordering=llvm.AtomicOrdering.monotonic,
                   syncscope="device", alignment=8)


#: words of a tile's slot in ``tile_flags``: the flag (the general protocol), or the packed
#: protocol's encoded aggregate (two words) and encoded state after the tile (one word)
SLOT_WORDS = TILE_SLOT_WORDS
#: the canonical NaN published in place of any NaN (its encoding is never 0)
CANONICAL_NAN = 0x7FC00000


def packs(alg: Algebra) -> bool:
    """The packed protocol holds an aggregate of at most two floats and a state of one (the
    scalar affine scan, and each lane of a diagonal one)."""
    return alg.width <= 2 and alg.S == 1


def encode(x: Value) -> Value:
    """A float as a word that is never 0: its bits inverted, NaNs made canonical first (the
    only float whose inverted bits are 0 is the NaN 0xFFFFFFFF). A zeroed slot therefore means
    "not published", and a value read at once with its slot announces itself: no flag and no
    fence between them."""
    bits = arith.bitcast(_i32(), x)
    nan = arith.cmpf(arith.CmpFPredicate.UNO, x, x)
    bits = arith.select(nan, c32(CANONICAL_NAN), bits)
    return arith.xori(bits, c32(-1))


def decode(word: Value) -> Value:
    return arith.bitcast(F32Type.get(), arith.xori(word, c32(-1)))


def published(word: Value) -> Value:
    return arith.cmpi(arith.CmpIPredicate.ne, word, c32(0))


def lookback_block(gen: Gen, th: Threads, bid: Value, stage: Sequence[Value],
                   aggbuf: Sequence[Value]) -> None:
    """One block of the look-back scan kernel."""
    assert gen.Tc is not None, "the look-back kernel takes time_chunk"
    alg = gen.alg
    nch = ceil_div(gen.L, gen.Tc)
    s = arith.divui(bid, nch)
    k = arith.remui(bid, nch)
    begin = mul_i(k, gen.Tc)
    end = min_i(gen.L, add_i(begin, gen.Tc))
    names = gen.scan_inputs
    seq = gen.seq(arith.divui(s, gen.N), arith.remui(s, gen.N), set(names) | gen.scan_params)
    at = {n: q for q, n in enumerate(names)}
    h0 = gen.initial_state(seq)
    mem = Memory(th.gpu)
    flags, aggs, carries = (gen.arrays[n] for n in (TILE_FLAGS, AGGREGATES, CARRIES))
    w, S = alg.width, alg.S
    first_tile = mul_i(s, nch)         # tile (s, 0) of the flat (sequence, tile) workspaces
    handoff = ci(padded(th.bs) + 1)    # the aggregate buffers' slot for the state before

    def element(vals: list[Value], t: Value) -> Element:
        return gen.leaf_from(seq, lambda name: vals[at[name]], t=t)

    def outputs(h: list[Value], vals: list[Value]) -> list[Value]:
        return gen.outputs_at(seq, h, lambda name: vals[at[name]])

    packed = packs(alg)

    def publish(slot: Value, values: Sequence[Value], per: int, buf: Value,
                flag: float) -> None:
        word = mul_i(slot, ci(SLOT_WORDS))
        if packed:     # the values announce themselves
            if flag == AGGREGATE:
                v = list(values)
                mem.store_pair(flags, word, encode(v[0]),
                               encode(v[1] if len(v) > 1 else cf(0.0)))
            else:
                mem.store_word(flags, add_i(word, ci(2)), encode(values[0]))
            return
        for e, v in enumerate(values):
            memref.store(v, buf, [add_i(mul_i(slot, ci(per)), ci(e))])
        mem.fence()      # the values are visible before the flag that announces them
        mem.store(flags, word, cf(flag))

    walk = _walk_packed if packed else _walk

    slot = add_i(first_tile, k)
    announced: list[bool] = []

    def announce(total: Element) -> None:
        """Thread 0 publishes the tile's aggregate for the tiles after it (tile 0 of a
        sequence publishes its state alone). Every thread calls this."""
        announced.append(True)

        def put() -> None:
            publish(slot, total.values(), w, aggs, AGGREGATE)
        later = arith.cmpi(arith.CmpIPredicate.ne, k, ci(0))
        if th.gpu:
            assert th.tid is not None
            first = arith.cmpi(arith.CmpIPredicate.eq, th.tid, ci(0))
            if_then(arith.andi(first, later), put)
        else:
            if_then(later, put)

    def chained(total: Element) -> list[Value]:
        """The state before tile ``k``, found by looking back (every thread calls this);
        the aggregate is published first where the block tree did not publish it early."""
        if not announced:
            announce(total)
        if th.gpu:
            assert th.tid is not None
            tid = th.tid
            first = arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0))

            def warp0() -> None:
                lane = arith.index_cast(_i64(), tid)
                before = walk(gen, mem, lane, WARP, first_tile, k, h0, flags, aggs, carries)

                def finish() -> None:
                    publish(slot, alg.apply(total, before), S, carries, PREFIX)
                    for i, v in enumerate(before):
                        memref.store(v, aggbuf[i], [handoff])
                if_then(first, finish)
            if_then(arith.cmpi(arith.CmpIPredicate.ult, tid, ci(WARP)), warp0)
            th.barrier()
            return [memref.load(aggbuf[i], [handoff]) for i in range(S)]
        # the host: the blocks before this one are done, so one lane finds the state
        before = walk(gen, mem, ci64(0), 1, first_tile, k, h0, flags, aggs, carries)
        publish(slot, alg.apply(total, before), S, carries, PREFIX)
        return before

    def state_before(total: Element, carry: list[Value]) -> list[Value]:
        return chained(total)

    # a packed tile (scan.lookback {layout = "packed"}): the inputs' stage buffers, then the
    # outputs' where they have their own (shared_layout.stage_counts)
    tile_packed = gen.options.tile_layout == "packed"
    outs = gen.out_streams(seq)
    nin = len(names) if tile_packed else len(stage)
    shared = tile_packed and shares_stage(gen.options, nin, len(outs))
    assert not tile_packed or len(stage) == nin + (0 if shared else len(outs)), "packed stage"
    block_scan(gen, th, int(gen.options.lookback_elements), stage[:nin], aggbuf,
               gen.in_streams(seq, names), outs, element, outputs, begin, end,
               h0, "inclusive", state_before, single_tile=True, on_total=announce,
               last_state=gen.last_state_hook(seq), direct=direct_tiles(gen, th),
               packed=tile_packed, out_stage=stage[:len(outs)] if shared else stage[nin:])


def _walk(gen: Gen, mem: Memory, lane: Value, lanes: int, first_tile: Value, k: Value,
          h0: list[Value], flags: Value, aggs: Value, carries: Value) -> list[Value]:
    """The state before tile ``k`` of the sequence whose tile 0 is ``first_tile``, looking back
    ``lanes * m`` tiles per round trip (``m = tiles_per_lane``; lane ``i`` reads the tiles
    ``top - i*m - r``, r < m; tile -1 stands for the initial state). Every lane of the warp
    runs this, and every lane gets the state."""
    alg = gen.alg
    w, S = alg.width, alg.S
    m = gen.options.lookback_tiles
    i1 = IntegerType.get_signless(1)
    types = [_i64(), i1, *([f32()] * (w + S))]
    top0 = arith.subi(arith.index_cast(_i64(), k), ci64(1))
    inits = [top0, cint(1, 0), *alg.identity().values(), *h0]
    loop = scf.WhileOp(types, inits)
    before = loop.before.blocks.append(*types)
    with InsertionPoint(before):
        done = before.arguments[1]
        scf.condition(arith.xori(done, cint(1, 1)), list(before.arguments))
    after = loop.after.blocks.append(*types)
    with InsertionPoint(after):
        top, _, *rest = list(after.arguments)
        acc, state = alg.pack(rest[:w]), rest[w:]
        base = arith.subi(top, arith.muli(lane, ci64(m)))

        def tile_of(j: Value) -> Value:
            return add_i(first_tile, arith.index_cast(index(), arith.maxsi(j, ci64(0))))
        js = [arith.subi(base, ci64(r)) for r in range(m)]
        # the m flags go out together: one round trip
        flag = [arith.select(arith.cmpi(arith.CmpIPredicate.sge, j, ci64(0)),
                             mem.load(flags, mul_i(tile_of(j), ci(SLOT_WORDS))), cf(PREFIX))
                for j in js]
        is_prefix = [arith.cmpf(arith.CmpFPredicate.OEQ, f, cf(PREFIX)) for f in flag]
        is_nothing = [arith.cmpf(arith.CmpFPredicate.OEQ, f, cf(NOTHING)) for f in flag]
        # this lane's nearest prefix (m: none), and whether a tile nearer has published nothing
        own = ci64(m)
        for r in reversed(range(m)):
            own = arith.select(is_prefix[r], ci64(r), own)
        blocked = cint(1, 0)
        for r in range(m):
            nearer = arith.cmpi(arith.CmpIPredicate.slt, ci64(r), own)
            blocked = arith.ori(blocked, arith.andi(is_nothing[r], nearer))
        has_prefix = arith.cmpi(arith.CmpIPredicate.slt, own, ci64(m))
        lane32 = arith.trunci(_i32(), lane)
        if lanes > 1:
            prefixes = nvvm.vote_sync(_i32(), c32(-1), has_prefix, nvvm.VoteSyncKind.ballot)
            waits = nvvm.vote_sync(_i32(), c32(-1), blocked, nvvm.VoteSyncKind.ballot)
            nearest = arith.select(
                arith.cmpi(arith.CmpIPredicate.eq, prefixes, c32(0)), c32(lanes),
                llvm.intr_cttz(prefixes, False))
        else:
            prefixes = arith.extui(_i32(), has_prefix)
            waits = arith.extui(_i32(), blocked)
            nearest = arith.select(has_prefix, c32(0), c32(1))
        # read again while a lane up to the nearest prefix is blocked
        upto = arith.subi(arith.shli(ci64(2), arith.extui(_i64(), nearest)), ci64(1))
        waiting = arith.cmpi(arith.CmpIPredicate.ne,
                             arith.andi(arith.extui(_i64(), waits), upto), ci64(0))
        if lanes > 1:
            # back off while tiles are still being scanned: spinning warps would take memory
            # bandwidth from the blocks that are loading theirs
            if_then(waiting, lambda: nvvm.nanosleep(c32(BACKOFF_NS)))
        mem.fence()      # the flags are read before the values they announce
        # the lane's tiles before its nearest prefix, composed (the lanes after the warp's
        # nearest prefix contribute nothing)
        counts = arith.cmpi(arith.CmpIPredicate.ule, lane32, nearest)
        e = alg.identity()
        for r, j in enumerate(js):
            mine = arith.andi(counts, arith.cmpi(arith.CmpIPredicate.slt, ci64(r), own))
            t = [mem.load(aggs, add_i(mul_i(tile_of(j), ci(w)), ci(q))) for q in range(w)]
            e = alg.combine(e, alg.pack([arith.select(mine, x, y) for x, y in
                                         zip(t, alg.identity().values(), strict=True)]))
        window = _ordered_reduce(alg, e, lane32, lanes)
        acc2 = alg.combine(acc, window)
        found = arith.cmpi(arith.CmpIPredicate.ne, prefixes, c32(0))
        jp = arith.subi(base, arith.minsi(own, ci64(m - 1)))
        valid = arith.cmpi(arith.CmpIPredicate.sge, jp, ci64(0))
        kept = [arith.select(valid, mem.load(carries, add_i(mul_i(tile_of(jp), ci(S)), ci(i))),
                             h) for i, h in enumerate(h0)]
        if lanes > 1:
            src = arith.minui(nearest, c32(lanes - 1))
            kept = [gpu.shuffle(v, src, c32(WARP), gpu.ShuffleMode.IDX)[0] for v in kept]
        state2 = alg.apply(acc2, kept)
        go = arith.xori(waiting, cint(1, 1))
        new_top = arith.select(waiting, top, arith.subi(top, ci64(lanes * m)))
        new_done = arith.andi(go, found)
        new_acc = [arith.select(go, x, y) for x, y in zip(acc2.values(), acc.values(),
                                                           strict=True)]
        new_state = [arith.select(new_done, x, y) for x, y in zip(state2, state, strict=True)]
        scf.yield_([new_top, new_done, *new_acc, *new_state])
    return list(loop.results)[2 + w:]


def _walk_packed(gen: Gen, mem: Memory, lane: Value, lanes: int, first_tile: Value, k: Value,
                 h0: list[Value], flags: Value, aggs: Value, carries: Value) -> list[Value]:
    """:func:`_walk` for the packed protocol: each tile's slot holds its encoded aggregate
    (two words, read together) and its encoded state after it (one word), zero until
    published, so one round trip reads everything a round needs, and no fence orders it."""
    alg = gen.alg
    w = alg.width
    m = gen.options.lookback_tiles
    i1 = IntegerType.get_signless(1)
    types = [_i64(), i1, *([f32()] * (w + 1))]
    top0 = arith.subi(arith.index_cast(_i64(), k), ci64(1))
    inits = [top0, cint(1, 0), *alg.identity().values(), *h0]
    loop = scf.WhileOp(types, inits)
    before = loop.before.blocks.append(*types)
    with InsertionPoint(before):
        done = before.arguments[1]
        scf.condition(arith.xori(done, cint(1, 1)), list(before.arguments))
    after = loop.after.blocks.append(*types)
    with InsertionPoint(after):
        top, _, *rest = list(after.arguments)
        acc, state = alg.pack(rest[:w]), rest[w:]
        base = arith.subi(top, arith.muli(lane, ci64(m)))
        js = [arith.subi(base, ci64(r)) for r in range(m)]
        inside = [arith.cmpi(arith.CmpIPredicate.sge, j, ci64(0)) for j in js]
        # every word of the lane's m tiles goes out together: one round trip
        words = []
        for j in js:
            slot = add_i(first_tile, arith.index_cast(index(), arith.maxsi(j, ci64(0))))
            word = mul_i(slot, ci(SLOT_WORDS))
            lo, hi = mem.load_pair(flags, word)
            words.append((lo, hi, mem.load_word(flags, add_i(word, ci(2)))))
        # before the sequence's first tile: its initial state
        is_prefix = [arith.ori(arith.xori(ins, cint(1, 1)), published(p))
                     for ins, (_, _, p) in zip(inside, words, strict=True)]
        is_nothing = [arith.andi(arith.xori(pre, cint(1, 1)),
                                 arith.xori(published(lo), cint(1, 1)))
                      for pre, (lo, _, _) in zip(is_prefix, words, strict=True)]
        own = ci64(m)
        kept = h0[0]
        for r in reversed(range(m)):
            own = arith.select(is_prefix[r], ci64(r), own)
            kept = arith.select(is_prefix[r],
                                arith.select(inside[r], decode(words[r][2]), h0[0]), kept)
        blocked = cint(1, 0)
        for r in range(m):
            nearer = arith.cmpi(arith.CmpIPredicate.slt, ci64(r), own)
            blocked = arith.ori(blocked, arith.andi(is_nothing[r], nearer))
        has_prefix = arith.cmpi(arith.CmpIPredicate.slt, own, ci64(m))
        lane32 = arith.trunci(_i32(), lane)
        if lanes > 1:
            prefixes = nvvm.vote_sync(_i32(), c32(-1), has_prefix, nvvm.VoteSyncKind.ballot)
            waits = nvvm.vote_sync(_i32(), c32(-1), blocked, nvvm.VoteSyncKind.ballot)
            nearest = arith.select(
                arith.cmpi(arith.CmpIPredicate.eq, prefixes, c32(0)), c32(lanes),
                llvm.intr_cttz(prefixes, False))
        else:
            prefixes = arith.extui(_i32(), has_prefix)
            waits = arith.extui(_i32(), blocked)
            nearest = arith.select(has_prefix, c32(0), c32(1))
        upto = arith.subi(arith.shli(ci64(2), arith.extui(_i64(), nearest)), ci64(1))
        waiting = arith.cmpi(arith.CmpIPredicate.ne,
                             arith.andi(arith.extui(_i64(), waits), upto), ci64(0))
        if lanes > 1:
            if_then(waiting, lambda: nvvm.nanosleep(c32(BACKOFF_NS)))
        counts = arith.cmpi(arith.CmpIPredicate.ule, lane32, nearest)
        e = alg.identity()
        ident = alg.identity().values()
        for r, (lo, hi, _) in enumerate(words):
            mine = arith.andi(counts, arith.cmpi(arith.CmpIPredicate.slt, ci64(r), own))
            t = [decode(lo), decode(hi)][:w]
            e = alg.combine(e, alg.pack([arith.select(mine, x, y) for x, y in
                                         zip(t, ident, strict=True)]))
        window = _ordered_reduce(alg, e, lane32, lanes)
        acc2 = alg.combine(acc, window)
        found = arith.cmpi(arith.CmpIPredicate.ne, prefixes, c32(0))
        if lanes > 1:
            src = arith.minui(nearest, c32(lanes - 1))
            kept = gpu.shuffle(kept, src, c32(WARP), gpu.ShuffleMode.IDX)[0]
        state2 = alg.apply(acc2, [kept])
        go = arith.xori(waiting, cint(1, 1))
        new_top = arith.select(waiting, top, arith.subi(top, ci64(lanes * m)))
        new_done = arith.andi(go, found)
        new_acc = [arith.select(go, x, y) for x, y in zip(acc2.values(), acc.values(),
                                                           strict=True)]
        new_state = [arith.select(new_done, x, y) for x, y in zip(state2, state, strict=True)]
        scf.yield_([new_top, new_done, *new_acc, *new_state])
    return list(loop.results)[2 + w:]


def _ordered_reduce(alg: Algebra, e: Element, lane: Value, lanes: int) -> Element:
    """``e_0 o e_1 o ... o e_{lanes-1}`` (lane 0 the latest tile) in every lane: a butterfly
    of shuffles in which the lower lane of each pair is the later operand."""
    x = e
    d = 1
    while d < lanes:
        y = shuffle_element(alg, x, c32(d), gpu.ShuffleMode.XOR)
        upper = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(lane, c32(d)), c32(0))
        later = alg.pack([arith.select(upper, b, a) for a, b in zip(x.values(), y.values(),
                                                                     strict=True)])
        earlier = alg.pack([arith.select(upper, a, b) for a, b in zip(x.values(), y.values(),
                                                                       strict=True)])
        x = alg.combine(later, earlier)
        d *= 2
    return x
