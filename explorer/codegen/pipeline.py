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

For ``cuda`` the NVPTX backend (``gpu-module-to-binary``, about half of a compile) runs in a
thread of its own with the GIL released (:mod:`explorer.codegen.nogil`), and the passes before
it are printed meanwhile: ours and the upstream passes that always rewrite the module each
leave a copy of it (a thousandth of a second, against ten for printing it), verified by its
manager after the pass, and the copies are printed and recorded while the backend runs. The
records are those of printing after each pass: a copy that prints as the one before is a pass
that changed nothing.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlir.dialects import gpu, llvm
from mlir.ir import Context, Location, Module, WalkResult
from mlir.passmanager import PassManager

from explorer.codegen import nogil
from explorer.codegen.contract import BuiltModule
from explorer.codegen.locations import split_locations
from explorer.codegen.options import Options
from explorer.codegen.printer import IRPrinter, is_generic
from explorer.codegen.records import PassRecord
from explorer.codegen.steps import Step, cpu_steps, cuda_steps, top
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


def _check_translatable(op: Any, what: str, step: str, ir: str | Callable[[], str]) -> None:
    """``ir``: the module's text for the error, or how to get it."""
    left = _untranslatable(op, set())
    if left:
        raise CompileError(
            f"the {what} still holds ops that LLVM IR has no translation for after the "
            f"lowering passes: {', '.join(sorted(left)[:8])} (a pass did not convert them)",
            pass_name=step, ir_before=ir if isinstance(ir, str) else ir())


def _kernel_llvm_ir(module: Module, ir: str | Callable[[], str] = "") -> str:
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
        PassManager.parse(top(",".join(inner))).run(Module.create().operation)
        # the dialects our lowering builds that no upstream pass depends on (it converts
        # them): the look-back's asynchronous copies
        Context.current.dialects["nvgpu"]
    except Exception:
        return False
    return True


def _run_upstream(module: Module, step: Step, printer: IRPrinter | None,
                  verified: bool = False) -> tuple[float, str | None]:
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
    manager, and the module is printed by Python; ``verified``: the outer manager verifies the
    module after the pass, which is not printed (None: printed later from a copy)."""
    inner = PassManager.parse(step.pipeline)
    if printer is None and not verified:
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
    outer.enable_verifier(verified)
    if printer is not None and not verified:
        printer.attach(outer, locations=True, only_change=not step.rewrites)
    try:
        outer.run(module.operation)
    except Exception:
        if not outcome or not isinstance(outcome[0], Exception):
            raise
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    if printer is None or verified:
        return outcome[0], None
    return outcome[0], _checked(printer.take(), module, step)


def _checked(printed: str | None, module: Module, step: Step) -> str | None:
    """``printed``, the module after ``step``, unless the printer fell back to the generic
    form: then the verifier's diagnostics are raised."""
    if printed is not None and is_generic(printed):
        module.operation.verify()   # raises the verifier's diagnostics
        raise RuntimeError(f"the module after {step.name} did not print in its custom form")
    return printed


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


class _Records:
    """The pass records as the passes come, each from the module printed after it (``None``
    when the pass did not change it); passes before the backend may leave a copy of the module
    to be printed later (:meth:`defer`, :meth:`settle`)."""

    def __init__(self, text: str, printer: IRPrinter | None) -> None:
        self.records: list[PassRecord] = []
        self.before = text                      # the shown text after the last pass recorded
        self.located: dict[str, list[int]] = {}
        self.printer = printer
        self._printed: str | None = None        # the last printed text, locations and all
        self._pending: list[tuple[Step, float, Any, bool]] = []

    def add(self, step: Step, seconds: float, printed: str | None) -> None:
        if printed is not None and printed == self._printed:
            printed = None                      # printed again, the same: nothing changed
        if printed is None:        # the pass changed nothing: nor its locations
            after = self.before
        else:
            after, self.located = split_locations(printed)
            self._printed = printed
        changed = after != self.before
        self.records.append(PassRecord(step.name, after if changed else self.before, seconds,
                                       changed, step.pipeline, self.located))
        self.before = after

    def defer(self, step: Step, seconds: float, module: Module, printed: str | None) -> None:
        """Record ``step`` later: from a copy of the module as it is now, or from ``printed``
        where the pass has been printed (or not: ``step.rewrites`` is False, see
        :func:`_run_upstream`)."""
        done = not step.rewrites and step.run is None
        self._pending.append((step, seconds, printed if done else module.operation.clone(),
                              done))

    @property
    def settled_text(self) -> str:
        """The shown text after the last pass, the copies left before printed first."""
        self.settle()
        return self.before

    @property
    def copies(self) -> int:
        """How many copies of the module wait to be printed."""
        return sum(not printed for *_, printed in self._pending)

    def settle(self) -> None:
        """Print the copies left by :meth:`defer` and record their passes, in order."""
        pending, self._pending = self._pending, []
        for step, seconds, copy, printed in pending:
            self.add(step, seconds, copy if printed else self.print(copy))

    def print(self, op: Any) -> str:
        """The module operation ``op`` printed with its locations by MLIR's printer."""
        if self.printer is None:
            raise RuntimeError("no IR printer for the copies of the module")
        return self.printer.print(op, locations=True)


def _deferring_to(steps: list[Step], options: Options, printer: IRPrinter | None) -> int:
    """The index of the NVPTX backend (``gpu-module-to-binary``) when it is run with the GIL
    released while the passes before it are printed, else -1: ours and the upstream passes
    that change the module in every known compile (``Step.rewrites``) then leave a copy of the
    module each (a thousandth of a second), verified after the pass, printed while the backend
    runs; the other upstream passes, which mostly change nothing, are printed as before only
    where MLIR's fingerprint of the module changed, and recorded in order with the copies."""
    if options.target != "cuda" or printer is None or not nogil.available():
        return -1
    names = [s.name for s in steps]
    if "gpu-module-to-binary" not in names:
        return -1
    at = names.index("gpu-module-to-binary")
    return at if steps[at].run is None else -1


def _backend_beside(module: Module, step: Step, rec: _Records, ctx: Any,
                    diagnostics: list[str], meanwhile: Callable[[], None] | None
                    ) -> tuple[float, bool, BaseException | None]:
    """Run the backend ``step`` in a thread of its own with the GIL released, recording the
    passes before it meanwhile, then calling ``meanwhile``; the backend's time, whether
    ``meanwhile`` was called and what it raised. The time ends when the thread takes the GIL
    back, which the recording holds at most one printed module long."""
    inner = PassManager.parse(step.pipeline)
    inner.enable_verifier(False)   # the module is printed after it, which verifies it
    outcome: dict[str, Any] = {}

    def backend() -> None:
        t0 = time.perf_counter()
        try:
            outcome["ok"] = nogil.run_released(inner, module.operation)
        except BaseException as err:   # noqa: BLE001 - raised again by the pipeline's thread
            outcome["error"] = err
        outcome["seconds"] = time.perf_counter() - t0

    # the bindings' objects of operations inside the module are not told what the backend
    # erases: there must be none but the copies (top-level operations of their own)
    live = getattr(ctx, "_get_live_count", None)
    if live is not None and live() > 1 + rec.copies:
        rec.settle()
        t0 = time.perf_counter()
        inner.run(module.operation)
        return time.perf_counter() - t0, False, None
    late: BaseException | None = None
    with nogil.Diagnostics(ctx) as seen:
        worker = threading.Thread(target=backend, name="scanweaver-backend", daemon=True)
        worker.start()
        try:
            rec.settle()
            if meanwhile is not None:
                try:
                    meanwhile()
                except Exception as err:   # the caller's: raised by it, not as the backend's
                    late = err
        finally:
            _wait_for(worker)
    diagnostics.extend(seen.lines)
    if "error" in outcome:
        raise outcome["error"]
    if not outcome["ok"]:
        raise RuntimeError(f"{step.name} failed")
    return float(outcome["seconds"]), meanwhile is not None, late


def _wait_for(worker: threading.Thread) -> None:
    """Join ``worker`` even through an interrupt (raised once it is done): the context and
    the module it works on must outlive it."""
    interrupted: BaseException | None = None
    while worker.is_alive():
        try:
            worker.join()
        except KeyboardInterrupt as err:
            interrupted = err
    if interrupted is not None:
        raise interrupted


def lower(built: BuiltModule | str, options: Options, steps: list[Step] | None = None,
          meanwhile: Callable[[], None] | None = None) -> Lowered:
    """Run the pipeline of ``options.target`` pass by pass on the module text of ``built``.

    ``meanwhile``: work of the caller's that our passes made possible, done while the NVPTX
    backend runs (else once the passes have run); what it raises is raised as it is."""
    text = built if isinstance(built, str) else built.text
    steps = steps if steps is not None else (
        cuda_steps(options) if options.target == "cuda" else cpu_steps(options))
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
            step = Step("parse", top(""))
            raise _fail("the module does not parse", step, str(err), text, options) from None
        # MLIR prints into a folder of ours once the dialects are loaded; where either cannot
        # be, every pass runs alone and Python prints the module after it
        printer: IRPrinter | None = None
        if _load_dialects(steps):
            try:
                printer = IRPrinter()
            except OSError:
                printer = None
        rec = _Records(text, printer)
        late: BaseException | None = None
        backend = _deferring_to(steps, options, printer)
        try:
            for i, step in enumerate(steps):
                diagnostics.clear()
                try:
                    printed: str | None = None
                    if i == backend:
                        seconds, done, late = _backend_beside(module, step, rec, ctx,
                                                              diagnostics, meanwhile)
                        meanwhile = None if done else meanwhile
                        printed = _checked(rec.print(module.operation), module, step)
                    elif step.run is not None:
                        pm = PassManager()
                        pm.add(step.run, step.name)
                        t0 = time.perf_counter()
                        pm.run(module.operation)
                        seconds = time.perf_counter() - t0
                        if i >= backend:
                            printed = (printer.print(module.operation, locations=True)
                                       if printer is not None
                                       else module.operation.get_asm(enable_debug_info=True))
                    elif i < backend and step.rewrites:
                        seconds, _ = _run_upstream(module, step, None, verified=True)
                    else:
                        seconds, printed = _run_upstream(module, step, printer)
                except OptionError:
                    raise   # a plan the options asked for cannot be built: said as such
                except CompileError as err:
                    if err.reproducer is not None:
                        raise
                    rec.settle()
                    message = str(err).split("\n")[0]
                    raise _fail(message, step, err.diagnostics, rec.before, options) from None
                except Exception as err:
                    diag = "\n".join([*diagnostics, f"{type(err).__name__}: {err}"])
                    rec.settle()
                    raise _fail(f"pass {step.name} failed", step, diag, rec.before,
                                options) from None
                if late is not None:
                    raise late
                if i < backend:
                    rec.defer(step, seconds, module, printed)
                else:
                    rec.add(step, seconds, printed)
                if step.name == _KERNEL_LLVM_AFTER:
                    t0 = time.perf_counter()
                    llvm_ir = _kernel_llvm_ir(module, lambda: rec.settled_text)
                    llvm_seconds = time.perf_counter() - t0
            rec.settle()
        finally:
            if printer is not None:
                printer.close()
        if meanwhile is not None:
            meanwhile()
        records, before = rec.records, rec.before
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
