"""Stage 5, the pass pipeline: MLIR module text -> lowered module, LLVM IR and PTX.

The pipeline runs one pass at a time, each through its own ``PassManager``, and records the IR
after every pass (:class:`PassRecord`), printed by MLIR's own IR printer into a private folder
(``tree_printing_dir_path``) and read back: half the time of ``str(module)``, which hands the
text to Python in tens of thousands of pieces. The module is printed with its locations, once:
:func:`explorer.codegen.locations.split_locations` makes of it the text that is shown (as
``str(module)`` prints it) and the lines each recurrence term became after that pass. An
upstream pass's module is printed only when MLIR's fingerprint of it (locations included)
changed (``print_after_change``), and the printer's verification of what it prints stands for
the verifier after the pass; a pass that changed nothing keeps the text and the term lines
before it. A pass's time is the pass's alone, without the printing (or, upstream, the
verifying) after it. Nothing is written to file descriptor 2 of the process (a notebook
kernel's): the diagnostics go to a handler attached to the context.

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
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlir.dialects import gpu, llvm
from mlir.ir import Context, Location, Module, WalkResult
from mlir.passmanager import PassManager

from explorer.codegen.contract import BuiltModule
from explorer.codegen.locations import SeenLines, split_locations
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
    """Host lowering: scf/memref/arith/math/func to the LLVM dialect. bfloat16 conversions are
    expanded into integer arithmetic first: LLVM lowers ``fptrunc`` to bfloat on x86 to a call of
    ``__truncsfbf2``, which the JIT does not find."""
    bf16 = "bfloat16" in (options.dtype, options.output_dtype)
    expand = [Step("arith-expand (bf16)", _top("arith-expand{include-bf16=true}"))] * bf16
    return [
        *_cleanup(), *expand,
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


#: the dialects MLIR's translation to LLVM IR takes (anything else crashes the bindings'
#: translate_module_to_llvmir, killing a notebook's kernel, instead of raising)
_TRANSLATABLE = ("llvm.", "nvvm.", "builtin.")


def _untranslatable(op: Any, out: set[str]) -> set[str]:
    """Names of the ops under ``op`` (itself included) that the translation cannot take."""
    def visit(current: Any) -> Any:
        name = current.name
        if not name.startswith(_TRANSLATABLE):
            out.add(name)
        return WalkResult.ADVANCE

    op.walk(visit)   # MLIR's walk: a third of the time of going through regions and blocks here
    return out


def _check_translatable(op: Any, what: str, step: str, ir: str) -> None:
    left = _untranslatable(op, set())
    if left:
        raise CompileError(
            f"the {what} still holds ops that LLVM IR has no translation for after the "
            f"lowering passes: {', '.join(sorted(left)[:8])} (a pass did not convert them)",
            pass_name=step, ir_before=ir)


def _kernel_llvm_ir(module: Module, ir: str = "") -> str:
    """LLVM IR of the device code: the gpu.module's LLVM dialect, translated."""
    parts = []
    for op in module.body.operations:
        if op.operation.name != "gpu.module":
            continue
        inner = Module.create()
        for nested in op.regions[0].blocks[0].operations:
            inner.body.append(nested.operation.clone())
        _check_translatable(inner.operation, "gpu module", _KERNEL_LLVM_AFTER, ir)
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


class _Printer:
    """The module's text after a pass, printed by MLIR's IR printer into a private folder
    (``tree_printing_dir_path``) and read back: the very text of ``str(module)`` (with
    ``locations``: of ``get_asm(enable_debug_info=True)``), without handing it to Python in
    small pieces."""

    #: what the IR printer writes around the module (``printAfterIfEnabled`` in MLIR's
    #: IRPrinting.cpp): a header line before it, two newlines after it
    HEADER = "// -----// IR Dump After "
    TRAILER = "\n\n"

    #: free space the folder's file system must have: MLIR aborts the process when it cannot
    #: write a file it printed to (a module prints to a few MB, each file is removed once read)
    MIN_FREE_BYTES = 256 * 1024 * 1024

    def __init__(self) -> None:
        """Raises OSError when no folder with room enough can be made."""
        # memory first (/dev/shm: no file system journal), then the temporary folder
        for parent in ("/dev/shm", tempfile.gettempdir()):
            try:
                if (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)
                        and shutil.disk_usage(parent).free >= self.MIN_FREE_BYTES):
                    self.root = tempfile.mkdtemp(prefix="scanweaver-ir-", dir=parent)
                    return
            except OSError:
                continue
        raise OSError("no folder with room for the IR printer")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def attach(self, pm: PassManager, locations: bool, only_change: bool) -> None:
        """Print after the passes of ``pm`` (with ``only_change``: after those that changed
        the module's fingerprint)."""
        pm.enable_ir_printing(print_after_all=True, print_after_change=only_change,
                              enable_debug_info=locations, tree_printing_dir_path=self.root)

    def print(self, module: Module, locations: bool) -> str:
        """The module as it is now."""
        pm = PassManager()
        pm.add(_leave_alone, "print")
        pm.enable_verifier(False)
        self.attach(pm, locations, only_change=False)
        pm.run(module.operation)
        text = self.take()
        if text is None:
            raise RuntimeError("MLIR's IR printer printed nothing")
        return text

    def take(self) -> str | None:
        """The text printed since the last call, None if nothing was."""
        dumps = [os.path.join(folder, name)
                 for folder, _, names in os.walk(self.root) for name in names]
        if not dumps:
            return None
        if len(dumps) != 1:
            raise RuntimeError(f"MLIR's IR printer wrote {len(dumps)} files for one pass")
        with open(dumps[0], encoding="utf-8", newline="") as f:
            dump = f.read()
        os.unlink(dumps[0])
        header, _, text = dump.partition("\n")
        if not header.startswith(self.HEADER) or not text.endswith(self.TRAILER):
            raise RuntimeError("MLIR's IR printer wrote an unexpected frame around the IR")
        return text[:-len(self.TRAILER)]


#: how a module that fails to verify is printed (MLIR's printer falls back to the generic form)
_GENERIC_MODULE = '"builtin.module"()'


def _leave_alone(op: Any, pass_: Any) -> None:
    """A pass that changes nothing, for the IR printer to print the module after it."""
    del op, pass_


def _load_dialects(steps: list[Step]) -> bool:
    """Register and load the dialects the upstream passes of ``steps`` depend on, by running
    them all once on an empty module; False when that fails.

    MLIR does not let a pass manager register dialects while another one runs (an assertion of
    the bindings' build, which aborts the process), and :func:`_run_upstream` runs each pass
    inside a Python pass of an outer manager: done here first, the inner managers find their
    dialects loaded and register nothing."""
    inner = [s.pipeline[len("builtin.module("):-1] for s in steps if s.run is None]
    if not all(s.pipeline.startswith("builtin.module(") and s.pipeline.endswith(")")
               for s in steps if s.run is None):
        return False
    try:
        PassManager.parse(_top(",".join(inner))).run(Module.create().operation)
    except Exception:
        return False
    return True


def _generic(printed: str) -> bool:
    """Whether ``printed`` holds the module in the generic form (after its alias definitions)."""
    start = 0
    while printed.startswith(("#", "!"), start):
        start = printed.find("\n", start) + 1
        if start == 0:
            return False
    return printed.startswith(_GENERIC_MODULE, start)


def _run_upstream(module: Module, step: Step, printer: _Printer | None
                  ) -> tuple[float, str | None]:
    """Run an upstream pass: its time, and the IR after it with its locations, None when the
    pass did not change the module.

    The pass runs in a ``PassManager`` of its own, run and timed by a Python pass of an outer
    one. The outer manager's IR printer prints once the Python pass has returned, so the pass's
    time leaves the printing out, and only when MLIR's fingerprint of the module (every
    operation, its attributes, operands, types and location) differs from the one before the
    pass (``print_after_change``), so a module a pass left alone is not printed at all. The
    printer verifies what it prints, which stands for the manager's verifier after the pass: a
    module that fails is printed in the generic form, and then verified again to raise the
    diagnostics. Without a ``printer`` (see :func:`lower`) the pass runs alone, verified by its
    manager, and the module is printed by Python."""
    inner = PassManager.parse(step.pipeline)
    if printer is None:
        t0 = time.perf_counter()
        inner.run(module.operation)
        seconds = time.perf_counter() - t0
        return seconds, module.operation.get_asm(enable_debug_info=True)

    # the printer verifies the module it prints (and prints an invalid one in the generic form,
    # checked below), and a module whose fingerprint did not change is as valid as before
    inner.enable_verifier(False)
    outcome: list[Any] = []

    def timed(op: Any, pass_: Any) -> None:
        t0 = time.perf_counter()
        try:
            inner.run(op)
        except Exception as err:    # raised again below, out of MLIR's frames
            outcome.append(err)
            pass_.signal_pass_failure()
            return
        outcome.append(time.perf_counter() - t0)

    outer = PassManager()
    outer.add(timed, step.name)
    outer.enable_verifier(False)
    printer.attach(outer, locations=True, only_change=True)
    try:
        outer.run(module.operation)
    except Exception:
        if not outcome or not isinstance(outcome[0], Exception):
            raise
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    printed = printer.take()
    if printed is not None and _generic(printed):
        module.operation.verify()   # raises the verifier's diagnostics
        raise RuntimeError(f"the module after {step.name} did not print in its custom form")
    return outcome[0], printed


def _find_scan_module() -> None:
    """Let the bindings find a Python module for the ``scan`` dialect. Wrapping an op of a
    dialect (as our passes do for each op they read), they import ``mlir.dialects.<dialect>``
    for its op classes; for ``scan`` there is none, and a failed import is searched for again
    on ``sys.path`` the next time (about 250 times a compile, some 20 ms). Found under the
    prefix ``explorer.dialect`` (:mod:`explorer.dialect.scan`, which defines no op classes:
    the ops stay plain ``OpView``), the dialect's module is looked up once."""
    from mlir._mlir_libs._mlir import globals as mlir_globals

    if "explorer.dialect" not in mlir_globals.dialect_search_modules:
        mlir_globals.append_dialect_search_prefix("explorer.dialect")


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
    _find_scan_module()
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
        # MLIR prints into a folder of ours once the dialects are loaded; where either cannot
        # be, every pass runs alone and Python prints the module after it
        printer: _Printer | None = None
        if _load_dialects(steps):
            try:
                printer = _Printer()
            except OSError:
                printer = None
        try:
            located: dict[str, list[int]] = {}
            seen: SeenLines = {}     # the lines printed so far, taken apart
            for step in steps:
                diagnostics.clear()
                try:
                    if step.run is not None:
                        pm = PassManager()
                        pm.add(step.run, step.name)
                        t0 = time.perf_counter()
                        pm.run(module.operation)
                        seconds = time.perf_counter() - t0
                        printed: str | None = (
                            printer.print(module, locations=True) if printer is not None
                            else module.operation.get_asm(enable_debug_info=True))
                    else:
                        seconds, printed = _run_upstream(module, step, printer)
                except OptionError:
                    raise   # a plan the options asked for cannot be built: said as such
                except CompileError as err:
                    if err.reproducer is not None:
                        raise
                    message = str(err).split("\n")[0]
                    raise _fail(message, step, err.diagnostics, before, options) from None
                except Exception as err:
                    diag = "\n".join([*diagnostics, f"{type(err).__name__}: {err}"])
                    raise _fail(f"pass {step.name} failed", step, diag, before,
                                options) from None
                if printed is None:        # the pass changed nothing: nor its locations
                    after = before
                else:
                    after, located = split_locations(printed, seen)
                changed = after != before
                records.append(PassRecord(step.name, after if changed else before, seconds,
                                          changed, step.pipeline, located))
                before = after
                if step.name == _KERNEL_LLVM_AFTER:
                    t0 = time.perf_counter()
                    llvm_ir = _kernel_llvm_ir(module, before)
                    llvm_seconds = time.perf_counter() - t0
        finally:
            if printer is not None:
                printer.close()
        ptx = _ptx_of(module) if options.target == "cuda" else None
        if options.target == "cpu":
            t0 = time.perf_counter()
            _check_translatable(module.operation, "module", records[-1].name if records
                                else "input", before)
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
