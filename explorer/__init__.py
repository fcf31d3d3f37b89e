"""ScanWeaver Explorer: an interactive compiler explorer for affine recurrences.

    import explorer as ex
    rec = ex.Recurrence.parse("h[t] = a[t] * h[t-1] + b[t]")
    c = ex.compile(rec, target="cuda", strategy="blelloch")
    c.stages                      # every stage, in order, ending with "ptx"
    h = c(a=a, b=b)               # CUDA when a GPU is there, else the CPU path
    ex.reference(rec, a=a, b=b)   # float64 ground truth
    ex.Explorer(rec)              # the notebook widget
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from explorer.errors import CompileError, LaunchError, OptionError, RecurrenceError  # noqa: E402
from explorer.frontend import Recurrence  # noqa: E402
from explorer.passes.plans import ScanPlan, make_plan, run_plan  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402

__all__ = [
    "PRESETS", "AffineForm", "CompileError", "Compiled", "Explorer", "LaunchError",
    "OptionError", "Recurrence", "RecurrenceError", "ScanPlan", "__version__", "compile",
    "decompose", "grad", "load", "make_plan", "reference", "run_plan",
]


def compile(rec: Recurrence | str, target: str = "cuda", strategy: str = "blelloch",
            **options: Any) -> Compiled:
    """Compile a recurrence; see :func:`explorer.compiler.compile`."""
    from explorer.compiler import compile as _compile

    return _compile(rec, target=target, strategy=strategy, **options)


def load(path: str | os.PathLike[str]) -> CudaKernel:
    """Load an artifact directory written by ``Compiled.save`` or ``scanweaver compile``.

    Gives the same callable as a compile: ``k = ex.load(path); h = k(a=a, b=b)`` runs the PTX
    on the GPU through CuPy (without CuPy or a CUDA device the call raises
    :class:`LaunchError` saying which).  ``k.artifact`` is the loaded artifact (manifest,
    kernels, PTX text, ``describe()``).  A malformed artifact raises
    ``explorer.runtime.artifact.ArtifactError`` naming the file or field.  Needs numpy alone
    (and cupy to run): never MLIR or sympy.
    """
    from explorer.runtime.cuda import CudaKernel

    return CudaKernel.from_artifact(path)


def reference(rec: Any, /, L: int | None = None, **arrays: Any) -> Any:
    """Float64 sequential ground truth; see :func:`explorer.groundtruth.reference`."""
    from explorer.groundtruth import reference as _reference

    return _reference(rec, L=L, **arrays)


def __getattr__(name: str) -> Any:
    # parts that need sympy, MLIR or ipywidgets load only when used, so that running an
    # artifact needs numpy and cupy alone
    if name in ("AffineForm", "decompose"):
        from explorer.passes import affine

        return getattr(affine, name)
    if name == "grad":
        from explorer.autodiff import grad

        return grad
    if name == "Compiled":
        from explorer.compiler import Compiled

        return Compiled
    if name == "Explorer":
        from explorer.widget import Explorer

        return Explorer
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")


if False:  # pragma: no cover - for type checkers only
    import os

    from explorer.autodiff import grad
    from explorer.compiler import Compiled
    from explorer.passes.affine import AffineForm, decompose
    from explorer.runtime.cuda import CudaKernel
