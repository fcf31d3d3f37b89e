"""Code generation: AffineForm -> MLIR (gpu dialect or host) -> pass pipeline -> LLVM IR, PTX."""

from explorer.codegen.kernels import BuiltModule, KernelSpec, build_module, kernel_args
from explorer.codegen.options import Options, validate
from explorer.codegen.pipeline import Lowered, PassRecord, lower

__all__ = ["BuiltModule", "KernelSpec", "Lowered", "Options", "PassRecord", "build_module",
           "kernel_args", "lower", "validate"]
