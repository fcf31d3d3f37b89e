"""The passes of the pipeline, in order, as :mod:`explorer.codegen.pipeline` runs them: ours
(written in Python, :mod:`explorer.passes`), then upstream MLIR's for the target: for ``cuda``
those of ``gpu-lower-to-nvvm-pipeline`` spelled out one by one, for ``cpu`` the lowering to the
LLVM dialect for the host."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from explorer.codegen.options import Options


@dataclass(frozen=True)
class Step:
    """A pass as shown to people (``name``) and as run: an upstream ``pipeline``, or one of our
    passes written in Python (``run(op, pass_)``, added with ``PassManager.add``).

    ``rewrites``: an upstream pass that changed the module in every compile we know of (each
    preset, strategy and target). The module after it is printed without asking MLIR whether it
    changed: MLIR's fingerprints of the module before and after a pass cost about what printing
    it does. Where such a pass changes nothing after all, the text says so (the same record)."""

    name: str
    pipeline: str
    run: Callable[[Any, Any], None] | None = field(default=None, compare=False)
    rewrites: bool = False


def scan_steps(state: Any) -> list[Step]:
    """Our passes, in order: decompose the recurrence, choose the plan, lower the plan, mark
    the floating-point freedoms of its arithmetic."""
    from explorer.passes import backward, decompose, fastmath, lower, plan

    if state.options.backward:   # the fused backward: its own plan and lowering
        return [Step(decompose.NAME, top(decompose.NAME), decompose.make(state)),
                Step(plan.NAME, top(plan.NAME), backward.make_plan(state)),
                Step(lower.NAME, top(lower.NAME), backward.make_lower(state)),
                Step(fastmath.NAME, top(fastmath.NAME), fastmath.make(state))]
    return [Step(m.NAME, top(m.NAME), m.make(state))
            for m in (decompose, plan, lower, fastmath)]


def top(p: str) -> str:
    """A pass pipeline on the top-level module."""
    return f"builtin.module({p})"


def in_gpu(p: str) -> str:
    """A pass pipeline nested on the kernels' ``gpu.module``."""
    return f"builtin.module(gpu.module({p}))"


def _cleanup() -> list[Step]:
    """Fold constants and drop unused values first, so later passes show only their own work."""
    return [Step("canonicalize (input)", top("canonicalize"), rewrites=True),
            Step("cse (input)", top("cse"), rewrites=True)]


def cuda_steps(options: Options) -> list[Step]:
    """The passes of ``gpu-lower-to-nvvm-pipeline`` for ``options``, in order."""
    from explorer.codegen.ptxas import find_libdevice

    libdevice = find_libdevice()
    link = f" l={libdevice}" if libdevice else ""
    target = (f"nvvm-attach-target{{chip={options.chip} features={options.ptx_features} "
              f"O={options.opt_level}{link}}}")
    return [
        *_cleanup(),
        Step("convert-nvgpu-to-nvvm", top("convert-nvgpu-to-nvvm")),
        Step("gpu-kernel-outlining", top("gpu-kernel-outlining")),
        Step("convert-vector-to-scf", top("convert-vector-to-scf")),
        Step("convert-scf-to-cf", top("convert-scf-to-cf"), rewrites=True),
        Step("convert-nvvm-to-llvm", top("convert-nvvm-to-llvm")),
        Step("convert-func-to-llvm", top("convert-func-to-llvm"), rewrites=True),
        Step("expand-strided-metadata", top("expand-strided-metadata"), rewrites=True),
        Step("nvvm-attach-target", top(target), rewrites=True),
        Step("lower-affine", top("lower-affine")),
        Step("convert-arith-to-llvm", top("convert-arith-to-llvm"), rewrites=True),
        Step("convert-index-to-llvm", top("convert-index-to-llvm{index-bitwidth=64}")),
        Step("canonicalize", top("canonicalize"), rewrites=True),
        Step("cse", top("cse")),
        Step("convert-gpu-to-nvvm",
             in_gpu("convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1 index-bitwidth=64}"),
             rewrites=True),
        Step("canonicalize (gpu.module)", in_gpu("canonicalize"), rewrites=True),
        Step("cse (gpu.module)", in_gpu("cse"), rewrites=True),
        Step("reconcile-unrealized-casts (gpu.module)", in_gpu("reconcile-unrealized-casts")),
        Step("gpu-to-llvm", top("gpu-to-llvm{use-bare-pointers-for-kernels=1}"), rewrites=True),
        # .file/.loc directives from the ops' locations (the PTX's .loc lines name recurrence
        # columns); DebugDirectivesOnly, not LineTablesOnly: the latter marks the PTX
        # `.target sm_90, debug`, which ptxas compiles unoptimised (255 registers and spills
        # where 114 and none without)
        Step("ensure-debug-info-scope-on-llvm-func",
             top("ensure-debug-info-scope-on-llvm-func{emission-kind=DebugDirectivesOnly}"),
             rewrites=True),
        Step("gpu-module-to-binary", top("gpu-module-to-binary{format=isa}"), rewrites=True),
        Step("convert-math-to-llvm", top("convert-math-to-llvm")),
        Step("canonicalize (host)", top("canonicalize"), rewrites=True),
        Step("cse (host)", top("cse")),
        Step("reconcile-unrealized-casts", top("reconcile-unrealized-casts")),
    ]


def cpu_steps(options: Options) -> list[Step]:
    """Host lowering: scf/memref/arith/math/func to the LLVM dialect. bfloat16 conversions are
    expanded into integer arithmetic first: LLVM lowers ``fptrunc`` to bfloat on x86 to a call of
    ``__truncsfbf2``, which the JIT does not find."""
    bf16 = "bfloat16" in (options.dtype, options.output_dtype)
    expand = [Step("arith-expand (bf16)", top("arith-expand{include-bf16=true}"))] * bf16
    return [
        *_cleanup(), *expand,
        Step("convert-scf-to-cf", top("convert-scf-to-cf"), rewrites=True),
        Step("expand-strided-metadata", top("expand-strided-metadata")),
        Step("lower-affine", top("lower-affine")),
        Step("convert-math-to-llvm", top("convert-math-to-llvm")),
        Step("convert-math-to-libm", top("convert-math-to-libm")),
        # the wide tile accesses of tree plans (vector.load / vector.store)
        Step("convert-vector-to-llvm", top("convert-vector-to-llvm")),
        Step("finalize-memref-to-llvm", top("finalize-memref-to-llvm"), rewrites=True),
        Step("convert-arith-to-llvm", top("convert-arith-to-llvm"), rewrites=True),
        Step("convert-index-to-llvm", top("convert-index-to-llvm"), rewrites=True),
        Step("convert-cf-to-llvm", top("convert-cf-to-llvm"), rewrites=True),
        Step("convert-func-to-llvm", top("convert-func-to-llvm"), rewrites=True),
        Step("canonicalize", top("canonicalize"), rewrites=True),
        Step("cse", top("cse"), rewrites=True),
        Step("reconcile-unrealized-casts", top("reconcile-unrealized-casts")),
    ]
