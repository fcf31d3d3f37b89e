"""Pass ``scan-fastmath``: the floating-point freedoms the kernels' arithmetic may take (option
``fast_math``), written on the ops as MLIR ``fastmath`` flags, so the IR shows them and the LLVM
backend reads them.

- ``"contract"`` (the default, as ``nvcc`` compiles CUDA C by default: ``-fmad=true``): every
  float add, subtract and multiply is marked ``contract``, so a multiply feeding an add becomes
  one fused multiply-add (``fma.rn.f32``: one rounding instead of two, one instruction instead
  of two). The combine of an affine element, ``(a2 a1, a2 b1 + b2)``, and its application
  ``a h + b`` are such pairs.
- ``"fast"`` (as ``nvcc --use_fast_math``, which mamba-ssm's kernels are built with): also
  ``afn`` on the float arithmetic and the ``math`` ops, so ``math.exp`` lowers to
  ``__nv_fast_expf`` (one ``ex2.approx`` after a multiply, about 2 ulp) instead of the
  correctly rounded ``__nv_expf`` (about ten instructions), and divisions to approximate ones.
  On the GPU ``fast`` also writes the exponential itself, as ``nvcc --use_fast_math`` compiles
  ``expf``: ``math.exp(x)`` becomes ``ex2.approx.ftz(x * log2(e))`` (the intrinsic
  ``llvm.nvvm.ex2.approx.ftz.f``: one ``MUFU.EX2``, denormal inputs and results flushed to zero;
  libdevice's ``__nv_fast_expf`` without the flush wraps it in a rescaling, three more
  instructions). Where ``x = u * v`` and ``v`` is computed outside the innermost region of the
  exponential (a lane's ``A`` in a loop over positions), the ``log2(e)`` factor goes into ``v``
  once, where ``v`` is made: ``ex2(u * (v * log2(e)))``, one multiply less per element.
- ``"none"``: every operation rounded on its own (IEEE float32, as written).

The flags change no value by more than float32's rounding of each step (``contract``) or the
approximate functions' documented error (``fast``); the results are checked against the float64
reference at the same tolerances either way.
"""

from __future__ import annotations

from typing import Any

from explorer.passes.state import ScanState

NAME = "scan-fastmath"

#: float arithmetic that a multiply-add contraction may fuse
CONTRACTIBLE = frozenset({"arith.addf", "arith.subf", "arith.mulf", "arith.negf"})
#: float ops that may also take approximate functions (``fast``)
APPROXIMABLE = CONTRACTIBLE | {"arith.divf"}


def flags_for(mode: str) -> str | None:
    """The ``#arith.fastmath`` flags of a ``fast_math`` mode (None: no flags)."""
    return {"none": None, "contract": "contract", "fast": "contract,afn"}[mode]


def mark(module_op: Any, mode: str) -> int:
    """Write the flags of ``mode`` on the ops of ``module_op``; the number of ops marked."""
    from mlir.ir import Attribute, WalkResult

    flags = flags_for(mode)
    if flags is None:
        return 0
    attr = Attribute.parse(f"#arith.fastmath<{flags}>")
    fast = mode == "fast"
    marked = 0

    def visit(op: Any) -> Any:
        nonlocal marked
        name = op.name
        if name in CONTRACTIBLE or (fast and (name in APPROXIMABLE
                                              or name.startswith("math."))):
            op.attributes["fastmath"] = attr
            marked += 1
        return WalkResult.ADVANCE
    module_op.walk(visit)
    return marked


#: the intrinsic a fast exponential on the GPU becomes (PTX ``ex2.approx.ftz.f32``)
EX2_FTZ = "llvm.nvvm.ex2.approx.ftz.f"
#: log2(e): exp(x) = 2^(x log2(e))
LOG2E = 1.4426950408889634


def _depth(value: Any) -> int:
    """How many ops enclose the place where ``value`` is defined (the block of its op, or of
    the block argument)."""
    from mlir.ir import BlockArgument

    op = _op(value.owner.owner if isinstance(value, BlockArgument) else value.owner)
    depth = 0
    while op is not None:
        depth += 1
        op = _op(op.parent)
    return depth


def _op(op: Any) -> Any:
    """The ``Operation`` of an op view (None stays None)."""
    return getattr(op, "operation", op)


def fast_exponentials(module_op: Any) -> int:
    """``fast`` on the GPU: every f32 ``math.exp`` in a ``gpu.func`` becomes
    ``ex2.approx.ftz`` of its argument times log2(e), the factor folded into the outer operand
    of a product where there is one (see the module); the number rewritten."""
    from mlir.dialects import arith, llvm
    from mlir.ir import (
        Attribute,
        BlockArgument,
        F32Type,
        FloatAttr,
        InsertionPoint,
        WalkResult,
    )

    found: list[Any] = []

    def visit(op: Any) -> Any:
        if op.name == "math.exp" and isinstance(op.operands[0].type, F32Type):
            parent = _op(op.parent)
            while parent is not None and parent.name != "gpu.func":
                parent = _op(parent.parent)
            if parent is not None:
                found.append(op)
        return WalkResult.ADVANCE
    module_op.walk(visit)
    if not found:
        return 0
    flags = Attribute.parse("#arith.fastmath<contract,afn>")
    f32 = F32Type.get()
    scaled: dict[Any, Any] = {}   # an outer operand -> itself times log2(e), made once

    def times_log2e(v: Any) -> Any:
        where = v.owner.owner if isinstance(v, BlockArgument) else v.owner
        with _op(where).location:
            c = arith.constant(f32, FloatAttr.get(f32, LOG2E))
            return arith.mulf(v, c, fastmath=flags)

    for op in found:
        x = op.operands[0]
        inner = _depth(op.result)
        arg = None
        producer = None if isinstance(x, BlockArgument) else _op(x.owner)
        if producer is not None and producer.name == "arith.mulf":
            u, v = producer.operands[0], producer.operands[1]
            outer, other = (u, v) if _depth(u) <= _depth(v) else (v, u)
            if _depth(outer) < inner:
                if outer not in scaled:
                    where = (InsertionPoint.at_block_begin(outer.owner)
                             if isinstance(outer, BlockArgument)
                             else InsertionPoint.after(_op(outer.owner)))
                    with where:
                        scaled[outer] = times_log2e(outer)
                with InsertionPoint(op), op.location:
                    arg = arith.mulf(other, scaled[outer], fastmath=flags)
        with InsertionPoint(op), op.location:
            if arg is None:
                c = arith.constant(f32, FloatAttr.get(f32, LOG2E))
                arg = arith.mulf(x, c, fastmath=flags)
            ex2 = llvm.call_intrinsic(f32, EX2_FTZ, [arg], [], [])
        op.result.replace_all_uses_with(ex2)
        op.erase()
    return len(found)


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        mark(module_op, state.options.fast_math)
        if state.options.fast_math == "fast":
            fast_exponentials(module_op)
    return run
