"""GPU tests of the benchmark harness and the ``run`` command: checks before timing, stopping.

Skipped without CuPy, a GPU, or the artifacts of ``tests/gpu/build_artifacts.py``.  Baselines
that need other libraries are left out (``cuda-sequential`` needs CuPy alone); no timing is
asserted, only that records are complete and that a wrong kernel is reported and never timed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

from explorer.runtime.cuda import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

from explorer import bench  # noqa: E402
from explorer.cli import main  # noqa: E402
from explorer.runtime.artifact import load_artifact, write_artifact  # noqa: E402

ART = Path(__file__).resolve().parent / "artifacts"
if not (ART / "abi-affine" / "manifest.json").exists():
    pytest.skip("no artifacts: run `python tests/gpu/build_artifacts.py`", allow_module_level=True)


@pytest.fixture
def wrong_artifact(tmp_path: Path) -> Path:
    """The reference kernel with a and b swapped in its manifest: runs fine, computes nonsense."""
    art = load_artifact(ART / "abi-affine")
    manifest = json.loads(json.dumps(art.manifest))
    args = manifest["kernels"][0]["args"]
    args[0]["name"], args[1]["name"] = "b", "a"
    manifest["strategy"] = "swapped"
    return write_artifact(tmp_path / "swapped", dict(art.ptx_text), manifest)


def test_sweep_checks_then_times(wrong_artifact: Path) -> None:
    got = list(bench.sweep("64x1000,7x33", artifacts=[str(ART / "abi-affine"),
                                                      str(wrong_artifact)],
                           baseline_names="cuda",
                           options=bench.Options(budget_ms=20.0, max_reps=10)))
    assert [(r.C, r.L) for r in got] == [(64, 1000)] * 4 + [(7, 33)] * 4
    by = {(r.method, r.C): r for r in got}
    for C in (64, 7):
        copy = by[("copy (roofline)", C)]
        assert copy.status == "ok" and copy.time_ms and copy.time_ms > 0 and copy.of_copy == 1.0
        for name in ("cuda-sequential", "scanweaver-abi-reference"):
            r = by[(name, C)]
            assert r.status == "ok", r.reason
            assert r.max_rel_err is not None and r.max_rel_err <= 1e-4
            assert r.time_ms and r.gbps and r.of_copy and r.reps >= 5 and r.timer == "cuda-events"
        wrong = by[("scanweaver-swapped", C)]
        assert wrong.status == "wrong" and wrong.reason.startswith("wrong: max rel err")
        assert wrong.time_ms is None and wrong.gbps is None  # never timed
    assert by[("scanweaver-abi-reference", 64)].vs_best is not None


def test_sweep_stops_when_asked() -> None:
    stop = threading.Event()
    seen = []
    for rec in bench.sweep("16x256,16x512", baseline_names="cuda", stop=stop,
                           options=bench.Options(budget_ms=5.0, max_reps=5)):
        seen.append(rec)
        stop.set()
    assert len(seen) == 1 and seen[0].method == "copy (roofline)"


def test_general_recurrence_is_timed_on_its_own_inputs() -> None:
    pytest.importorskip("sympy")
    recs = list(bench.sweep("8x200", artifacts=[str(ART / "abi-selective")],
                            baseline_names="none", state_size=4,
                            options=bench.Options(budget_ms=10.0, max_reps=5)))
    own = recs[-1]
    assert own.status == "ok", own.reason
    assert own.bytes_moved and own.bytes_moved > 12 * 8 * 200 and own.vs_best is None


def test_run_command_checks_against_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ART / "abi-affine"), "-C", "33", "-L", "1000"]) == 0
    out = capsys.readouterr().out
    assert "OK: max error" in out and "h: shape (33, 1000)" in out


def test_run_command_flags_a_wrong_kernel(wrong_artifact: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(wrong_artifact), "-C", "4", "-L", "100"]) == 1
    assert "WRONG" in capsys.readouterr().out


def test_bench_command_writes_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    table = tmp_path / "b.txt"
    assert main(["bench", str(ART / "abi-affine"), "--sizes", "32x128", "--baselines", "cuda",
                 "--budget-ms", "5", "--quiet", "--json", str(out), "--table", str(table)]) == 0
    data = json.loads(out.read_text())
    assert data["environment"]["gpu"] and data["meta"]["command"].startswith("scanweaver bench")
    assert {r["method"] for r in data["results"]} == {"copy (roofline)", "cuda-sequential",
                                                      "scanweaver-abi-reference"}
    assert "scanweaver-abi-reference" in table.read_text()
