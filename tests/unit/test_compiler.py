"""The compile driver: stage order and content, the cache, errors before any compile."""

from __future__ import annotations

import gzip
import time

import numpy as np
import pytest

import explorer as ex
from explorer import compiler

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


pytestmark = pytest.mark.usefixtures("private_cache")


def test_stage_order_for_cuda():
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    names = list(c.stages)
    assert names[:4] == ["recurrence", "affine", "plan", "mlir"]
    assert names[-2:] == ["llvm", "ptx"]
    assert names[4:-2] == [p.name if p.name not in names[:4] else names[4 + i]
                           for i, p in enumerate(c.passes)]
    assert len(c.passes) >= 5
    assert all(isinstance(s.seconds, float) for s in c.stages.values())


def test_stage_contents_checked_by_text():
    c = ex.compile(ex.PRESETS["selective scan"], target="cuda", strategy="blelloch")
    assert "states:   h (order 1)" in c.stages["recurrence"].text
    assert c.stages["recurrence"].dot and "digraph" in c.stages["recurrence"].dot
    assert "A_t" in c.stages["affine"].text and "diagonal" in c.stages["affine"].text
    assert "blelloch" in c.stages["plan"].text and "digraph" in (c.stages["plan"].dot or "")
    scan_ir = c.stages["mlir"].text
    assert '"scan.recurrence"' in scan_ir and '"scan.statement"' in scan_ir
    assert "scan-decompose" in c.term_lines()["2:1"]     # the readout, line 2
    assert '"scan.affine"' in c.stages["scan-decompose"].text
    assert '"scan.sweep"' in c.stages["scan-plan"].text
    mlir = c.stages["scan-lower"].text
    assert "gpu.module" in mlir and "gpu.func" in mlir and "gpu.barrier" in mlir
    assert "math.exp" in mlir and '"scan.' not in mlir
    assert [p.name for p in c.passes[:3]] == ["scan-decompose", "scan-plan", "scan-lower"]
    llvm = c.stages["llvm"].text
    assert "define" in llvm and "nvvm" in llvm.lower()
    ptx = c.stages["ptx"].text
    assert ".entry" in ptx and "bar.sync" in ptx and ".target sm_90" in ptx


def test_passes_record_changes():
    c = ex.compile(AFFINE, target="cuda", strategy="sequential")
    assert any(p.changed for p in c.passes)
    for prev, p in zip(c.passes, c.passes[1:]):
        assert p.changed == (p.ir != prev.ir)


def test_cpu_target_ends_with_llvm():
    c = ex.compile(AFFINE, target="cpu", strategy="blelloch")
    assert list(c.stages)[-1] == "llvm" and "ptx" not in c.stages
    assert c.device == "cpu"


def test_cache_is_instant_and_rebuilds_a_damaged_entry():
    c1 = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    t0 = time.perf_counter()
    c2 = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    assert time.perf_counter() - t0 < 0.01
    assert c2 is c1
    # a fresh process reads the disk cache
    compiler._MEMORY.clear()
    c3 = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    assert c3.from_cache and c3.ptx == c1.ptx and list(c3.stages) == list(c1.stages)
    # damage the entry: it is detected and rebuilt, never trusted
    path = compiler.cache_dir() / f"{c1.key}.json.gz"
    damaged = gzip.decompress(path.read_bytes()).replace(b"bar.sync", b"bar.broken")
    path.write_bytes(gzip.compress(damaged))
    compiler._MEMORY.clear()
    c4 = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    assert not c4.from_cache and "bar.broken" not in (c4.ptx or "")
    compiler.wait_for_cache_writes()   # entries are written in the background
    path.write_text("{not json")
    compiler._MEMORY.clear()
    assert not ex.compile(AFFINE, target="cuda", strategy="blelloch").from_cache


def test_different_options_are_different_entries():
    a = ex.compile(AFFINE, target="cuda", strategy="blelloch", block_size=128)
    b = ex.compile(AFFINE, target="cuda", strategy="blelloch", block_size=256)
    assert a.key != b.key and a.kernels[0]["block"][0] == 128 and b.kernels[0]["block"][0] == 256


@pytest.mark.parametrize("options, words", [
    (dict(strategy="bogus"), "strategy"),
    (dict(target="tpu"), "target"),
    (dict(block_size=100), "power of two"),
    (dict(elements_per_thread=3), "power of two"),
    (dict(chip="sm_91x"), "chip"),
])
def test_bad_options_fail_before_any_compile(options, words, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("compiled despite a bad option")

    monkeypatch.setattr(compiler, "_compile", boom)
    with pytest.raises(ex.OptionError, match=words):
        ex.compile(AFFINE, **options)


def test_bad_text_raises_recurrence_error():
    with pytest.raises(ex.RecurrenceError):
        ex.compile("h[t] = h[t-1] * h[t-1]")


def test_cpu_run_through_the_driver_matches_reference():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1.0, (3, 5, 77)).astype(np.float32)
    b = rng.normal(size=(5, 77)).astype(np.float32)
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    h = c(a=a, b=b, device="cpu")
    assert h.shape == (3, 5, 77)
    np.testing.assert_allclose(h, ex.reference(AFFINE, a=a, b=b), rtol=1e-4, atol=1e-5)
    # an initial state broadcasts like a parameter
    h0 = rng.normal(size=(5,)).astype(np.float32)
    np.testing.assert_allclose(c(a=a, b=b, h0=h0, device="cpu"),
                               ex.reference(AFFINE, a=a, b=b, h0=h0), rtol=1e-4, atol=1e-5)


#: fp32 against float64: the scan accumulates rounding over L steps; inputs keep |A_t| < 1 so the
#: error stays bounded.  Relative to the magnitude of the whole output.
FP32_RTOL = 2e-4


def _close(got, want):
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    assert err < FP32_RTOL, f"max error {err:.3g} relative to {scale:.3g}"


@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
@pytest.mark.parametrize("case", __import__("tests.corpus", fromlist=["CASES"]).CASES,
                         ids=lambda c: c.name)
def test_every_corpus_recurrence_runs_on_the_cpu(case, strategy):
    c = ex.compile(case.text, target="cpu", strategy=strategy, block_size=32,
                   elements_per_thread=2)
    for L in (1, 2, 3, 7, 1000):
        arrs = case.inputs((5,), L, N=3, seed=L)
        got, want = c(**arrs), ex.reference(case.text, **arrs)
        # the outputs the compile stores: the readouts alone when there are some
        got = got if isinstance(got, dict) else {c.outputs[0]: got}
        want = want if isinstance(want, dict) else {c.outputs[0]: want}
        assert tuple(got) == c.outputs
        for k in got:
            assert got[k].shape == want[k].shape
            _close(got[k], want[k])


@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
def test_long_sequence_on_the_cpu(strategy):
    from tests.corpus import CASES

    case = CASES[0]
    arrs = case.inputs((2,), 2**20, seed=1)
    c = ex.compile(case.text, target="cpu", strategy=strategy)
    _close(c(**arrs), ex.reference(case.text, **arrs))


def test_dump_and_load_compiled_round_trip(tmp_path):
    c = ex.compile(ex.PRESETS["selective scan"], target="cuda", strategy="blelloch")
    path = c.dump(tmp_path / "scan.json")
    back = compiler.load_compiled(path)
    assert list(back.stages) == list(c.stages) and back.ptx == c.ptx
    assert [p.name for p in back.passes] == [p.name for p in c.passes]
    assert back.kernels == c.kernels and back.recurrence.text == c.recurrence.text
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"bar.sync", b"bar.broken"))
    with pytest.raises(ValueError, match="damaged"):
        compiler.load_compiled(path)
    small = c.dump(tmp_path / "scan.json.gz")
    assert small.stat().st_size * 5 < len(raw)
    assert compiler.load_compiled(small).ptx == c.ptx
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a compiled record"):
        compiler.load_compiled(tmp_path / "other.json")


def test_load_compiled_needs_no_mlir(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path = ex.compile(AFFINE, target="cuda").dump(tmp_path / "affine.json")
    code = ("import sys; sys.modules['mlir'] = None\n"
            "from explorer.compiler import load_compiled\n"
            f"c = load_compiled({str(path)!r})\n"
            "assert 'ptx' in c.stages and c.kernels\n"
            "assert 'mlir' not in sys.modules or sys.modules['mlir'] is None\n"
            "print('ok')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(Path(compiler.__file__).parents[1]))
    assert run.stdout.strip() == "ok", run.stderr


def test_cache_key_follows_the_compiler_source(monkeypatch):
    from explorer import codegen

    before = compiler._key(AFFINE, {"block_size": 128})
    monkeypatch.setattr(codegen, "source_digest", lambda: "another-code-generator")
    assert compiler._key(AFFINE, {"block_size": 128}) != before


def test_a_record_keeps_each_thing_once(tmp_path):
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    raw = c.dump(tmp_path / "r.json").read_bytes()
    payload = raw.partition(b"\n")[2].decode()
    import json

    for p in c.passes:
        if p.changed:
            assert payload.count(json.dumps(p.ir)[1:-1]) == 1, p.name
    assert payload.count(json.dumps(c.ptx)[1:-1]) == 1
    back = compiler.load_compiled(tmp_path / "r.json")
    assert list(back.stages) == list(c.stages)
    assert back.ptx == c.ptx and back.llvm_ir == c.llvm_ir
    assert all(back.stages[p.name].text == p.ir for p in back.passes)
