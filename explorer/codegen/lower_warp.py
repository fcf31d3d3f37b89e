"""Lowering of the ``warp_shuffle`` block tree (``scan.sweep`` phases ``shuffle`` and ``warps``),
and of a Blelloch tree's levels inside a warp (``scan.sweep {via = "shuffle"}``).

On the GPU the threads' aggregates stay in registers: each ``shuffle`` sweep of stride s is one
Kogge-Stone level among the 32 lanes of a warp, lane i taking ``x[i] o x[i - s]`` from lane
``i - s`` by ``gpu.shuffle up`` (no barrier: the lanes of a warp trade values directly). The
``warps`` sweep joins the warps: each warp's last lane leaves the warp's total in shared memory,
one barrier, and every thread composes, in order, the totals of the warps before its own (its
warp's prefix) and of all of them (the block's total). A thread's exclusive prefix is lane
``i - 1``'s inclusive prefix (one more shuffle) after its warp's prefix.

On the host the block's threads are loops, so the same levels run over the aggregates in
shared memory: the ``shuffle`` sweeps as Kogge-Stone levels restricted to each group of 32
positions (from the last position down, like :func:`ks_sweep`), the
``warps`` sweep group after group. The aggregates then hold the block's inclusive prefixes, as
after a Kogge-Stone tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlir.dialects import arith, gpu
from mlir.ir import Value

from explorer.codegen.emit import Algebra, Element, add_i, c32, ci
from explorer.codegen.threads import (
    WARP,
    Threads,
    for_loop,
    if_then,
    pad,
    select_element,
    shuffle_element,
)

Load = Callable[[Value], Element]
Store = Callable[[Value, Element], None]


def _shuffle_up(alg: Algebra, e: Element, by: int) -> Element:
    """Every lane gets lane ``i - by``'s element (lanes below ``by`` get their own back)."""
    return shuffle_element(alg, e, c32(by), gpu.ShuffleMode.UP)


def _at_least(lane: Value, n: int) -> Value:
    return arith.cmpi(arith.CmpIPredicate.uge, lane, ci(n))


def warp_tree(th: Threads, alg: Algebra, sweeps: Sequence[Any], agg: Element,
              load: Load, store: Store) -> tuple[Element, Element]:
    """GPU: the exclusive prefix of this thread's aggregate ``agg`` within the block, and the
    block's total. ``load``/``store`` reach the shared aggregate slots (unpadded index)."""
    assert th.tid is not None
    tid = th.tid
    lane = arith.remui(tid, ci(WARP))
    x = agg
    for sw in sweeps:
        if sw.phase == "shuffle":
            s = int(sw.stride)
            x = select_element(_at_least(lane, s), alg.combine(x, _shuffle_up(alg, x, s)), x,
                               alg)
    excl = select_element(_at_least(lane, 1), _shuffle_up(alg, x, 1), alg.identity(), alg)
    warps = th.bs // WARP
    if warps == 1:
        total = shuffle_element(alg, x, c32(WARP - 1), gpu.ShuffleMode.IDX)
        return excl, total
    warp = arith.divui(tid, ci(WARP))
    last = arith.cmpi(arith.CmpIPredicate.eq, lane, ci(WARP - 1))
    if_then(last, lambda: store(warp, x))
    th.barrier()
    total = load(ci(0))
    before = alg.identity()
    for j in range(1, warps):
        # ``total`` holds warps 0 .. j - 1 here: the prefix of warp j
        before = select_element(arith.cmpi(arith.CmpIPredicate.eq, warp, ci(j)), total, before,
                                alg)
        total = alg.combine(load(ci(j)), total)
    return alg.combine(excl, before), total


def warp_last_lane(th: Threads) -> Value:
    """Whether this thread is its warp's last lane (GPU)."""
    assert th.tid is not None
    return arith.cmpi(arith.CmpIPredicate.eq, arith.remui(th.tid, ci(WARP)), ci(WARP - 1))


def _lanes_at(lane: Value, s: int, k: int) -> Value:
    """Whether ``lane`` is position ``k`` of its group of ``2 s`` lanes."""
    return arith.cmpi(arith.CmpIPredicate.eq, arith.andi(lane, ci(2 * s - 1)), ci(k))


def blelloch_up(th: Threads, alg: Algebra, sweeps: Sequence[Any], x: Element, reduce: bool
                ) -> tuple[Element, Element | None]:
    """GPU: the Blelloch up-sweep's levels inside a warp (``via = "shuffle"``) over this
    thread's aggregate ``x``, lane ``p`` of each pair ``(p - s, p)`` taking ``x[p] o x[p - s]``
    from lane ``p - s`` by ``gpu.shuffle up``. Returns the thread's value and, where the root is
    inside the warp (a block of one warp), the block's total (the root then swapped as
    ``up_root`` does in shared memory, unless ``reduce``)."""
    assert th.tid is not None
    lane = arith.remui(th.tid, ci(WARP))
    total = None
    for sw in sweeps:
        if sw.via != "shuffle" or sw.phase not in ("up", "up_root"):
            continue
        s = int(sw.stride)
        left = _shuffle_up(alg, x, s)
        right_child = _lanes_at(lane, s, 2 * s - 1)
        both = alg.combine(x, left)
        if sw.phase == "up_root":
            total = shuffle_element(alg, both, c32(WARP - 1), gpu.ShuffleMode.IDX)
            if not reduce:
                x = select_element(right_child, left, select_element(
                    _lanes_at(lane, s, s - 1), alg.identity(), x, alg), alg)
                continue
        x = select_element(right_child, both, x, alg)
    return x, total


def blelloch_down(th: Threads, alg: Algebra, sweeps: Sequence[Any], x: Element) -> Element:
    """GPU: the Blelloch down-sweep's levels inside a warp (``via = "shuffle"``): of each pair
    ``(p - s, p)`` lane ``p - s`` takes lane ``p``'s value (``gpu.shuffle down``) and lane ``p``
    composes lane ``p - s``'s after its own (``gpu.shuffle up``). Returns the thread's
    exclusive prefix within the block."""
    assert th.tid is not None
    lane = arith.remui(th.tid, ci(WARP))
    for sw in sweeps:
        if sw.via != "shuffle" or sw.phase != "down":
            continue
        s = int(sw.stride)
        from_right = shuffle_element(alg, x, c32(s), gpu.ShuffleMode.DOWN)
        from_left = _shuffle_up(alg, x, s)
        x = select_element(_lanes_at(lane, s, s - 1), from_right, select_element(
            _lanes_at(lane, s, 2 * s - 1), alg.combine(from_left, x), x, alg), alg)
    return x


def warp_tree_host(th: Threads, alg: Algebra, sweeps: Sequence[Any], load: Load,
                   store: Store) -> None:
    """Host: the same levels over the ``th.bs`` aggregates in shared memory, leaving the
    block's inclusive prefixes there."""
    bs = th.bs
    for sw in sweeps:
        phase, s = sw.phase, int(sw.stride)
        if phase == "shuffle":
            def level(j: Value, _: list[Value], s: int = s) -> list[Value]:
                i = arith.subi(ci(bs - 1), j)

                def step() -> None:
                    store(i, alg.combine(load(i), load(arith.subi(i, ci(s)))))
                if_then(_at_least(arith.remui(i, ci(WARP)), s), step)
                return []
            for_loop(ci(0), ci(bs - s), ci(1), level)
        elif phase == "warps":
            for g in range(WARP, bs, WARP):
                def join(j: Value, _: list[Value], g: int = g) -> list[Value]:
                    i = add_i(ci(g), j)
                    store(i, alg.combine(load(i), load(ci(g - 1))))
                    return []
                for_loop(ci(0), ci(WARP), ci(1), join)


def padded_slots(load_padded: Load, store_padded: Store) -> tuple[Load, Store]:
    """``load``/``store`` by position from those by padded slot."""
    return (lambda i: load_padded(pad(i))), (lambda i, e: store_padded(pad(i), e))


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
