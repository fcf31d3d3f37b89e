"""Lowering of the thread and block levels of a tree plan: each thread composes its elements
in registers (``scan.thread``), then the block tree over the thread aggregates runs sweep by
sweep as the plan's ``scan.sweep`` ops say (Blelloch up/down-sweep or Kogge-Stone levels), a
barrier after each; then each thread applies its prefix to its elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir.dialects import arith, memref
from mlir.ir import (
    Value,
)

from explorer.codegen.emit import (
    Algebra,
    Element,
    add_i,
    ceil_div,
    ci,
    lt_i,
    mul_i,
)
from explorer.codegen.gen import Gen, Stream
from explorer.codegen.threads import (
    Threads,
    for_loop,
    if_then,
    min_i,
    pad,
    padded,
    select_element,
)


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
        new = select_element(ok, combined(safe), load(pad(tid)), alg)
        th.barrier()
        store(pad(tid), new)
        return

    def body(j: Value, _: list[Value]) -> list[Value]:
        i = arith.subi(ci(th.bs - 1), j)
        store(pad(i), combined(i))
        return []
    for_loop(ci(0), ci(th.bs - off), ci(1), body)


def block_scan(gen: Gen, th: Threads, E: int, stage: Sequence[Value], aggbuf: Sequence[Value],
               ins: Sequence[Stream], outs: Sequence[Stream],
               element: Callable[[list[Value], Value], Element],
               outputs: Callable[[list[Value], list[Value]], list[Value]] | None,
               begin: Value, end: Value, init: list[Value], mode: str,
               state_before: Callable[[Element, list[Value]], list[Value]] | None = None,
               accumulate: Callable[[Value, list[Value], list[Value]], None] | None = None,
               extra: Sequence[Value] = (), prefetched: list[Value] | None = None,
               then: tuple[Sequence[Stream], Value, Value] | None = None,
               single_tile: bool = False,
               on_total: Callable[[Element], None] | None = None,
               last_state: Callable[[Value, list[Value]], None] | None = None
               ) -> list[Value]:
    """Scan ``[begin, end)`` in tiles of ``block_size * E`` positions.

    ``mode``: ``"reduce"`` returns the aggregate of the range (no output); ``"inclusive"``
    writes ``outputs(state after t, inputs at t)`` at every t, ``"exclusive"`` the same with
    the state before t. ``init`` is the state before ``begin`` (ignored by ``reduce``).
    ``state_before(total, carry)``, when given, is called by every thread once the block tree
    has the tile's aggregate ``total``, and gives the state before the tile in place of the
    carried one (the look-back of the grid level). ``accumulate(p, state, inputs)``, when
    given, is called by the thread that owns tile position ``p`` with the state after it
    (``"inclusive"``), in place of or beside the outputs (the terms of a sum over lanes).

    ``extra``: workgroup arrays of the tile already filled by the caller (what a channel's
    lanes share): their values at a position follow the inputs' in what ``element``,
    ``outputs`` and ``accumulate`` are given. ``prefetched``: the first tile's loads, issued
    by the caller (GPU). ``then = (streams, begin, end)``: the range is one tile, and it loads
    the first tile of ``streams`` over ``[begin, end)`` while it scans (the next scan's
    ``prefetched``), returned after the state. ``single_tile``: the range is at most one tile
    (the look-back kernel's): no loop over tiles, and no loads of a next tile held in
    registers through the scan. ``on_total(total)``, when given, is called by every thread as
    soon as the tile's aggregate is known, before the rest of the block tree: after the
    Blelloch up-sweep (the look-back kernel publishes it there, for the blocks after it).

    ``element(inputs, t)`` builds the element at scan position ``t`` from its staged inputs.
    ``last_state(t, state)``, when given (``"inclusive"``), is called with the state after every
    position ``t`` of the range (a last state is stored where ``t`` ends its sequence).
    """
    alg = gen.alg
    bs = th.bs
    T = bs * E
    sweeps = gen.sweeps
    kogge_stone = any(sw.phase == "scan" for sw in sweeps)
    nin = len(ins)
    last = arith.subi(end, ci(1))
    total_slot = ci(padded(bs))

    def load_tile(t0: Value, tid: Value, streams: Sequence[Stream] = ins,
                  last: Value = last) -> list[Value]:
        vals = []
        for k in range(E):
            t = min_i(add_i(t0, add_i(ci(k * bs), tid)), last)
            vals += [s.load(t) for s in streams]
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
        return ([memref.load(stage[q], [pad(p)]) for q in range(nin)]
                + [memref.load(buf, [pad(p)]) for buf in extra])

    def own(tid: Value, t0: Value) -> list[Element]:
        """The thread's E consecutive elements, the identity past the end."""
        out = []
        for j in range(E):
            p = add_i(mul_i(tid, ci(E)), ci(j))
            e = element(staged(p), add_i(t0, p))
            out.append(select_element(lt_i(add_i(t0, p), end), e, alg.identity(), alg))
        return out

    reduce = mode == "reduce"
    carry0 = alg.identity().values() if reduce else list(init)
    nc = len(carry0)
    first_tile = (prefetched if prefetched is not None else
                  load_tile(begin, th.tid) if th.gpu else [])   # type: ignore[arg-type]
    start = list(carry0) + first_tile

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
            if on_total is not None and sw.phase == "up_root" and not reduce:
                on_total(agg_load(total_slot))
        if reduce:
            total = agg_load(pad(ci(bs - 1)))
            return alg.combine(total, alg.pack(carry)).values() + nxt
        total = agg_load(pad(ci(bs - 1)) if kogge_stone else total_slot)
        if state_before is not None:
            carry = state_before(total, carry)

        def prefix(tid: Value) -> Element:
            """The exclusive prefix of thread ``tid``'s aggregate."""
            if not kogge_stone:
                return agg_load(pad(tid))
            first = arith.cmpi(arith.CmpIPredicate.eq, tid, ci(0))
            before = agg_load(pad(arith.subi(arith.maxui(tid, ci(1)), ci(1))))
            return select_element(first, alg.identity(), before, alg)

        # 5. each thread applies its prefix to its own elements; states out via the stage
        def finish(tid: Value) -> None:
            assert outputs is not None or accumulate is not None
            h = alg.apply(prefix(tid), carry)
            els = kept["els"] if th.gpu else own(tid, t0)
            for j in range(E):
                p = add_i(mul_i(tid, ci(E)), ci(j))
                vals = staged(p)
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
                        accumulate(p, h, vals)
                    if last_state is not None:
                        t = add_i(t0, p)

                        def store_last(t: Value = t, h: list[Value] = h) -> None:
                            assert last_state is not None
                            last_state(t, h)
                        if_then(lt_i(t, end), store_last)
                for q, v in enumerate(o):
                    memref.store(v, stage[q], [pad(p)])
        th.each(finish)
        th.barrier()
        if not outs:
            return alg.apply(total, carry) + nxt

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

    if single_tile:
        return one_tile(ci(0), start)[:nc]
    ntiles = ceil_div(arith.subi(end, begin), ci(T))
    out = for_loop(ci(0), ntiles, ci(1), one_tile, start)
    return out if then is not None else out[:nc]
