"""How the threads of a block are realised, and structured control flow.

:class:`Threads` runs the same phase code as one GPU thread (``gpu.thread_id``, barriers) or as a
host loop over the threads of the block (the CPU target: a barrier is the end of the loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir.dialects import arith, gpu, nvvm, scf
from mlir.ir import (
    InsertionPoint,
    MemRefType,
    ShapedType,
    Type,
    Value,
)

from explorer.codegen.emit import (
    Algebra,
    Element,
    add_i,
    c32,
    ci,
    f32,
    lt_i,
)

WARP = 32


Body = Callable[[Value, list[Value]], Sequence[Value]]


def for_loop(lb: Value, ub: Value, step: Value, body: Body,
             iters: Sequence[Value] = ()) -> list[Value]:
    loop = scf.ForOp(lb, ub, step, list(iters))
    with InsertionPoint(loop.body):
        out = body(loop.induction_variable, list(loop.inner_iter_args))
        scf.yield_(list(out))
    return list(loop.results)


def if_then(cond: Value, then: Callable[[], None]) -> None:
    op = scf.IfOp(cond)
    with InsertionPoint(op.then_block):
        then()
        scf.yield_([])


def if_else(cond: Value, types: Sequence[Type], then: Callable[[], Sequence[Value]],
            other: Callable[[], Sequence[Value]]) -> list[Value]:
    op = scf.IfOp(cond, list(types), has_else=True)
    with InsertionPoint(op.then_block):
        scf.yield_(list(then()))
    with InsertionPoint(op.else_block):
        scf.yield_(list(other()))
    return list(op.results)


def flat_memref() -> MemRefType:
    return MemRefType.get([ShapedType.get_dynamic_size()], f32())


def min_i(a: Value, b: Value) -> Value:
    return arith.minui(a, b)


def pad(i: Value) -> Value:
    """Position ``i`` of a padded workgroup array: one spare slot after every 32 entries."""
    return add_i(i, arith.shrui(i, ci(5)))


def padded(n: int) -> int:
    return n + n // WARP


class Threads:
    """How the threads of a block are realised: ``gpu`` (thread id, barriers) or host loops."""

    def __init__(self, gpu_target: bool, block_size: int, tid: Value | None = None) -> None:
        self.gpu = gpu_target
        self.bs = block_size
        self.tid = tid

    def each(self, fn: Callable[[Value], None], count: int | None = None) -> None:
        """Run ``fn(tid)`` for the threads ``tid < count`` (all threads by default)."""
        n = self.bs if count is None else count
        if self.gpu:
            assert self.tid is not None
            tid = self.tid
            if n >= self.bs:
                fn(tid)
            else:
                if_then(lt_i(tid, ci(n)), lambda: fn(tid))
            return

        def body(t: Value, _: list[Value]) -> list[Value]:
            fn(t)
            return []
        for_loop(ci(0), ci(n), ci(1), body)

    def barrier(self) -> None:
        if self.gpu:
            gpu.barrier()

    def warp_sync(self) -> None:
        if self.gpu:
            nvvm.bar_warp_sync(c32(-1))


def shuffle_element(alg: Algebra, e: Element, offset: Value, mode: gpu.ShuffleMode) -> Element:
    """The element another lane of the warp holds (``gpu.shuffle`` of each of its values, all
    32 lanes taking part): lane ``i - offset`` for ``UP``, lane ``i ^ offset`` for ``XOR``,
    lane ``offset`` for ``IDX``."""
    return alg.pack([gpu.shuffle(v, offset, c32(WARP), mode)[0] for v in e.values()])


def select_element(cond: Value, a: Element, b: Element, alg: Algebra) -> Element:
    return alg.pack([arith.select(cond, x, y) for x, y in zip(a.values(), b.values(),
                                                                  strict=True)])
