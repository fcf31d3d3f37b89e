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


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        mark(module_op, state.options.fast_math)
    return run
