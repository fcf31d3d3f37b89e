"""Lowering of the thread and block levels of a tree plan: each thread composes its elements
in registers (``scan.thread``), then the block tree over the thread aggregates runs sweep by
sweep as the plan's ``scan.sweep`` ops say (Blelloch up/down-sweep or Kogge-Stone levels), a
barrier after each (``via = "shuffle"``: in registers, :mod:`explorer.codegen.lower_warp`);
then each thread applies its prefix to its elements.

The tile's loads and stores, wide or not, and which positions a thread holds, are those of
:mod:`explorer.codegen.tiles`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir.dialects import arith, memref
from mlir.ir import Value

from explorer.codegen.emit import Element, add_i, ceil_div, ci, f32, lt_i, mul_i
from explorer.codegen.gen import Gen, Stream
from explorer.codegen.lower_warp import (
    blelloch_down,
    blelloch_up,
    ks_sweep,
    padded_slots,
    warp_last_lane,
    warp_tree,
    warp_tree_host,
)
from explorer.codegen.options import async_copies
from explorer.codegen.packed import Packing, copy_tile, packs_outputs
from explorer.codegen.threads import (
    WARP,
    Threads,
    for_loop,
    if_else,
    if_then,
    pad,
    padded,
    select_element,
)
from explorer.codegen.tiles import (
    direct_write,
    edge_slot,
    held_value,
    scan_shift,
    stage_write,
    striped_add,
    tile_loads,
    tile_slots,
)


def _storer(v: Value, buf: Value, i: Value) -> Callable[[], None]:
    """A store of ``v`` into ``buf[i]``, to run under a condition."""
    def store() -> None:
        memref.store(v, buf, [i])
    return store


#: the input dtypes whose look-back tile (``single_tile``) is versioned as a loop's tiles are
#: (README, *Speed*: 1% to 2% faster on an H200, no spills; float32 spills and is slower)
VERSIONED_SINGLE_DTYPES = ("bfloat16", "float16")


def direct_tiles(gen: Gen, th: Threads) -> bool:
    """Whether the block's threads load and store their tiles in the ``direct`` layout (the
    plan's ``scan.thread {layout}``; on the GPU only)."""
    return th.gpu and gen.options.tile_layout == "direct"


def block_scan(gen: Gen, th: Threads, E: int, stage: Sequence[Value], aggbuf: Sequence[Value],
               ins: Sequence[Stream], outs: Sequence[Stream],
               element: Callable[[list[Value], Value], Element],
               outputs: Callable[[list[Value], list[Value]], list[Value]] | None,
               begin: Value, end: Value, init: list[Value], mode: str,
               state_before: Callable[[Element, list[Value]], list[Value]] | None = None,
               accumulate: Callable[[Value, list[Value], list[Value]], Sequence[Value] | None]
               | None = None,
               extra: Sequence[Value] = (), prefetched: list[Value] | None = None,
               then: tuple[Sequence[Stream], Value, Value] | None = None,
               single_tile: bool = False,
               on_total: Callable[[Element], None] | None = None,
               last_state: Callable[[Value, list[Value]], None] | None = None,
               sums: Sequence[Value] = (),
               direct: bool = False, extra_held: Sequence[Value] = (),
               ragged_total: bool = False, aligned: Value | None = None,
               packed: bool = False, out_stage: Sequence[Value] = ()) -> list[Value]:
    """Scan ``[begin, end)`` in tiles of ``block_size * E`` positions.

    ``mode``: ``"reduce"`` returns the aggregate of the range (no output); ``"inclusive"``
    writes ``outputs(state after t, inputs at t)`` at every t, ``"exclusive"`` the same with
    the state before t. ``init`` is the state before ``begin`` (ignored by ``reduce``).
    ``state_before(total, carry)``, when given, is called by every thread once the block tree
    has the tile's aggregate ``total``, and gives the state before the tile in place of the
    carried one (the look-back of the grid level). ``accumulate(p, state, inputs)``, when
    given, is called by the thread that owns tile position ``p`` with the state after it
    (``"inclusive"``), in place of or beside the outputs (the terms of a sum over lanes).
    ``sums`` (GPU): the thread's running sums of those terms in registers, per term and then
    per element of the thread (``sums[j * terms + q]``: term ``q`` at its ``j``-th position,
    ``tid * E + j``); ``accumulate`` then returns the terms at a position, they are added to
    ``sums``, and the new sums are returned last (after the state and the next loads).

    ``extra``: workgroup arrays of the tile already filled by the caller (what a channel's
    lanes share): their values at a position follow the inputs' in what ``element``,
    ``outputs`` and ``accumulate`` are given. ``prefetched``: the first tile's loads, issued
    by the caller (GPU). ``then = (streams, begin, end)``: the range is one tile, and it loads
    the first tile of ``streams`` over ``[begin, end)`` while it scans (the next scan's
    ``prefetched``), returned after the state. ``single_tile``: the range is at most one tile
    (the look-back kernel's): no loop over tiles, and no loads of a next tile held in
    registers through the scan, and the thread's elements are rebuilt from the stage for the
    last step instead of being held in registers through the tree. ``on_total(total)``, when
    given, is called by every thread as soon as the tile's aggregate is known, before the rest
    of the block tree: after the Blelloch up-sweep, or the warp-shuffle tree (the look-back
    kernel publishes it there, for the blocks after it).

    ``direct`` (GPU, the plan's ``scan.thread {layout = "direct"}``): each thread loads its
    own E consecutive positions of ``ins`` (:func:`tile_slots`), in vectors where it can, builds
    its elements from those registers and stores its outputs at the same positions from
    registers: the tile never goes through the stage, and no barrier waits for it
    (``prefetched`` and ``then`` loads in the same layout). ``extra_held``
    (direct): the values of ``extra`` at the thread's positions, already read by the caller
    (``extra_held[k * len(extra) + i]``: buffer ``i`` at its ``k``-th position).

    ``ragged_total``: the caller never reads the state after a range that ends inside a tile
    (the lane loop's last tile of a chunk), so the elements past the end are not replaced by
    the identity (two selects an element saved): a position's state depends on the elements
    before it only, and the positions past the end are neither written nor summed into a
    readout; the state returned after such a range is then not the range's.

    ``aligned``: the wide loads' alignment, known by the caller for every tile loaded here
    (:func:`rows_aligned`).

    ``packed`` (a look-back tile, ``single_tile``): the stage holds the inputs as they are in
    memory and each thread reads its own positions back in 16-byte vectors
    (:mod:`explorer.codegen.packed`); the outputs then go through ``out_stage``, buffers of
    their own (packed too where they are stored in the inputs' dtype, else float32 scalars).

    ``element(inputs, t)`` builds the element at scan position ``t`` from its staged inputs.
    ``last_state(t, state)``, when given (``"inclusive"``), is called with the state after every
    position ``t`` of the range (a last state is stored where ``t`` ends its sequence).
    """
    alg = gen.alg
    bs = th.bs
    T = bs * E
    sweeps = gen.sweeps
    kogge_stone = any(sw.phase == "scan" for sw in sweeps)
    # warp shuffles: the aggregates stay in registers on the GPU (lower_warp); on the host the
    # tree leaves inclusive prefixes in shared memory, as Kogge-Stone's does
    shuffles = any(sw.phase == "shuffle" for sw in sweeps)
    in_registers = shuffles and th.gpu
    shuffled = th.gpu and any(sw.via == "shuffle" for sw in sweeps)
    inclusive = kogge_stone or shuffles
    nin = len(ins)
    last = arith.subi(end, ci(1))
    total_slot = ci(padded(bs))

    # wide accesses (scan.thread's vector_width): off for a tile the caller loaded in the
    # coalesced layout (its scalar loads); a direct tile is loaded in vectors by either
    V = gen.options.vector_elements
    VL = V if prefetched is None or direct else 1
    assert E % V == 0, "the plan's vector width divides the thread's elements"
    assert not direct or th.gpu, "direct: GPU"
    assert not extra_held or (direct and len(extra_held) == E * len(extra))
    packing = Packing(gen.options.dtype, E, VL) if packed else None
    assert not packed or (single_tile and not direct and not extra
                          and (bool(out_stage) or not outs)), "packed"
    ostage = list(out_stage) if packed else list(stage)
    out_packing = packing if packs_outputs(gen.options) else None

    def slots(tid: Value, W: int) -> list[Value]:
        return tile_slots(tid, E, bs, W, direct)

    def load_tile(t0: Value, tid: Value, streams: Sequence[Stream] = ins,
                  last: Value = last) -> list[Value]:
        return tile_loads(streams, tid, t0, last, E, bs, VL, direct, aligned)

    # streams read at an offset in time: loaded at the tile's own positions, moved here
    moved = [q for q, s in enumerate(ins) if s.offset] if not direct else []
    assert not (moved and packed), "a packed tile moves no stream"

    def put_tile(tid: Value, vals: list[Value], t0: Value) -> None:
        if packing is not None:   # the coalesced vectors whole, as loaded
            for g in range(E // VL):
                for q in range(nin):
                    packing.store(stage[q], add_i(ci(g * bs), tid), vals[g * nin + q])
            return
        for k, p in enumerate(slots(tid, VL)):
            i = pad(p)
            for q in range(nin):
                v = held_value(vals, k, q, nin, VL)
                if q not in moved:
                    memref.store(v, stage[q], [i])
                    continue
                # position p holds the value of position p - m of the moved stream, when p
                # was loaded from the range (the others are its edge slots)
                dst = arith.subi(p, ci(scan_shift(ins[q])))
                ok = arith.andi(arith.andi(arith.cmpi(arith.CmpIPredicate.sge, dst, ci(0)),
                                           lt_i(dst, ci(T))),
                                arith.cmpi(arith.CmpIPredicate.sle, add_i(t0, p), last))
                if_then(ok, _storer(v, stage[q], pad(dst)))
        for e, q in enumerate(moved):
            m = abs(scan_shift(ins[q]))
            slot = edge_slot(ins[q], tid, t0, last, T)
            v = vals[len(vals) - len(moved) + e]
            ok = arith.andi(lt_i(tid, ci(m)), arith.cmpi(arith.CmpIPredicate.sge, slot, ci(0)))
            if_then(ok, _storer(v, stage[q], pad(slot)))

    def agg_load(i: Value) -> Element:
        return alg.pack([memref.load(b, [i]) for b in aggbuf])

    def agg_store(i: Value, e: Element) -> None:
        for b, v in zip(aggbuf, e.values(), strict=True):
            memref.store(v, b, [i])

    slot_access = padded_slots(agg_load, agg_store)

    #: the current tile's values in registers (direct)
    held: list[Value] = []

    def staged(p: Value, k: int) -> list[Value]:
        """The inputs at tile position ``p``, the thread's ``k``-th."""
        ins_at = ([held_value(held, k, q, nin, VL) for q in range(nin)] if direct else
                  [memref.load(stage[q], [pad(p)]) for q in range(nin)])
        if extra_held:
            return ins_at + list(extra_held[k * len(extra):(k + 1) * len(extra)])
        return ins_at + [memref.load(buf, [pad(p)]) for buf in extra]

    def packed_cols(tid: Value) -> list[list[Value]] | None:
        """The thread's inputs at its own positions, read once from a packed stage."""
        if packing is None:
            return None
        per = [packing.load_own(stage[q], tid) for q in range(nin)]
        return [[per[q][j] for q in range(nin)] for j in range(E)]

    def built(tid: Value, t0: Value, masked: bool,
              cols: list[list[Value]] | None = None) -> list[Element]:
        out = []
        for j in range(E):
            p = add_i(mul_i(tid, ci(E)), ci(j))
            e = element(staged(p, j) if cols is None else cols[j], add_i(t0, p))
            out.append(select_element(lt_i(add_i(t0, p), end), e, alg.identity(), alg)
                       if masked else e)
        return out

    def own(tid: Value, t0: Value, cols: list[list[Value]] | None = None) -> list[Element]:
        """The thread's E consecutive elements, the identity past the end. A tile of a loop
        over tiles that lies inside the range whole (all but its last) takes them unmasked:
        each position's test against the end and the selects of the identity are about a
        fifth of such a kernel's instructions. The look-back kernel's one tile is versioned
        so for VERSIONED_SINGLE_DTYPES only (in float32 it went over its register cap)."""
        if ragged_total:
            return built(tid, t0, False, cols)
        if single_tile and gen.options.dtype not in VERSIONED_SINGLE_DTYPES:
            return built(tid, t0, True, cols)
        whole = arith.cmpi(arith.CmpIPredicate.sle, add_i(t0, ci(T)), end)
        width = alg.width

        def flat(masked: bool) -> list[Value]:
            return [v for e in built(tid, t0, masked, cols) for v in e.values()]
        vals = if_else(whole, [f32()] * (E * width), lambda: flat(False), lambda: flat(True))
        return [alg.pack(vals[j * width:(j + 1) * width]) for j in range(E)]

    # a packed float32 tile of streams read forwards lands in the stage by asynchronous
    # copies on the GPU: no register holds it on the way, so more blocks fit an SM
    copied = (packing is not None and th.gpu and prefetched is None
              and packing.copies(ins) and async_copies(gen.options.chip))

    reduce = mode == "reduce"
    carry0 = alg.identity().values() if reduce else list(init)
    nc = len(carry0)
    first_tile = (prefetched if prefetched is not None else [] if copied else
                  load_tile(begin, th.tid) if th.gpu else [])   # type: ignore[arg-type]
    start = list(carry0) + first_tile + list(sums)
    npref = len(first_tile)
    assert not sums or (th.gpu and len(sums) % E == 0), "register sums: GPU, per element"
    nterms = len(sums) // E

    def one_tile(tix: Value, it: list[Value]) -> list[Value]:
        carry, pref = it[:nc], it[nc:nc + npref]
        kept_sums = list(it[nc + npref:])
        t0 = add_i(begin, mul_i(tix, ci(T)))
        # 1. the tile into workgroup memory (prefetched on the GPU), coalesced; or (direct) kept
        # in the registers it was loaded into
        if direct:
            held[:] = pref
        elif th.gpu:
            if moved:
                # a moved stream's values land in slots that other threads read for the tile
                # before (its outputs leave through the stage)
                th.barrier()
            if copied:
                assert packing is not None and th.tid is not None
                tid = th.tid
                copy_tile(packing, stage, ins, tid, t0, end, bs, E, aligned,
                          lambda: put_tile(tid, load_tile(t0, tid), t0))
            else:
                put_tile(th.tid, pref, t0)      # type: ignore[arg-type]
            th.barrier()
        else:
            th.each(lambda tid: put_tile(tid, load_tile(t0, tid), t0))
            th.barrier()
        # the next tile's loads go out now and land while this tile is scanned
        if not th.gpu or single_tile:
            nxt: list[Value] = []
        elif then is not None:
            streams, b2, e2 = then
            nxt = load_tile(b2, th.tid, streams, arith.subi(e2, ci(1)))  # type: ignore[arg-type]
        else:
            nxt = load_tile(add_i(t0, ci(T)), th.tid)   # type: ignore[arg-type]
        # 2. each thread composes its E consecutive elements
        kept: dict[str, list[Element]] = {}

        def compose(tid: Value) -> None:
            els = own(tid, t0, packed_cols(tid))
            kept["els"] = els
            agg = els[0]
            for e in els[1:]:
                agg = alg.combine(e, agg)
            if in_registers or shuffled:
                kept["agg"] = [agg]
            else:
                agg_store(pad(tid), agg)
        th.each(compose)
        # 3. the block tree over the bs aggregates, one sweep of the plan per level
        total_now: Element | None = None
        shared_sweeps = [sw for sw in sweeps if not (shuffled and sw.via == "shuffle")]
        last_lane = warp_last_lane(th) if shuffled and shared_sweeps else None
        if in_registers:
            excl, total_now = warp_tree(th, alg, sweeps, kept["agg"][0], *slot_access)
            kept["prefix"] = [excl]
        elif shuffled:
            x, total_now = blelloch_up(th, alg, sweeps, kept["agg"][0], reduce)
            kept["agg"] = [x]
            if shared_sweeps:
                if_then(last_lane, lambda: agg_store(pad(th.tid), x))   # type: ignore[arg-type]
                th.barrier()
        else:
            th.barrier()
            if shuffles:
                warp_tree_host(th, alg, sweeps, *slot_access)
                total_now = agg_load(pad(ci(bs - 1)))
        if total_now is not None and on_total is not None and not reduce:
            on_total(total_now)
        for sw in (() if shuffles else shared_sweeps):
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
            if on_total is not None and sw.phase == "up_root" and not reduce:
                on_total(agg_load(total_slot))
        if shuffled and not reduce:   # a warp's last lane back from shared memory, then
            x = kept["agg"][0]          # the levels inside the warp: exclusive prefixes
            if shared_sweeps:
                x = select_element(last_lane, agg_load(pad(th.tid)), x, alg)  # type: ignore
            kept["prefix"] = [blelloch_down(th, alg, sweeps, x)]
        if total_now is not None:
            total = total_now
        elif reduce:
            total = agg_load(pad(ci(bs - 1)))
        else:
            total = agg_load(pad(ci(bs - 1)) if kogge_stone else total_slot)
        if reduce:
            return alg.combine(total, alg.pack(carry)).values() + nxt + kept_sums
        if state_before is not None:
            carry = state_before(total, carry)

        def prefix(tid: Value) -> Element:
            """The exclusive prefix of thread ``tid``'s aggregate."""
            if in_registers or shuffled:
                return kept["prefix"][0]
            if not inclusive:
                return agg_load(pad(tid))
            first = arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0))
            before = agg_load(pad(arith.subi(arith.maxui(tid, ci(1)), ci(1))))
            return select_element(first, alg.identity(), before, alg)

        # 5. each thread applies its prefix to its own elements; states out via the stage, or
        # (direct) kept in registers for the thread's own stores
        out_vals: list[list[Value]] = []

        def finish(tid: Value) -> None:
            assert outputs is not None or accumulate is not None
            h = alg.apply(prefix(tid), carry)
            # a look-back block (one tile) rebuilds its elements from the stage rather than
            # holding them in registers through the tree and the wait: under its register cap
            # they spilled at 16 elements a thread
            cols = packed_cols(tid)
            mine: list[list[Value]] = []    # the thread's outputs, for a packed output stage
            els = kept["els"] if th.gpu and not single_tile else own(tid, t0, cols)
            for j in range(E):
                p = add_i(mul_i(tid, ci(E)), ci(j))
                vals = staged(p, j) if cols is None else cols[j]
                o: list[Value] = []
                if mode == "exclusive":
                    o = outputs(h, vals) if outputs is not None else []
                    h = alg.apply(els[j], h)
                else:
                    h = alg.apply(els[j], h)
                    o = outputs(h, vals) if outputs is not None else []
                    if accumulate is not None:
                        # past the end the element is the identity: the state repeats there,
                        # and the position's term is never read
                        terms = accumulate(p, h, vals)
                        if nterms:
                            assert terms is not None and len(terms) == nterms
                            for q, v in enumerate(terms):
                                kept_sums[j * nterms + q] = arith.addf(
                                    kept_sums[j * nterms + q], v)
                    if last_state is not None:
                        t = add_i(t0, p)

                        def store_last(t: Value = t, h: list[Value] = h) -> None:
                            assert last_state is not None
                            last_state(t, h)
                        if_then(lt_i(t, end), store_last)
                if direct:
                    out_vals.append(o)
                    continue
                if out_packing is not None:
                    mine.append(o)
                    continue
                for q, v in enumerate(o):
                    memref.store(v, ostage[q], [pad(p)])
            if out_packing is not None and mine:
                for q in range(len(mine[0])):
                    out_packing.store_own(ostage[q], tid, [o[q] for o in mine])
        th.each(finish)
        # the barrier keeps the stage and the tree's shared slots from being overwritten (the
        # next tile or scan) before every thread has read them; a direct scan of one warp
        # (the lane loop) keeps its tile and tree in registers and needs none, nor does a
        # direct block's only tile
        if not (direct and (single_tile or (in_registers and bs <= WARP))):
            th.barrier()
        if not outs:
            return alg.apply(total, carry) + nxt + kept_sums
        if direct:
            assert th.tid is not None
            # outputs added into (lane readouts) go through the stage to coalesced adds
            added = [j for j, s in enumerate(outs) if s.accumulate]
            plain = [j for j, s in enumerate(outs) if not s.accumulate]
            if plain:
                direct_write([outs[j] for j in plain], [[v[j] for j in plain] for v in out_vals],
                             t0, th.tid, E, VL, end)
            if added:
                striped_add(th, [outs[j] for j in added],
                            [[v[j] for j in added] for v in out_vals], stage, t0, E, end)
            return alg.apply(total, carry) + nxt + kept_sums

        # A thread writes out the stage positions it loaded (slots(tid, VL)), wide or not: on
        # the GPU the next tile goes into the stage with no barrier after this, each thread
        # overwriting its own positions only, which it has read by then
        def write(tid: Value) -> None:
            def group(q: int, g: int, p: Value) -> list[Value]:
                """Output ``q`` at the thread's ``g``-th group of positions (from ``p``)."""
                if out_packing is not None:
                    return out_packing.load(ostage[q], add_i(ci(g * bs), tid))
                return [memref.load(ostage[q], [pad(add_i(p, ci(j)))]) for j in range(VL)]
            stage_write(outs, group, slots(tid, VL)[::VL], t0, end, T, VL)
        th.each(write)
        return alg.apply(total, carry) + nxt + kept_sums

    if single_tile:
        return one_tile(ci(0), start)[:nc]
    if then is not None:   # the range is one tile: no loop over tiles
        return one_tile(ci(0), start)
    ntiles = ceil_div(arith.subi(end, begin), ci(T))
    out = for_loop(ci(0), ntiles, ci(1), one_tile, start)
    return out[:nc] + out[nc + npref:]
