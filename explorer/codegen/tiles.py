"""Tiles between memory and a block: which positions of a tile each thread holds, and their
loads and stores, wide (``vector.load``/``vector.store`` of V elements) where they may be.

The tile moves between memory and the block's stage V elements a thread at once
(``scan.thread {vector_width = V}``): thread ``tid`` holds the positions ``(g * B + tid) * V + j``
(``g < E / V``, ``j < V``) of the tile, loaded as one ``vector.load`` of V elements per stream
and group where every stream's row and the tile start are aligned to V elements and the tile
lies whole in the range, by scalar loads of the same positions otherwise (a check per tile);
the stage is indexed by position, so the rest of the block does not see which thread loaded
what. The outputs leave the stage the same way (``vector.store``), or element by element.
In the plan's direct layout (``scan.thread {layout = "direct"}``) the tile skips the stage:
each thread loads its own E consecutive positions, ``tid * E + k``, in vectors, composes its
elements from those registers and stores its outputs at the same positions from registers
(:func:`direct_write`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from mlir.dialects import arith, memref, vector
from mlir.ir import (
    IntegerAttr,
    IntegerType,
    Value,
    VectorType,
)

from explorer.codegen.emit import add_i, ci, f32, mul_i
from explorer.codegen.gen import Stream
from explorer.codegen.threads import if_else, if_then, min_i, pad


def _wide_index(s: Stream, p: Value, V: int) -> Value:
    """The lowest index of the V positions ``p .. p + V - 1`` of stream ``s`` (backwards in
    time the last position's)."""
    return s.at(p if s.last is None else add_i(p, ci(V - 1)))


def streams_aligned(streams: Sequence[Stream], p: Value, V: int) -> Value:
    """Every stream's positions ``p .. p + V - 1`` start on a V-element vector boundary: the
    index a multiple of V and the buffer aligned to V float32s (a bound for any element size:
    a 16-bit buffer then also starts on a V * 2-byte boundary)."""
    ok = None
    for s in streams:
        if s.offset:    # loaded element by element (wide_load), aligned or not
            continue
        ptr = memref.extract_aligned_pointer_as_index(s.array)
        bits = arith.andi(arith.ori(ptr, mul_i(_wide_index(s, p, V), ci(4))), ci(4 * V - 1))
        one = arith.cmpi(arith.CmpIPredicate.eq, bits, ci(0))
        ok = one if ok is None else arith.andi(ok, one)
    return ok if ok is not None else arith.constant(IntegerType.get_signless(1), 1)


def _alignment(V: int) -> IntegerAttr:
    """The bytes a wide access of V float32s is aligned to (narrowed with the buffer)."""
    return IntegerAttr.get(IntegerType.get_signless(64), 4 * V)


def wide_load(s: Stream, p: Value, V: int) -> Value:
    """The values of stream ``s`` at positions ``p .. p + V - 1``, in position order: one
    vector load (kept a vector until it is stored into the stage: LLVM turns a vector load
    whose users all extract elements back into scalar loads). A stream read at an offset in
    time is not aligned with the tile: its V values are loaded one by one."""
    if s.offset:
        return vector.from_elements(VectorType.get([V], f32()),
                                    [s.load(add_i(p, ci(j))) for j in range(V)])
    with s.loc or nullcontext():
        vec = vector.load(VectorType.get([V], f32()), s.array, [_wide_index(s, p, V)],
                          alignment=_alignment(V))
        return vec if s.last is None else vector.shuffle(vec, vec, list(range(V))[::-1])


def wide_store(s: Stream, p: Value, vals: Sequence[Value]) -> None:
    """Store ``vals`` at positions ``p .. p + V - 1`` of stream ``s``: one vector store (an
    output added into takes them one by one)."""
    if s.accumulate:
        for j, v in enumerate(vals):
            s.store(v, add_i(p, ci(j)))
        return
    V = len(vals)
    ordered = list(vals) if s.last is None else list(vals)[::-1]
    vec = vector.from_elements(VectorType.get([V], f32()), ordered)
    vector.store(vec, s.array, [_wide_index(s, p, V)], alignment=_alignment(V))


def stage_write(outs: Sequence[Stream], group: Callable[[int, int, Value], list[Value]],
                starts: Sequence[Value], t0: Value, end: Value, extent: int | Value,
                V: int) -> None:
    """Store a thread's outputs: ``group(q, g, p)`` gives output ``q`` at the thread's
    ``g``-th group of V positions, which starts at tile position ``starts[g]`` (from the
    block's stage, or the thread's registers); stored in one vector each where the tile's
    positions up to ``extent`` lie whole before ``end`` and every output's row is aligned
    there, element by element (before ``end``) otherwise."""
    def scalar() -> list[Value]:
        for g, p in enumerate(starts):
            for q, s in enumerate(outs):
                vals = group(q, g, p)
                for j, v in enumerate(vals):
                    t = add_i(add_i(t0, p), ci(j))

                    def put(v: Value = v, t: Value = t, s: Stream = s) -> None:
                        s.store(v, t)
                    if_then(arith.cmpi(arith.CmpIPredicate.slt, t, end), put)
        return []
    if V == 1:
        scalar()
        return

    def wide() -> list[Value]:
        for g, p in enumerate(starts):
            for q, s in enumerate(outs):
                wide_store(s, add_i(t0, p), group(q, g, p))
        return []
    span = ci(extent) if isinstance(extent, int) else extent
    whole = arith.cmpi(arith.CmpIPredicate.sle, add_i(t0, span), end)
    if_else(arith.andi(whole, streams_aligned(outs, t0, V)), [], wide, scalar)


def scan_shift(s: Stream) -> int:
    """How many scan positions after its own a stream read at an offset in time reads: the
    offset, negated backwards in time."""
    return s.offset if s.last is None else -s.offset


def edge_slot(s: Stream, tid: Value, t0: Value, last: Value, T: int) -> Value:
    """The tile slot whose value of a moved stream ``s`` thread ``tid`` loads itself, in the
    staged layout (:func:`tile_loads`): with a shift of m positions the slots whose position
    plus m lies outside the tile's loaded positions ``t0 .. last``: the last m valid slots
    (m > 0) or the first -m (m < 0), one a thread (threads past them repeat the last). May be
    negative (a slot before the tile: not stored)."""
    m = scan_shift(s)
    j = arith.minsi(tid, ci(abs(m) - 1)) if abs(m) > 1 else ci(0)
    if m < 0:
        return j
    valid = arith.minsi(ci(T), add_i(arith.subi(last, t0), ci(1)))
    return add_i(arith.subi(valid, ci(m)), j)


def tile_slots(tid: Value, E: int, bs: int, W: int, direct: bool = False) -> list[Value]:
    """The tile positions thread ``tid`` holds, in the order of its values: groups of ``W``
    consecutive positions, ``(g * bs + tid) * W + j`` (the block's accesses coalesced), or with
    ``direct`` its own ``E`` consecutive positions ``tid * E + k``."""
    if direct:
        return [add_i(mul_i(tid, ci(E)), ci(k)) for k in range(E)]
    return [add_i(mul_i(add_i(ci(g * bs), tid), ci(W)), ci(j))
            for g in range(E // W) for j in range(W)]


def tile_loads(streams: Sequence[Stream], tid: Value, t0: Value, last: Value, E: int, bs: int,
               W: int, direct: bool = False, aligned: Value | None = None) -> list[Value]:
    """The values of the tile starting at ``t0`` that thread ``tid`` holds
    (:func:`tile_slots`): per position one per stream (``W = 1``), or per group of W positions
    one ``vector<W x f32>`` per stream, loaded at once where the tile lies whole before
    ``last`` and every stream is aligned to W elements there, element by element otherwise
    (positions past ``last`` read ``last``). ``aligned``: that alignment, when the caller
    knows it for all the tiles it loads (:func:`rows_aligned`), instead of a check here.

    A stream read at an offset in time (``Stream.offset``, shifted m scan positions): in the
    staged layout it is loaded as the tile's own positions (in vectors where it can), and the
    block's stage moves it by m (``lower_block``'s ``put_tile``); the m values of positions
    outside the tile are loaded one a thread at :func:`edge_slot`, after the others in the
    result. In the direct layout its positions are loaded element by element."""
    T = bs * E
    held = tile_slots(tid, E, bs, W, direct)
    moved = [s for s in streams if s.offset]
    if moved and not direct:
        plain = [replace(s, offset=0) if s.offset else s for s in streams]
        vals = tile_loads(plain, tid, t0, last, E, bs, W, direct, aligned)
        edges = []
        for s in moved:
            slot = edge_slot(s, tid, t0, last, T)
            edges.append(s.load(add_i(t0, arith.maxsi(slot, ci(0)))))
        return vals + edges

    def scalar() -> list[Value]:
        vals = []
        for p in held:
            t = min_i(add_i(t0, p), last)
            vals += [s.load(t) for s in streams]
        if W == 1:
            return vals
        n = len(streams)
        return [vector.from_elements(VectorType.get([W], f32()),
                                     [vals[(g * W + j) * n + q] for j in range(W)])
                for g in range(E // W) for q in range(n)]
    if W == 1 or not streams:
        return scalar()

    def wide() -> list[Value]:
        return [wide_load(s, add_i(t0, p), W) for p in held[::W] for s in streams]
    whole = arith.cmpi(arith.CmpIPredicate.sle, add_i(t0, ci(T)), add_i(last, ci(1)))
    ok = arith.andi(whole, streams_aligned(streams, t0, W) if aligned is None else aligned)
    types = [VectorType.get([W], f32())] * (E // W * len(streams))
    return if_else(ok, types, wide, scalar)


def direct_write(outs: Sequence[Stream], vals: Sequence[Sequence[Value]], t0: Value, tid: Value,
                 E: int, V: int, end: Value) -> None:
    """Store thread ``tid``'s outputs at its own E consecutive positions of the tile starting
    at ``t0`` (the ``direct`` layout, :func:`tile_slots`): ``vals[k][q]`` is stream ``q``'s
    value at its ``k``-th position. One ``vector.store`` of V elements per stream and group
    where the thread's positions lie whole before ``end`` and every stream is aligned there;
    element by element otherwise, positions past ``end`` not written (:func:`stage_write`)."""
    base = mul_i(tid, ci(E))

    def group(q: int, g: int, p: Value) -> list[Value]:
        return [vals[g * V + j][q] for j in range(V)]
    stage_write(outs, group, [add_i(base, ci(g * V)) for g in range(E // V)], t0, end,
                add_i(base, ci(E)), V)


def rows_aligned(arrays: Sequence[Value], L: Value, begin: Value, V: int) -> Value:
    """Every tile of V-element groups that starts ``begin`` plus a multiple of V into any row
    of these timed arrays (rows of ``L`` positions, either direction of time) is aligned to V
    float32s: the buffers are, and ``L`` and ``begin`` are multiples of V. One check for all
    the rows and tiles of a loop over lanes, in place of one per lane's tile; a row of a
    length that is not a multiple of V takes the element-by-element loads."""
    ok = None
    for q in (L, begin):
        one = arith.cmpi(arith.CmpIPredicate.eq, arith.remui(q, ci(V)), ci(0))
        ok = one if ok is None else arith.andi(ok, one)
    for a in arrays:
        ptr = memref.extract_aligned_pointer_as_index(a)
        bits = arith.andi(ptr, ci(4 * V - 1))
        ok = arith.andi(ok, arith.cmpi(arith.CmpIPredicate.eq, bits, ci(0)))
    assert ok is not None
    return ok


def held_value(vals: Sequence[Value], k: int, q: int, nstreams: int, W: int) -> Value:
    """Stream ``q``'s value at the thread's ``k``-th held position, from what
    :func:`tile_loads` gave."""
    if W == 1:
        return vals[k * nstreams + q]
    g, j = divmod(k, W)
    return vector.extract(vals[g * nstreams + q], [], [j])


def striped_add(th: Any, outs: Sequence[Stream], vals: Sequence[Sequence[Value]],
                stage: Sequence[Value], t0: Value, E: int, end: Value) -> None:
    """Add a direct tile's outputs (``vals[k][q]``: stream ``q`` at the thread's ``k``-th
    consecutive position) into streams that accumulate, through the stage: each thread puts
    its positions there, then adds positions ``k * block_size + tid``, so that a warp's adds
    (``red.global.add.f32``) touch consecutive words. From registers each warp's add would
    touch 32 words E apart (4 times the sectors at E = 4); many channels add into the same
    rows (a gradient of an input shared by channels), and the L2's atomic units, not the
    bytes, bound such a kernel. The barriers keep the stage from being overwritten before
    every thread has read it."""
    tid, bs = th.tid, th.bs
    base = mul_i(tid, ci(E))
    for q, _ in enumerate(outs):
        for k in range(E):
            memref.store(vals[k][q], stage[q], [pad(add_i(base, ci(k)))])
    th.barrier()
    for k in range(E):
        p = add_i(ci(k * bs), tid)
        t = add_i(t0, p)

        def put(p: Value = p, t: Value = t) -> None:
            for q, s in enumerate(outs):
                s.store(memref.load(stage[q], [pad(p)]), t)
        if_then(arith.cmpi(arith.CmpIPredicate.slt, t, end), put)
    th.barrier()
