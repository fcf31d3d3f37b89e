"""An op left unconverted by the lowering is a CompileError naming it, never a crash: MLIR's
translation to LLVM IR, called through the bindings, kills the process (a notebook's kernel)
on an op it has no translation for."""

from __future__ import annotations

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from mlir.ir import Context, Location, Module  # noqa: E402

from explorer.codegen.pipeline import _kernel_llvm_ir  # noqa: E402
from explorer.errors import CompileError  # noqa: E402

LEFT_OVER = """
module attributes {gpu.container_module} {
  gpu.module @k {
    llvm.func @f(%x: i32) -> i32 {
      %y = math.cttz %x : i32
      llvm.return %y : i32
    }
  }
}
"""

CLEAN = LEFT_OVER.replace("%y = math.cttz %x : i32", '%y = "llvm.intr.cttz"(%x) '
                          "<{is_zero_poison = false}> : (i32) -> i32")


def test_an_unconverted_op_in_the_kernel_is_a_compile_error() -> None:
    with Context(), Location.unknown():
        module = Module.parse(LEFT_OVER)
        with pytest.raises(CompileError, match="math.cttz") as err:
            _kernel_llvm_ir(module, LEFT_OVER)
        assert err.value.pass_name == "reconcile-unrealized-casts (gpu.module)"


def test_a_converted_kernel_translates() -> None:
    with Context(), Location.unknown():
        module = Module.parse(CLEAN)
        assert "llvm.cttz.i32" in _kernel_llvm_ir(module, CLEAN)
