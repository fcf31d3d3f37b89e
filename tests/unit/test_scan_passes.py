"""Our passes, one FileCheck test each (tests/unit/filecheck/*.mlir): the IR after the pass,
given the IR the passes before it made. A file's RUN line names the pass, the recurrence and
the options; its CHECK lines are matched by the ``filecheck`` package."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from explorer.codegen.options import validate  # noqa: E402
from explorer.codegen.steps import scan_steps  # noqa: E402
from explorer.dialect import scan  # noqa: E402
from explorer.dialect.build import build_scan  # noqa: E402
from explorer.frontend.recurrence import Recurrence  # noqa: E402
from explorer.passes.state import ScanState  # noqa: E402

HERE = Path(__file__).parent / "filecheck"
CASES = sorted(HERE.glob("*.mlir"))


def _filecheck() -> str:
    found = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    if not Path(found).exists():
        pytest.skip("the filecheck package is not installed")
    return found


def ir_after(pass_name: str, recurrence: str, **options: object) -> str:
    """The module (with locations) after ``pass_name``, our passes before it run first."""
    from mlir.ir import Context, Location, Module
    from mlir.passmanager import PassManager

    strategy = str(options.pop("strategy", "blelloch"))
    target = str(options.pop("target", "cuda"))
    rec = Recurrence.parse(recurrence)
    state = ScanState(rec, validate(strategy, target, **options))
    with Context() as ctx, Location.unknown():
        scan.load(ctx)
        module = Module.parse(build_scan(rec))
        for step in scan_steps(state):
            pm = PassManager()
            pm.add(step.run, step.name)
            pm.run(module.operation)
            if step.name == pass_name:
                return module.operation.get_asm(enable_debug_info=True)
    raise KeyError(pass_name)


def _run_line(path: Path) -> tuple[str, str, dict[str, object]]:
    line = next(x for x in path.read_text().splitlines() if x.startswith("// RUN:"))
    words = shlex.split(line[len("// RUN:"):])
    name, options = words[0], {}
    rec = ""
    for w in words[1:]:
        key, value = w.split("=", 1)
        if key == "recurrence":
            rec = value.replace("\\n", "\n")
        else:
            options[key] = (int(value) if re.fullmatch(r"\d+", value) else
                            value == "true" if value in ("true", "false") else
                            tuple(value.split(",")) if "," in value else value)
    return name, rec, options


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_pass_filecheck(path: Path) -> None:
    name, rec, options = _run_line(path)
    out = ir_after(name, rec, **options)
    run = subprocess.run([_filecheck(), str(path)], input=out, capture_output=True, text=True)
    assert run.returncode == 0, f"{run.stdout}{run.stderr}\n--- IR after {name} ---\n{out}"


def test_every_pass_of_ours_has_a_filecheck_test() -> None:
    names = {s.name for s in scan_steps(ScanState(Recurrence.parse("h[t] = h[t-1]"),
                                                  validate()))}
    tested = {_run_line(p)[0] for p in CASES}
    assert names <= tested, f"untested: {names - tested}"


def test_a_check_that_does_not_hold_fails(tmp_path: Path) -> None:
    """The harness can fail: a wrong CHECK line is reported."""
    bad = tmp_path / "bad.mlir"
    bad.write_text('// RUN: scan-plan recurrence="h[t] = a[t] * h[t-1] + b[t]" '
                   "strategy=kogge_stone block_size=32\n"
                   '// CHECK: "scan.sweep"() {active = 16 : i64, phase = "up"\n')
    name, rec, options = _run_line(bad)
    run = subprocess.run([_filecheck(), str(bad)], input=ir_after(name, rec, **options),
                         capture_output=True, text=True)
    assert run.returncode != 0


def test_locations_reach_the_ops_and_the_ptx() -> None:
    """Each term of the recurrence maps to the ops it became and to PTX instructions."""
    import explorer as ex

    text = ex.PRESETS["selective scan"]
    c = ex.compile(text, target="cuda", strategy="blelloch")
    x_term = f"1:{text.splitlines()[0].index('x[t]') + 1}"
    lines = c.term_lines()
    assert set(lines[x_term]) >= {"scan-lower", "ptx"}
    lowered = c.stages["scan-lower"].text.splitlines()
    # its loads: scalar, or a tile's wide loads (scan.thread {vector})
    assert all(any(op in lowered[i] for op in ("memref.load", "vector.load", "arith."))
               for i in lines[x_term]["scan-lower"])
    assert any("vector.load" in lowered[i] for i in lines[x_term]["scan-lower"])
    assert any("memref.load" in lowered[i] for i in lines[x_term]["scan-lower"])
    ptx = c.ptx.splitlines()
    assert any("ld.global" in ptx[i] for i in lines[x_term]["ptx"])
    # the readout's sum over lanes comes from line 2
    assert "2:1" in lines and "ptx" in lines["2:1"]
    assert ".file" in c.ptx and '"recurrence"' in c.ptx
    # line directives only: a `debug` target would make ptxas compile without optimising
    target = next(line for line in ptx if line.startswith(".target"))
    assert "debug" not in target


def test_the_shown_ir_is_the_module_without_its_locations() -> None:
    from mlir.ir import Context, Module

    from explorer.codegen.locations import split_locations

    with Context() as ctx:
        scan.load(ctx)
        module = Module.parse(ir_after("scan-lower", "h[t] = a[t] * h[t-1] + b[t]",
                                       block_size=32))
        plain, terms = split_locations(module.operation.get_asm(enable_debug_info=True))
        assert plain == str(module)
        assert {"1:1", "1:8", "1:24"} <= set(terms)


def test_a_failing_pass_of_ours_has_a_reproducer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CompileError in one of our passes carries the IR before it and a command that replays
    the pass on it (here the failure is injected; the replay, in a fresh process, succeeds)."""
    import explorer as ex
    from explorer.errors import CompileError
    from explorer.passes import plan

    def broken(form: object, options: object) -> object:
        raise RuntimeError("injected")
    monkeypatch.setattr(plan, "choose_plan", broken)
    with pytest.raises(CompileError) as info:
        ex.compile("h[t] = a[t] * h[t-1] + b[t]", target="cpu", cache=False)
    err = info.value
    assert err.pass_name == "scan-plan" and "injected" in str(err)
    assert err.reproducer is not None and "python -m explorer.passes" in err.reproducer.command
    assert '"scan.affine"' in Path(err.reproducer.ir_path).read_text()
    argv = shlex.split(err.reproducer.command)
    run = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr
    assert '"scan.sweep"' in run.stdout and '"scan.grid"' in run.stdout
