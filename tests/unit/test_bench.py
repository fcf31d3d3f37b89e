"""Benchmark pieces that need no GPU: the float64 reference, sizes, ratios, table, JSON, figure."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from explorer.bench.affine import (
    affine_roles,
    affine_scan_f64,
    form_roles,
    max_rel_error,
    random_problem,
)
from explorer.bench.methods import ALIASES, BASELINES, baselines
from explorer.bench.results import (
    Record,
    finalize,
    format_table,
    gbps,
    load_json,
    save_html,
    save_json,
    to_json,
)
from explorer.bench.sweep import _Printer, parse_sizes
from explorer.bench.timing import choose_reps


def _loop(a: np.ndarray, b: np.ndarray, h0: np.ndarray | None = None) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    out = np.empty_like(a64)
    h = np.zeros(a.shape[0]) if h0 is None else h0.astype(np.float64)
    for t in range(a.shape[1]):
        h = a64[:, t] * h + b64[:, t]
        out[:, t] = h
    return out


@pytest.mark.parametrize("C, L", [(1, 1), (3, 33), (2, 4096), (2, 5000), (1, 20000)])
def test_reference_matches_a_plain_loop(C: int, L: int) -> None:
    a, b = random_problem(C, L, seed=L)
    h0 = np.linspace(-1, 1, C)
    got = affine_scan_f64(a, b, h0=h0)
    assert got.dtype == np.float64 and got.shape == (C, L)
    assert max_rel_error(got, _loop(a, b, h0)) < 1e-12


def test_reference_refuses_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="C, L"):
        affine_scan_f64(np.ones((2, 3)), np.ones((2, 4)))


def test_random_problem_is_seeded_float32_with_decays_in_range() -> None:
    a, b = random_problem(4, 100, seed=1)
    a2, _ = random_problem(4, 100, seed=1)
    assert a.dtype == np.float32 and b.dtype == np.float32
    assert np.array_equal(a, a2)
    assert a.min() >= 0.5 and a.max() <= 1.0


def test_max_rel_error_scales_and_flags_nan() -> None:
    ref = np.array([1.0, -4.0, 2.0])
    assert max_rel_error(ref + np.array([0, 0.004, 0]), ref) == pytest.approx(1e-3)
    assert max_rel_error(np.array([1.0, np.nan, 2.0]), ref) == math.inf
    assert max_rel_error(np.zeros(3), np.zeros(3)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        max_rel_error(np.zeros(2), np.zeros(3))


@pytest.mark.parametrize("text, roles", [
    ("h[t] = a[t] * h[t-1] + b[t]", ("h", "a", "b")),
    ("h[t]=h[t-1]*g[t]+x[t]", ("h", "g", "x")),
    ("y[t] = u[t] + d[t] * y[t-1]", ("y", "d", "u")),
    # spellings a pattern over the text missed: the decomposition sees the same scan
    ("h[t] = b[t] + (h[t-1]) * a[t]", ("h", "a", "b")),
    ("s[t] = x[t]*s[t-1] + y[t]  # a comment", ("s", "x", "y")),
    ("h[t] = a[t] * h[t-1] + b[t] + 0 * b[t]", ("h", "a", "b")),
    # not the scan the baselines solve
    ("h[t] = 0.9 * h[t-1] + x[t]", None),
    ("h[t] = a[t] * h[t-2] + b[t]", None),
    ("h[t] = a[t] * h[t-1] + b[t]\ny[t] = h[t]", None),
    ("h[t] = a[t] * h[t-1] + a[t]", None),
    ("h[t] = a[t] * h[t-1] + b[t] * c[t]", None),
    ("h[t] = a[t] * (h[t-1] + b[t])", None),
    ("h[t] = g * h[t-1] + b[t]", None),
    ("h[t] = a[t] * h[t-1] + b[t] + c", None),
    ("h[t, n] = a[t] * h[t-1, n] + b[t]", None),
    ("h[t] = exp(a[t]) * h[t-1] + b[t]", None),
])
def test_affine_roles_come_from_the_decomposition(text: str,
                                                  roles: tuple[str, str, str] | None) -> None:
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose

    assert affine_roles(text) == roles
    rec = Recurrence.parse(text)
    assert affine_roles(rec) == roles == form_roles(decompose(rec))


def test_the_bench_recognises_no_text_pattern() -> None:
    import explorer.bench.affine as affine

    source = Path(affine.__file__).read_text()
    assert "import re" not in source and "re.fullmatch" not in source


def test_parse_sizes() -> None:
    assert parse_sizes("4096x1024, 16x2^20,1x2**26") == [(4096, 1024), (16, 2**20), (1, 2**26)]
    assert parse_sizes([(2, 3)]) == [(2, 3)]
    for bad in ("4096", "4x4x4", "ax3", "0x5", ""):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_baseline_names_and_aliases() -> None:
    assert [m.name for m in baselines("cuda,jax")] == ["cuda-sequential",
                                                       "jax-associative-scan"]
    assert len(baselines("all")) == len(BASELINES) == len(baselines(None))
    assert baselines("none") == []
    assert all(v in BASELINES for v in ALIASES.values())
    with pytest.raises(ValueError, match="unknown baseline"):
        baselines("nope")


def test_choose_reps() -> None:
    assert choose_reps(10.0, 300.0, 5, 100) == 30
    assert choose_reps(1000.0, 300.0, 5, 100) == 5
    assert choose_reps(0.001, 300.0, 5, 100) == 100


def _records() -> list[Record]:
    C, L = 16, 1 << 20

    def rec(method: str, kind: str, ms: float | None, status: str = "ok",
            reason: str = "") -> Record:
        return Record(method, kind, C, L, status, time_ms=ms,
                      gbps=gbps(C, L, ms) if ms else None, reason=reason,
                      max_rel_err=1e-7 if status == "ok" and kind != "roofline" else None,
                      timer="cuda-events", reps=10)

    return [rec("copy (roofline)", "roofline", 0.1), rec("cuda-sequential", "baseline", 2.0),
            rec("cub", "baseline", 0.4), rec("jax", "baseline", None, "skipped", "skipped: no"),
            rec("scanweaver-blelloch", "generated", 0.2),
            rec("scanweaver-bad", "generated", None, "wrong", "wrong: max rel err 1e+00")]


def test_ratios() -> None:
    recs = finalize(_records())
    by = {r.method: r for r in recs}
    assert by["copy (roofline)"].of_copy == pytest.approx(1.0)
    assert by["copy (roofline)"].vs_best is None
    assert by["scanweaver-blelloch"].of_copy == pytest.approx(0.5)
    assert by["scanweaver-blelloch"].vs_best == pytest.approx(2.0)  # cub 0.4 / 0.2
    assert by["cub"].vs_best == pytest.approx(1.0)
    assert by["cuda-sequential"].vs_best == pytest.approx(0.2)
    assert by["jax"].of_copy is None and by["scanweaver-bad"].vs_best is None
    assert gbps(16, 1 << 20, 0.2) == pytest.approx(12 * 16 * (1 << 20) / 0.2e-3 / 1e9)


def test_table_lists_every_record_with_reasons() -> None:
    text = format_table(_records(), title="GPU X")
    lines = text.splitlines()
    assert lines[0] == "GPU X"
    assert "of copy" in lines[1] and "vs best base" in lines[1]
    body = "\n".join(lines[3:])
    for name in ("copy (roofline)", "cuda-sequential", "scanweaver-blelloch", "jax"):
        assert name in body
    assert "wrong: max rel err" in body and "skipped: no" in body
    row = next(line for line in lines if "scanweaver-blelloch" in line).split()
    assert row[:3] == ["16x2^20", "scanweaver-blelloch", "ok"]
    assert row[3:8] == ["0.2000", "1006.6", "0.500", "2.000", "1.0e-07"]


def test_json_round_trip(tmp_path: Path) -> None:
    env = {"gpu": "Test GPU", "driver": "1.0", "libraries": {"numpy": np.__version__}}
    recs = _records()
    recs[1].max_rel_err = math.inf
    path = save_json(tmp_path / "b.json", recs, env, {"command": "scanweaver bench x"})
    data = json.loads(path.read_text())
    assert data["environment"]["gpu"] == "Test GPU" and data["meta"]["command"]
    assert data["bytes_per_element"] == 12
    back, env2 = load_json(path)
    assert env2 == env
    assert [r.method for r in back] == [r.method for r in recs]
    assert back[1].max_rel_err == math.inf
    assert to_json(recs, env)["results"][4]["vs_best"] == pytest.approx(2.0)


def test_figure_has_a_line_per_timed_method_and_the_roofline(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    recs = _records() + [Record("copy (roofline)", "roofline", 4096, 1024, "ok", time_ms=0.05,
                                gbps=gbps(4096, 1024, 0.05))]
    from explorer.bench.results import figure

    fig = figure(recs)
    names = [t.name for t in fig.data]
    assert names == ["copy (roofline)", "cuda-sequential", "cub", "scanweaver-blelloch"]
    roof = fig.data[0]
    assert list(roof.x) == [1024, 1 << 20] and roof.line.dash == "dash"
    out = save_html(tmp_path / "f.html", recs, include_plotlyjs="cdn")
    assert "scanweaver-blelloch" in out.read_text()


def test_progress_printer(capsys: pytest.CaptureFixture[str]) -> None:
    p = _Printer(2)
    recs = _records()
    p(1, 2, recs[4])
    p(2, 2, recs[3])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[1/2] 16x1048576 scanweaver-blelloch: 0.2000 ms")
    assert err[1] == "[2/2] 16x1048576 jax: skipped: skipped: no"


def test_artifacts_of_one_strategy_get_distinct_names() -> None:
    from explorer.bench.methods import Method
    from explorer.bench.sweep import distinct_names

    def setup(p: Any) -> Any:
        raise AssertionError("not run")

    def m(name: str, path: str) -> Method:
        return Method(name, "generated", setup, artifact=path)

    got = distinct_names([m("scanweaver-blelloch", "x/blelloch"), m("scanweaver-sequential",
                          "x/seq"), m("scanweaver-blelloch", "x/b512"),
                          m("scanweaver-blelloch", "x/b1024")])
    assert [g.name for g in got] == ["scanweaver-blelloch (blelloch)", "scanweaver-sequential",
                                     "scanweaver-blelloch (b512)", "scanweaver-blelloch (b1024)"]


def test_other_recurrences_compare_bandwidth_not_time() -> None:
    C, L = 8, 4096
    copy = Record("copy (roofline)", "roofline", C, L, "ok", time_ms=0.01, gbps=gbps(C, L, 0.01))
    base = Record("cub", "baseline", C, L, "ok", time_ms=0.02, gbps=gbps(C, L, 0.02))
    moved = 40 * C * L
    own = Record("scanweaver-blelloch", "generated", C, L, "ok", time_ms=0.05,
                 gbps=gbps(C, L, 0.05, moved), bytes_moved=moved)
    finalize([copy, base, own])
    assert own.bytes == moved
    assert own.of_copy == pytest.approx((moved / 0.05) / (12 * C * L / 0.01))
    assert own.vs_best is None  # no baseline solves that problem
    assert base.of_copy == pytest.approx(0.5)


def test_random_inputs_follow_the_kernel(tmp_path: Path) -> None:
    from explorer.bench.inputs import random_inputs
    from explorer.runtime.artifact import write_artifact
    from explorer.runtime.cuda import CudaKernel
    from tests.unit.test_runtime_artifact import PTX, _manifest, ptx_entry

    def arg(name: str, role: str, timed: bool, lane: bool) -> dict[str, Any]:
        return {"name": name, "role": role, "timed": timed, "lane": lane}

    m = _manifest(recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + D * dt[t] * B[t, n]",
                  outputs=["h"], vector=True)
    m["kernels"][0]["args"] = [arg("dt", "input", True, False), arg("B", "input", True, True),
                               arg("A", "param", False, True), arg("D", "param", False, False),
                               arg("h", "output", True, True)]
    kernel = CudaKernel.from_artifact(write_artifact(tmp_path / "k", ptx_entry("scan_kernel", 5),
                                                     m))
    arrays = random_inputs(kernel, C=3, L=10, N=4, seed=1)
    assert {k: v.shape for k, v in arrays.items()} == {"dt": (3, 10), "B": (3, 4, 10),
                                                       "A": (3, 4), "D": (3,)}
    assert all(v.dtype == np.float32 for v in arrays.values())
    assert arrays["dt"].min() > 0 and arrays["A"].max() < 0
    affine = CudaKernel.from_artifact(write_artifact(tmp_path / "a", PTX, _manifest()))
    a = random_inputs(affine, C=2, L=50)["a"]
    assert a.min() >= 0.5 and a.max() <= 1.0


# -- recurrences other than the affine scan: their own inputs, L, the reversed scan ---------------

def _artifact(tmp_path: Path, text: str, **options: Any) -> Any:
    pytest.importorskip("mlir.ir", reason="compiling needs MLIR's Python bindings")
    import explorer as ex
    from explorer.runtime.artifact import load_artifact

    c = ex.compile(text, target="cuda", strategy="blelloch", block_size=32,
                   elements_per_thread=2, **options)
    return c, load_artifact(c.save(tmp_path / "art"))


@pytest.mark.parametrize("text", [
    "h[t] = 0.9 * h[t-1] + 1",            # no array at all
    "h[t] = a * h[t-1] + 1",              # a parameter decay, nothing indexed by time
    "h[t] = a[t] * h[t-1] + b[t]\ny[t] = 2 * h[t]",   # a readout: not the baselines' scan
    "h[t] = a[t] * h[t-1] + c * h[t-2] + x[t]",      # second order: two decays in a row
])
def test_general_problems_pass_the_length_when_no_input_is_timed(tmp_path: Path,
                                                                 text: str) -> None:
    from explorer.bench.generated import artifact_roles, general_problem
    from explorer.bench.methods import Skip
    from explorer.runtime.cuda import CudaKernel

    c, art = _artifact(tmp_path, text)
    with pytest.raises(Skip, match="scalar affine scan"):
        artifact_roles(art)
    kernel = CudaKernel.from_artifact(art)
    C, L = 3, 70
    g = general_problem(art, kernel, C, L, N=4)
    timed = any(s.timed for s in kernel.specs)
    assert g.L == (None if timed else L)
    kernel.check(L=g.L, **g.arrays)   # what the sweep's launch is given is a valid call
    # the reference the sweep checks against is what the compiled kernel computes (CPU here)
    got = c(device="cpu", L=g.L, **g.arrays)
    outs = got if isinstance(got, dict) else {kernel.output_names[0]: got}
    for name, ref in g.refs.items():
        assert np.shape(ref)[-1] == L
        assert np.all(np.isfinite(ref)) and np.abs(ref).max() < 1e3, name   # inputs stable
        assert max_rel_error(outs[name], ref) < 1e-5, name


def test_decays_keep_every_state_bounded() -> None:
    from explorer.bench.inputs import decay_bounds

    assert decay_bounds("h[t] = a[t] * h[t-1] + b[t]") == {"a": 1.0}
    assert decay_bounds("h[t] = g * h[t-1] + x[t]") == {"g": 1.0}
    assert decay_bounds("h[t] = a[t] * h[t-1] + c * h[t-2] + x[t]") == {"a": 0.5, "c": 0.5}
    assert decay_bounds("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + x[t]") == {}


def test_a_reversed_recurrence_is_checked_against_the_flipped_reference(tmp_path: Path) -> None:
    from explorer.bench.generated import general_problem, reversed_in_time
    from explorer.runtime.cuda import CudaKernel

    text = "h[t] = a[t] * h[t-1] + b[t] * x\ny[t] = h[t] + x"
    c, art = _artifact(tmp_path, text, reverse=True)
    assert reversed_in_time(art)
    kernel = CudaKernel.from_artifact(art)
    g = general_problem(art, kernel, 2, 90, N=4)
    got = c(device="cpu", **g.arrays)
    outs = got if isinstance(got, dict) else {kernel.output_names[0]: got}
    assert set(g.refs) == set(kernel.output_names) == {"y"}   # what the compile stores
    for name, ref in g.refs.items():
        assert max_rel_error(outs[name], ref) < 1e-5, name


def test_a_reversed_affine_scan_is_still_the_baselines_problem(tmp_path: Path) -> None:
    from explorer.bench.generated import artifact_roles, reversed_in_time

    _, art = _artifact(tmp_path, "h[t] = a[t] * h[t-1] + b[t]", reverse=True)
    assert artifact_roles(art) == ("h", "a", "b") and reversed_in_time(art)


@pytest.mark.parametrize(("text", "reverse"), [
    ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
     "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]", False),
    ("h[t] = a[t] * h[t-1] + b[t] * x\ny[t] = h[t] + x", True),
    ("h[t] = a * h[t-1] + 1", False),
])
def test_a_problem_past_the_reference_limit_is_checked_on_a_sample(tmp_path: Path, text: str,
                                                                   reverse: bool) -> None:
    """Past the limit the reference covers sampled channels (the first and the last among
    them), and if one channel is too long, its first steps (its last, backwards): what the
    kernel computes there is what the sample's reference says, and a wrong value in a
    sampled channel is caught."""
    from explorer.bench.generated import general_problem
    from explorer.runtime.cuda import CudaKernel

    c, art = _artifact(tmp_path, text, reverse=reverse)
    kernel = CudaKernel.from_artifact(art)
    C, L, N = 9, 200, 4
    lanes = N if kernel.vector else 1
    for limit, count, span in ((3 * 200 * lanes, 3, 200), (2 * 50 * lanes, 1, 100)):
        g = general_problem(art, kernel, C, L, N, limit=limit)
        channels = list(g.channels)
        assert len(channels) == count and channels[0] == 0 and (count == 1 or
                                                                  channels[-1] == C - 1)
        assert g.steps == (slice(L - span, L) if reverse else slice(0, span))
        assert "checked on" in g.described
        got = c(device="cpu", L=g.L, **g.arrays)
        outs = got if isinstance(got, dict) else {kernel.output_names[0]: got}
        for name, ref in g.refs.items():
            assert np.shape(ref)[0] == count and np.shape(ref)[-1] == span
            sample = g.sample(np.asarray(outs[name]), name)
            assert max_rel_error(sample, ref) < 1e-5, name
            broken = np.array(outs[name], copy=True)
            broken.reshape(C, -1)[channels[-1], -1 if reverse else 0] += 1.0
            assert max_rel_error(g.sample(broken, name), ref) > 1e-3, name
    whole = general_problem(art, kernel, C, L, N)
    assert whole.channels is None and whole.described == "checked whole"


def test_a_compile_storing_last_states_alone_is_skipped_with_its_reason(tmp_path: Path) -> None:
    """The sweep checks outputs over time: an affine scan compiled to store ``h_last`` alone
    leaves the baselines' path (which would read its one value a channel as the trajectory)
    and is skipped, saying why, before anything runs on a GPU."""
    from explorer.bench.generated import generated
    from explorer.bench.methods import Problem, Skip

    _, art = _artifact(tmp_path, "h[t] = a[t] * h[t-1] + b[t]", outputs=("h_last",))
    assert art.outputs == ("h_last",)
    method = generated(tmp_path / "art")
    with pytest.raises(Skip, match="h_last only"):
        method.setup(Problem(C=4, L=64, a=None, b=None))
    # storing the trajectory keeps the baselines' path (its dtype check comes first)
    _, full = _artifact(tmp_path / "full", "h[t] = a[t] * h[t-1] + b[t]")
    assert full.outputs == ("h",)
    with pytest.raises(Skip, match="compiled for float32"):
        generated(tmp_path / "full" / "art").setup(Problem(C=4, L=64, a=None, b=None,
                                                          dtype="bfloat16"))


def test_the_table_names_the_kernels_a_record_ran_and_ignores_odd_ones(tmp_path: Path) -> None:
    """``extra.kernels`` (our methods: which of a compile's kernels the shape launched) is the
    table's note beside the repetitions; from a file, anything else there is left out."""
    def rec(extra: Any) -> Record:
        return Record("scanweaver-blelloch", "generated", 4, 4096, "ok", time_ms=0.01,
                      gbps=1.0, reps=10, timer="cuda-events", extra=extra)

    good = rec({"kernels": ["blelloch_short"]})
    path = save_json(tmp_path / "r.json", [good])
    back, _ = load_json(path)
    assert back[0].extra == {"kernels": ["blelloch_short"]}
    assert "10 reps, cuda-events; ran blelloch_short" in format_table(back)
    for odd in ({"kernels": 5}, {"kernels": "blelloch"}, {"kernels": [1, 2]}, {"kernels": []},
                [], None, {"kernels": [{"x": 1}]}):
        table = format_table([rec(odd)])
        assert "10 reps, cuda-events" in table and "ran" not in table, odd
    long = format_table([rec({"kernels": ["k" * 500] * 50})])
    assert "k" * 61 not in long

