"""Stage 5, the pass pipeline: MLIR module text -> lowered module, LLVM IR and PTX.

The pipeline runs one pass at a time, each through its own ``PassManager``, and records the IR
after every pass (:class:`PassRecord`). Nothing is printed by MLIR: the IR is taken with
``str(module)`` and the diagnostics go to a handler attached to the context, so file
descriptor 2 of the process (a notebook kernel's) is never written to.

For ``cuda`` the passes are those of ``gpu-lower-to-nvvm-pipeline`` spelled out one by one
(with ``kernel-bare-ptr-calling-convention`` and the chip of the options); the PTX is the
object of the resulting ``gpu.binary``. For ``cpu`` the module is lowered to the LLVM dialect
for the host and translated to LLVM IR; :mod:`explorer.runtime.cpu` runs it.

A failing pass raises :class:`explorer.errors.CompileError` carrying the pass, the
diagnostics, the IR before the pass (also written to a file) and the ``mlir-opt`` command that
replays it.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlir.dialects import gpu, llvm
from mlir.ir import Context, Location, Module
from mlir.passmanager import PassManager

from explorer.codegen.contract import BuiltModule
from explorer.codegen.locations import split_locations
from explorer.codegen.options import Options
from explorer.codegen.records import PassRecord
from explorer.errors import CompileError, OptionError, Reproducer


@dataclass
class Lowered:
    """Everything the pipeline produced."""

    passes: list[PassRecord]
    llvm_ir: str
    ptx: str | None
    final_module: str
    seconds: float = 0.0
    kernel_names: list[str] = field(default_factory=list)
    llvm_seconds: float = 0.0   # translating the LLVM dialect to LLVM IR


@dataclass(frozen=True)
class Step:
    """A pass as shown to people (``name``) and as run: an upstream ``pipeline``, or one of our
    passes written in Python (``run(op, pass_)``, added with ``PassManager.add``)."""

    name: str
    pipeline: str
    run: Callable[[Any, Any], None] | None = field(default=None, compare=False)


def scan_steps(state: Any) -> list[Step]:
    """Our passes, in order: decompose the recurrence, choose the plan, lower the plan."""
    from explorer.passes import decompose, lower, plan

    return [Step(m.NAME, _top(m.NAME), m.make(state)) for m in (decompose, plan, lower)]


def _top(p: str) -> str:
    return f"builtin.module({p})"


def _gpu(p: str) -> str:
    return f"builtin.module(gpu.module({p}))"


def _cleanup() -> list[Step]:
    """Fold constants and drop unused values first, so later passes show only their own work."""
    return [Step("canonicalize (input)", _top("canonicalize")), Step("cse (input)", _top("cse"))]


def cuda_steps(options: Options) -> list[Step]:
    """The passes of ``gpu-lower-to-nvvm-pipeline`` for ``options``, in order."""
    from explorer.codegen.ptxas import find_libdevice

    libdevice = find_libdevice()
    link = f" l={libdevice}" if libdevice else ""
    target = (f"nvvm-attach-target{{chip={options.chip} features={options.ptx_features} "
              f"O={options.opt_level}{link}}}")
    return [
        *_cleanup(),
        Step("convert-nvgpu-to-nvvm", _top("convert-nvgpu-to-nvvm")),
        Step("gpu-kernel-outlining", _top("gpu-kernel-outlining")),
        Step("convert-vector-to-scf", _top("convert-vector-to-scf")),
        Step("convert-scf-to-cf", _top("convert-scf-to-cf")),
        Step("convert-nvvm-to-llvm", _top("convert-nvvm-to-llvm")),
        Step("convert-func-to-llvm", _top("convert-func-to-llvm")),
        Step("expand-strided-metadata", _top("expand-strided-metadata")),
        Step("nvvm-attach-target", _top(target)),
        Step("lower-affine", _top("lower-affine")),
        Step("convert-arith-to-llvm", _top("convert-arith-to-llvm")),
        Step("convert-index-to-llvm", _top("convert-index-to-llvm{index-bitwidth=64}")),
        Step("canonicalize", _top("canonicalize")),
        Step("cse", _top("cse")),
        Step("convert-gpu-to-nvvm",
             _gpu("convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1 index-bitwidth=64}")),
        Step("canonicalize (gpu.module)", _gpu("canonicalize")),
        Step("cse (gpu.module)", _gpu("cse")),
        Step("reconcile-unrealized-casts (gpu.module)", _gpu("reconcile-unrealized-casts")),
        Step("gpu-to-llvm", _top("gpu-to-llvm{use-bare-pointers-for-kernels=1}")),
        # .file/.loc directives from the ops' locations (the PTX's .loc lines name recurrence
        # columns); DebugDirectivesOnly, not LineTablesOnly: the latter marks the PTX
        # `.target sm_90, debug`, which ptxas compiles unoptimised (255 registers and spills
        # where 114 and none without)
        Step("ensure-debug-info-scope-on-llvm-func",
             _top("ensure-debug-info-scope-on-llvm-func{emission-kind=DebugDirectivesOnly}")),
        Step("gpu-module-to-binary", _top("gpu-module-to-binary{format=isa}")),
        Step("convert-math-to-llvm", _top("convert-math-to-llvm")),
        Step("canonicalize (host)", _top("canonicalize")),
        Step("cse (host)", _top("cse")),
        Step("reconcile-unrealized-casts", _top("reconcile-unrealized-casts")),
    ]


def cpu_steps(options: Options) -> list[Step]:
    """Host lowering: scf/memref/arith/math/func to the LLVM dialect."""
    del options
    return [
        *_cleanup(),
        Step("convert-scf-to-cf", _top("convert-scf-to-cf")),
        Step("expand-strided-metadata", _top("expand-strided-metadata")),
        Step("lower-affine", _top("lower-affine")),
        Step("convert-math-to-llvm", _top("convert-math-to-llvm")),
        Step("convert-math-to-libm", _top("convert-math-to-libm")),
        Step("finalize-memref-to-llvm", _top("finalize-memref-to-llvm")),
        Step("convert-arith-to-llvm", _top("convert-arith-to-llvm")),
        Step("convert-index-to-llvm", _top("convert-index-to-llvm")),
        Step("convert-cf-to-llvm", _top("convert-cf-to-llvm")),
        Step("convert-func-to-llvm", _top("convert-func-to-llvm")),
        Step("canonicalize", _top("canonicalize")),
        Step("cse", _top("cse")),
        Step("reconcile-unrealized-casts", _top("reconcile-unrealized-casts")),
    ]


# the pass after which the kernel's LLVM dialect is complete (translated to LLVM IR)
_KERNEL_LLVM_AFTER = "reconcile-unrealized-casts (gpu.module)"


def _reproducer(ir: str, step: Step, options: Options | None = None) -> Reproducer:
    fd, path = tempfile.mkstemp(prefix="scanweaver-", suffix=".mlir")
    with os.fdopen(fd, "w") as f:
        f.write(ir)
    if step.run is not None and options is not None:
        # our passes are Python: replayed by explorer.passes on the same IR and options
        opts = json.dumps(options.as_dict(), sort_keys=True)
        command = (f"python -m explorer.passes {shlex.quote(path)} --pass {step.name} "
                   f"--options {shlex.quote(opts)}")
    else:
        command = f"mlir-opt {shlex.quote(path)} --pass-pipeline={shlex.quote(step.pipeline)}"
    return Reproducer(path, command)


def _fail(message: str, step: Step, diagnostics: str, ir_before: str,
          options: Options | None = None) -> CompileError:
    return CompileError(message, pass_name=step.name, diagnostics=diagnostics,
                        ir_before=ir_before, reproducer=_reproducer(ir_before, step, options))


def _kernel_llvm_ir(module: Module) -> str:
    """LLVM IR of the device code: the gpu.module's LLVM dialect, translated."""
    parts = []
    for op in module.body.operations:
        if op.operation.name != "gpu.module":
            continue
        inner = Module.create()
        for nested in op.regions[0].blocks[0].operations:
            inner.body.append(nested.operation.clone())
        parts.append(str(llvm.translate_module_to_llvmir(inner.operation)))
    return "\n".join(parts)


def _ptx_of(module: Module) -> str | None:
    texts = []
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            for obj in op.attributes["objects"]:
                data = gpu.ObjectAttr(obj).object
                texts.append(data.decode() if isinstance(data, bytes) else str(data))
    return "\n".join(texts) if texts else None


def lower(built: BuiltModule | str, options: Options,
          steps: list[Step] | None = None) -> Lowered:
    """Run the pipeline of ``options.target`` pass by pass on the module text of ``built``."""
    text = built if isinstance(built, str) else built.text
    steps = steps if steps is not None else (
        cuda_steps(options) if options.target == "cuda" else cpu_steps(options))
    records: list[PassRecord] = []
    diagnostics: list[str] = []
    llvm_ir = ""
    llvm_seconds = 0.0
    start = time.perf_counter()
    with Context() as ctx, Location.unknown():
        from explorer.dialect import scan

        scan.load(ctx)

        def collect(d: Any) -> bool:
            diagnostics.append(f"{d.location}: {d.message}")
            for note in d.notes:
                diagnostics.append(f"  note: {note.location}: {note.message}")
            return True
        ctx.attach_diagnostic_handler(collect)
        try:
            module = Module.parse(text)
        except Exception as err:   # MLIRError: the text does not parse or verify
            step = Step("parse", _top(""))
            raise _fail("the module does not parse", step, str(err), text, options) from None
        before = text
        for step in steps:
            diagnostics.clear()
            t0 = time.perf_counter()
            try:
                if step.run is not None:
                    pm = PassManager()
                    pm.add(step.run, step.name)
                else:
                    pm = PassManager.parse(step.pipeline)
                pm.run(module.operation)
            except OptionError:
                raise       # a plan the options asked for cannot be built: said as such
            except CompileError as err:
                if err.reproducer is not None:
                    raise
                message = str(err).split("\n")[0]
                raise _fail(message, step, err.diagnostics, before, options) from None
            except Exception as err:
                diag = "\n".join([*diagnostics, f"{type(err).__name__}: {err}"])
                raise _fail(f"pass {step.name} failed", step, diag, before, options) from None
            seconds = time.perf_counter() - t0
            located: dict[str, list[int]] = {}
            if step.run is not None or step.name == _KERNEL_LLVM_AFTER:
                # printed with locations (twice the printing: only where they matter most)
                after, located = split_locations(
                    module.operation.get_asm(enable_debug_info=True))
            else:
                after = str(module)
            changed = after != before
            records.append(PassRecord(step.name, after if changed else before, seconds, changed,
                                      step.pipeline, located))
            before = after
            if step.name == _KERNEL_LLVM_AFTER:
                t0 = time.perf_counter()
                llvm_ir = _kernel_llvm_ir(module)
                llvm_seconds = time.perf_counter() - t0
        ptx = _ptx_of(module) if options.target == "cuda" else None
        if options.target == "cpu":
            t0 = time.perf_counter()
            llvm_ir = str(llvm.translate_module_to_llvmir(module.operation))
            llvm_seconds = time.perf_counter() - t0
        elif ptx is not None and ".extern .func __nv_" in ptx:
            raise CompileError(
                "the PTX calls libdevice functions that were not linked (math functions such "
                "as exp/log/tanh need CUDA's libdevice.10.bc: install the CUDA toolkit and set "
                "CUDA_HOME, or `pip install nvidia-cuda-nvcc`)",
                pass_name="gpu-module-to-binary", ir_before=before)
        final = before
    names = [] if isinstance(built, str) else [k.name for k in built.kernels]
    return Lowered(records, llvm_ir, ptx, final, time.perf_counter() - start, names,
                   llvm_seconds)

