"""The look-back walk on its own, on the host: given what the tiles before ``k`` have published
(the flags, their aggregates, the states after some of them), it composes the aggregates of the
tiles nearer than the nearest published state, in order, and applies them to that state. The
kernels run it with one lane on the CPU (where the tile before is always done, so the
aggregates are never needed); here the flags are chosen, so windows of aggregates are composed
and crossed. What the walk must not read is NaN: reading it would show in the answer."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import sympy  # noqa: E402
from mlir.dialects import arith, func, memref  # noqa: E402
from mlir.execution_engine import ExecutionEngine  # noqa: E402
from mlir.ir import (  # noqa: E402
    Context,
    F32Type,
    FunctionType,
    IndexType,
    InsertionPoint,
    IntegerType,
    Location,
    MemRefType,
    Module,
    ShapedType,
    UnitAttr,
)
from mlir.passmanager import PassManager  # noqa: E402
from mlir.runtime import get_ranked_memref_descriptor  # noqa: E402

from explorer.codegen.emit import Algebra, ci  # noqa: E402
from explorer.codegen.lower_lookback import (  # noqa: E402
    AGGREGATE,
    PREFIX,
    SLOT_WORDS,
    Memory,
    _walk,
    _walk_packed,
)

LOWER = ("builtin.module(convert-scf-to-cf, convert-arith-to-llvm, finalize-memref-to-llvm, "
         "convert-func-to-llvm, convert-cf-to-llvm, reconcile-unrealized-casts)")


def _walker(tiles_per_lane: int, walk: Any = None) -> tuple[Context, ExecutionEngine]:
    """``walk(flags, aggs, carries, h0, out, first_tile, k)``: out[0] = the state before k."""
    ctx = Context()
    with ctx, Location.unknown():
        module = Module.create()
        flat = MemRefType.get([ShapedType.get_dynamic_size()], F32Type.get())
        i64 = IntegerType.get_signless(64)
        with InsertionPoint(module.body):
            fn = func.FuncOp("walk", FunctionType.get([flat] * 5 + [i64, i64], []))
            fn.attributes["llvm.emit_c_interface"] = UnitAttr.get()
            block = fn.add_entry_block()
            with InsertionPoint(block):
                flags, aggs, carries, h0buf, out, first, k = block.arguments
                alg = Algebra(sympy.Matrix([[sympy.Symbol("a")]]))
                gen = SimpleNamespace(alg=alg,
                                      options=SimpleNamespace(lookback_tiles=tiles_per_lane))
                idx = IndexType.get()
                h0 = [memref.load(h0buf, [ci(0)])]
                state = (walk or _walk)(gen, Memory(False), arith.constant(i64, 0), 1,  # type: ignore[arg-type]
                              arith.index_cast(idx, first), arith.index_cast(idx, k), h0,
                              flags, aggs, carries)
                memref.store(state[0], out, [ci(0)])
                func.return_([])
        PassManager.parse(LOWER).run(module.operation)
        return ctx, ExecutionEngine(module, opt_level=2)


def _call(engine: ExecutionEngine, flags, aggs, carries, h0, first: int, k: int) -> float:
    out = np.zeros(1, dtype=np.float32)
    keep = [np.ascontiguousarray(x, dtype=np.float32) for x in (flags, aggs, carries, h0)]
    keep.append(out)
    descs = [get_ranked_memref_descriptor(x) for x in keep]
    args = [ctypes.pointer(ctypes.pointer(d)) for d in descs]
    args += [ctypes.pointer(ctypes.c_int64(first)), ctypes.pointer(ctypes.c_int64(k))]
    engine.invoke("walk", *args)
    return float(out[0])


@pytest.mark.parametrize("tiles_per_lane", [1, 4, 8])
@pytest.mark.parametrize("seed", range(6))
def test_the_walk_composes_aggregates_up_to_the_nearest_state(tiles_per_lane, seed):
    rng = np.random.default_rng(seed)
    _ctx, engine = _walker(tiles_per_lane)
    first = 3                                # the sequence's tile 0 sits at slot 3
    tiles = 40
    a = rng.uniform(0.8, 1.1, tiles)
    b = rng.normal(size=tiles)
    h0 = np.array([rng.normal()])
    states = np.empty(tiles)
    h = h0[0]
    for j in range(tiles):
        h = a[j] * h + b[j]
        states[j] = h
    slots = first + tiles
    for k in [0, 1, 2, 5, 17, 39]:
        # some tiles before k have published their state, the others their aggregate only
        published = rng.random(k) < (0.15 if seed % 2 else 0.5)
        flags = np.full(SLOT_WORDS * slots, np.nan)
        aggs = np.full(2 * slots, np.nan)
        carries = np.full(slots, np.nan)
        for j in range(k):
            s = first + j
            if published[j]:
                flags[SLOT_WORDS * s], carries[s] = PREFIX, states[j]
            else:
                flags[SLOT_WORDS * s] = AGGREGATE
                # the element (a, b) as the algebra stores it: A's entry, then b
                aggs[2 * s], aggs[2 * s + 1] = a[j], b[j]
        want = h0[0] if k == 0 else states[k - 1]
        got = _call(engine, flags, aggs, carries, h0, first, k)
        assert np.isfinite(got), (k, published)
        assert abs(got - want) <= 1e-4 * (1 + abs(want)), (k, got, want, published)


def _encoded(x: float) -> np.float32:
    """A float as the packed protocol publishes it (bits inverted), as a float32 word."""
    bits = np.array([x], dtype=np.float32).view(np.uint32)
    return (~bits).view(np.float32)[0]


@pytest.mark.parametrize("tiles_per_lane", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_the_packed_walk_reads_what_the_words_announce(tiles_per_lane, seed):
    """The packed protocol's walk (the scalar affine scan): a tile's slot holds its encoded
    aggregate in words 0-1 and its encoded state in word 2, zero until published. Tiles after
    the nearest published state carry encoded NaNs that the walk must not use."""
    rng = np.random.default_rng(seed)
    _ctx, engine = _walker(tiles_per_lane, _walk_packed)
    first, tiles = 2, 40
    a = rng.uniform(0.8, 1.1, tiles)
    b = rng.normal(size=tiles)
    h0 = np.array([rng.normal()])
    states = np.empty(tiles)
    h = h0[0]
    for j in range(tiles):
        h = a[j] * h + b[j]
        states[j] = h
    slots = first + tiles
    nan = _encoded(float("nan"))
    for k in [0, 1, 3, 9, 33, 39]:
        published = rng.random(k) < (0.15 if seed % 2 else 0.5)
        words = np.zeros(SLOT_WORDS * slots, dtype=np.float32)
        nearest = max((j for j in range(k) if published[j]), default=-1)
        for j in range(k):
            w = SLOT_WORDS * (first + j)
            if published[j]:
                words[w + 2] = _encoded(states[j])
                words[w], words[w + 1] = nan, nan     # the state comes first
            elif j < nearest:
                words[w], words[w + 1] = nan, nan     # behind the nearest state: unused
            else:
                words[w], words[w + 1] = _encoded(a[j]), _encoded(b[j])
        want = h0[0] if k == 0 else states[k - 1]
        unused = np.full(2 * slots, np.nan)
        got = _call(engine, words, unused, unused[:slots], h0, first, k)
        assert np.isfinite(got), (k, published)
        assert abs(got - want) <= 1e-4 * (1 + abs(want)), (k, got, want, published)


def test_encoding_never_reads_as_unpublished():
    """The kernel's encode: every float, the NaN whose inverted bits are zero included, becomes
    a non-zero word, and decodes back to itself (NaNs to a NaN)."""
    from explorer.codegen.lower_lookback import decode, encode

    ctx = Context()
    with ctx, Location.unknown():
        module = Module.create()
        flat = MemRefType.get([ShapedType.get_dynamic_size()], F32Type.get())
        with InsertionPoint(module.body):
            fn = func.FuncOp("code", FunctionType.get([flat] * 3, []))
            fn.attributes["llvm.emit_c_interface"] = UnitAttr.get()
            block = fn.add_entry_block()
            with InsertionPoint(block):
                xs, words, back = block.arguments
                for i in range(8):
                    word = encode(memref.load(xs, [ci(i)]))
                    memref.store(arith.bitcast(F32Type.get(), word), words, [ci(i)])
                    memref.store(decode(word), back, [ci(i)])
                func.return_([])
        PassManager.parse(LOWER).run(module.operation)
        engine = ExecutionEngine(module, opt_level=2)
    bits = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF,
                     0x3F800000, 0x00000001], dtype=np.uint32)
    xs = bits.view(np.float32).copy()
    words = np.zeros(8, dtype=np.float32)
    back = np.zeros(8, dtype=np.float32)
    keep = [xs, words, back]
    engine.invoke("code", *[ctypes.pointer(ctypes.pointer(get_ranked_memref_descriptor(x)))
                            for x in keep])
    assert np.all(words.view(np.uint32) != 0), words.view(np.uint32)
    nan = np.isnan(xs)
    assert np.all(np.isnan(back[nan]))
    assert np.array_equal(back[~nan].view(np.uint32), xs[~nan].view(np.uint32))
