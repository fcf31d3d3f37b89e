"""The pipeline's record of every pass against the plainest capture there is.

The oracle below runs each pass through a ``PassManager`` of its own and prints the whole module
after every pass twice with Python: ``str(module)``, the text shown, and with its locations,
from which a plain line-by-line reading (:func:`reference_terms`, independent of
:func:`explorer.codegen.locations.split_locations`) takes the lines each recurrence term became.
Whatever way the pipeline captures the IR, every record must say the same as the oracle: the
same passes, IR texts, changed flags, pipelines and term locations, and the same LLVM IR, PTX
and final module.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from explorer.codegen.locations import split_locations  # noqa: E402
from explorer.codegen.options import validate  # noqa: E402
from explorer.codegen.pipeline import Lowered, lower  # noqa: E402
from explorer.codegen.steps import Step, cpu_steps, cuda_steps, scan_steps  # noqa: E402
from explorer.dialect.build import build_scan  # noqa: E402
from explorer.dialect.scan import SOURCE  # noqa: E402
from explorer.frontend.recurrence import Recurrence  # noqa: E402
from explorer.passes.state import ScanState  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402

#: the NVPTX backend's own time, which gpu-module-to-binary writes into the gpu.binary op
_BACKEND_TIME = re.compile(r"LLVMIRToISATimeInMs = [0-9]+")


def _timeless(ir: str) -> str:
    return _BACKEND_TIME.sub("LLVMIRToISATimeInMs = ?", ir)


def _steps(rec: Recurrence, strategy: str, target: str, **options: Any) -> list[Step]:
    opts = validate(strategy, target, **options)
    upstream = cuda_steps(opts) if target == "cuda" else cpu_steps(opts)
    return scan_steps(ScanState(rec, opts)) + upstream


def reference_terms(asm: str) -> dict[str, list[int]]:
    """The lines of the module's plain text that each recurrence term became, read from ``asm``
    (printed with locations) one line at a time: alias definitions are no lines of the plain
    text, nor are the attribute aliases printed after the module; a line belongs to the terms
    of its last location, followed through aliases and fused locations."""
    aliases: dict[str, str] = {}
    body = []
    for line in asm.splitlines():
        m = re.fullmatch(r"(#loc\d*) = loc\((.*)\)", line)
        if m:
            aliases[m.group(1)] = m.group(2)
        else:
            body.append(line)
    while body and (not body[-1].strip() or body[-1].startswith("#")):
        body.pop()
    while body and not body[0].strip():
        body.pop(0)

    def terms(loc: str, depth: int = 0) -> list[str]:
        found = [f"{a}:{b}" for a, b in re.findall(rf'"{SOURCE}":(\d+):(\d+)', loc)]
        for ref in re.findall(r"#loc\d*", loc):
            if ref in aliases and depth < 8:
                found += terms(aliases[ref], depth + 1)
        return found

    out: dict[str, list[int]] = {}
    for index, line in enumerate(body):
        uses = re.findall(r" loc\((#loc\d*|(?:[^()]|\([^()]*\))*)\)", line)
        for term in dict.fromkeys(terms(uses[-1]) if uses else []):
            out.setdefault(term, []).append(index)
    return out


def oracle(text: str, steps: list[Step]) -> tuple[list[dict[str, Any]], str]:
    """Every pass run alone and the module printed by Python after each, without and with its
    locations: the records (less their times) and the final module."""
    from mlir.ir import Context, Location, Module
    from mlir.passmanager import PassManager

    from explorer.dialect import scan

    records = []
    with Context() as ctx, Location.unknown():
        scan.load(ctx)
        module = Module.parse(text)
        before = text
        for step in steps:
            if step.run is not None:
                pm = PassManager()
                pm.add(step.run, step.name)
            else:
                pm = PassManager.parse(step.pipeline)
            pm.run(module.operation)
            after = str(module)
            with_locations = module.operation.get_asm(enable_debug_info=True)
            # the text shown is the module without its locations, as str() prints it
            assert split_locations(with_locations)[0] == after, step.name
            changed = after != before
            records.append({"name": step.name, "ir": _timeless(after if changed else before),
                            "changed": changed, "pipeline": step.pipeline,
                            "locations": reference_terms(with_locations)})
            before = after
    return records, before


CASES = [
    ("affine scan", "blelloch", "cuda", {}),
    ("affine scan", "sequential", "cpu", {}),
    ("selective scan", "kogge_stone", "cuda", {}),
    ("selective scan", "blelloch", "cpu", {}),
    ("second order", "sequential", "cuda", {"reverse": True}),
    ("gated EMA", "blelloch", "cuda", {"block_size": 32, "elements_per_thread": 2}),
]


@pytest.mark.parametrize(("preset", "strategy", "target", "options"), CASES,
                         ids=[f"{p}-{s}-{t}" for p, s, t, _ in CASES])
def test_records_match_the_plain_capture(preset: str, strategy: str, target: str,
                                         options: dict[str, Any]) -> None:
    rec = Recurrence.parse(PRESETS[preset])
    text = build_scan(rec)
    expected, final = oracle(text, _steps(rec, strategy, target, **options))
    opts = validate(strategy, target, **options)
    lowered: Lowered = lower(text, opts, _steps(rec, strategy, target, **options))
    got = [{"name": p.name, "ir": _timeless(p.ir), "changed": p.changed, "pipeline": p.pipeline,
            "locations": p.locations} for p in lowered.passes]
    assert [r["name"] for r in got] == [r["name"] for r in expected]
    for g, e in zip(got, expected, strict=True):
        assert g == e, f"the record of {e['name']} differs"
    assert _timeless(lowered.final_module) == _timeless(final)
    assert all(p.seconds >= 0 for p in lowered.passes)
    # a pass's time is its own: not the printing of the IR after it
    assert sum(p.seconds for p in lowered.passes) <= lowered.seconds
    if target == "cuda":
        assert lowered.ptx is not None and ".entry" in lowered.ptx
        assert "define ptx_kernel" in lowered.llvm_ir
    else:
        assert lowered.ptx is None and "define " in lowered.llvm_ir



@pytest.mark.parametrize("trouble", ["no folder", "no room"])
def test_without_a_folder_for_the_printer(trouble: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no folder (with room enough) can be made, the module is printed through Python:
    the same records."""
    import shutil
    import tempfile

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise PermissionError("no temporary folder here")

    def full(path: Any) -> Any:
        return shutil._ntuple_diskusage(1 << 30, 1 << 30, 1 << 20)  # type: ignore[attr-defined]

    rec = Recurrence.parse(PRESETS["affine scan"])
    text = build_scan(rec)
    expected, _ = oracle(text, _steps(rec, "sequential", "cuda"))
    if trouble == "no folder":
        monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    else:
        monkeypatch.setattr(shutil, "disk_usage", full)
    lowered = lower(text, validate("sequential", "cuda"), _steps(rec, "sequential", "cuda"))
    got = [{"name": p.name, "ir": _timeless(p.ir), "changed": p.changed, "pipeline": p.pipeline,
            "locations": p.locations} for p in lowered.passes]
    assert got == expected


def test_an_upstream_pass_that_leaves_invalid_ir_fails() -> None:
    """An upstream pass runs without its manager's verifier: the IR printer verifies what it
    prints, and a module that does not verify fails the pass with the verifier's words."""
    from mlir.ir import (
        Context,
        F32Type,
        FloatAttr,
        InsertionPoint,
        IntegerType,
        Location,
        MLIRError,
        Module,
        Operation,
    )

    from explorer.codegen.pipeline import _run_upstream
    from explorer.codegen.printer import IRPrinter

    with Context(), Location.unknown():
        module = Module.parse("module {\n  func.func @f() {\n    return\n  }\n}\n")
        body = module.body.operations[0].regions[0].blocks[0]
        with InsertionPoint.at_block_begin(body):     # an i32 constant with an f32 value
            Operation.create("arith.constant", results=[IntegerType.get_signless(32)],
                             attributes={"value": FloatAttr.get(F32Type.get(), 1.0)})
        printer = IRPrinter()
        try:
            with pytest.raises(MLIRError, match="have same type"):
                _run_upstream(module, Step("symbol-privatize", "builtin.module(symbol-privatize)"),
                              printer)
        finally:
            printer.close()


def test_a_compile_runs_no_ptxas(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ptxas's resource report is off the compile's critical path: made when first asked."""
    import os
    import stat

    import explorer as ex

    marker = tmp_path / "ptxas-ran"
    fake = tmp_path / "bin" / "ptxas"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    c = ex.compile(PRESETS["affine scan"], target="cuda", cache=False)
    assert c.ptx is not None and not marker.exists()
    assert c.ptx_info is not None and marker.exists()     # asked: now it runs


def test_split_locations_handles_call_site_locations() -> None:
    """A location with parentheses inside (a call site) cannot be cut at its first ")": the
    split goes line by line, and gives what the fast way gives where both apply."""
    from explorer.codegen.locations import _split_lines

    simple = ('#loc1 = loc("recurrence":1:8)\n'
              'module {\n'
              '  %0 = arith.constant 1.0 : f32 loc(#loc1)\n'
              '  %1 = arith.addf %0, %0 : f32 loc("recurrence":1:20)\n'
              '} loc(unknown)\n')
    assert split_locations(simple) == _split_lines(simple)
    plain, terms = split_locations(simple)
    assert "loc(" not in plain
    assert terms == {"1:8": [1], "1:20": [2]}
    called = simple.replace('loc("recurrence":1:20)',
                            'loc(callsite("recurrence":1:20 at "recurrence":2:3))')
    plain_c, terms_c = split_locations(called)
    assert plain_c == plain
    assert terms_c["1:20"] == [2] and terms_c["2:3"] == [2] and terms_c["1:8"] == [1]
