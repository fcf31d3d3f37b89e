"""The NVPTX backend in a thread of its own, with the GIL released (explorer.codegen.nogil),
while the pipeline prints the passes before it: the same records as one thing after another,
and its failures said as any pass's."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from mlir.ir import Context, Location, Module  # noqa: E402
from mlir.passmanager import PassManager  # noqa: E402

from explorer.codegen import nogil, pipeline  # noqa: E402
from explorer.codegen.options import validate  # noqa: E402
from explorer.codegen.steps import Step, cuda_steps, scan_steps, top  # noqa: E402
from explorer.dialect.build import build_scan  # noqa: E402
from explorer.errors import CompileError  # noqa: E402
from explorer.frontend.recurrence import Recurrence  # noqa: E402
from explorer.passes.state import ScanState  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402

pytestmark = pytest.mark.skipif(not nogil.available(), reason="MLIR's C API library not found")

#: a kernel module the backend cannot translate (func.func inside the gpu.module)
UNTRANSLATABLE = ('module attributes {gpu.container_module} {\n'
                  '  gpu.module @k [#nvvm.target<chip = "sm_90">] {\n'
                  '    func.func @f() {\n      return\n    }\n  }\n}\n')
BACKEND = Step("gpu-module-to-binary", top("gpu-module-to-binary{format=isa}"), rewrites=True)


def _lower(preset: str, strategy: str) -> pipeline.Lowered:
    rec = Recurrence.parse(PRESETS[preset])
    opts = validate(strategy, "cuda")
    return pipeline.lower(build_scan(rec), opts,
                          scan_steps(ScanState(rec, opts)) + cuda_steps(opts))


def _records(lowered: pipeline.Lowered) -> list[tuple[Any, ...]]:
    return [(p.name, re.sub(r"LLVMIRToISATimeInMs = \d+", "", p.ir), p.changed,
             p.pipeline, p.locations) for p in lowered.passes]


@pytest.mark.parametrize(("preset", "strategy"), [("affine scan", "kogge_stone"),
                                                  ("selective scan", "sequential")])
def test_the_same_records_with_the_backend_in_its_thread_as_without(
        preset: str, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []
    run = nogil.run_released

    def counted(pm: Any, op: Any) -> bool:
        runs.append(threading.current_thread().name)
        return run(pm, op)

    monkeypatch.setattr(nogil, "run_released", counted)
    beside = _lower(preset, strategy)
    assert runs == ["scanweaver-backend"]     # the backend ran in its thread, released
    monkeypatch.setattr(nogil, "available", lambda: False)
    alone = _lower(preset, strategy)
    assert _records(beside) == _records(alone)
    assert beside.ptx == alone.ptx and ".entry" in (beside.ptx or "")
    assert beside.llvm_ir == alone.llvm_ir
    assert re.sub(r"LLVMIRToISATimeInMs = \d+", "", beside.final_module) == \
        re.sub(r"LLVMIRToISATimeInMs = \d+", "", alone.final_module)
    backend = [p for p in beside.passes if p.name == "gpu-module-to-binary"]
    assert len(backend) == 1 and backend[0].changed and backend[0].seconds > 0


def test_a_run_without_the_gil_collects_its_diagnostics() -> None:
    """Run from another thread (as the pipeline does), a failing backend returns False and
    its diagnostics reach the collector, not a Python handler of the bindings (which would
    abort the process without the GIL)."""
    python_handler: list[str] = []
    with Context() as ctx, Location.unknown():
        ctx.attach_diagnostic_handler(lambda d: python_handler.append(str(d)) or True)
        module = Module.parse(UNTRANSLATABLE)
        pm = PassManager.parse(BACKEND.pipeline)
        outcome: list[bool] = []
        with nogil.Diagnostics(ctx) as seen:
            worker = threading.Thread(target=lambda: outcome.append(
                nogil.run_released(pm, module.operation)))
            worker.start()
            worker.join()
    assert outcome == [False]
    assert any("Failed creating the llvm::Module" in line for line in seen.lines)
    assert any(line.startswith("  note: ") for line in seen.lines)
    assert python_handler == []


def test_a_failing_backend_is_a_compile_error_with_its_reproducer() -> None:
    with pytest.raises(CompileError) as err:
        pipeline.lower(UNTRANSLATABLE, validate("sequential", "cuda"), [BACKEND])
    assert err.value.pass_name == "gpu-module-to-binary"
    assert "Failed creating the llvm::Module" in err.value.diagnostics
    assert "func.func @f()" in err.value.ir_before
    assert err.value.reproducer is not None
    assert "gpu-module-to-binary" in err.value.reproducer.command
