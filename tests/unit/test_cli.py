"""The ``scanweaver`` command line: argument parsing, options, and paths that need no GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from explorer import cli
from explorer.cli import DEFAULT_SIZES, CliError, build_parser, compile_options, main

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


def test_compile_arguments() -> None:
    args = build_parser().parse_args(["compile", AFFINE, "-o", "out", "--strategy",
                                      "sequential", "--block-size", "128", "--option",
                                      "elements-per-thread=8", "--option", "chip=sm_80"])
    assert args.command == "compile" and args.recurrence == AFFINE and args.output == "out"
    assert args.strategy == "sequential" and args.target == "cuda"
    assert compile_options(args) == {"block_size": 128, "elements_per_thread": 8,
                                     "chip": "sm_80"}


def test_compile_defaults_and_bad_option() -> None:
    args = build_parser().parse_args(["compile", AFFINE, "-o", "x"])
    assert args.strategy == "blelloch" and compile_options(args) == {}
    args = build_parser().parse_args(["compile", AFFINE, "-o", "x", "--option", "oops"])
    with pytest.raises(CliError, match="KEY=VALUE"):
        compile_options(args)


def test_compile_requires_output(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compile", AFFINE])
    assert "-o/--output" in capsys.readouterr().err


def test_run_and_bench_arguments() -> None:
    r = build_parser().parse_args(["run", "dir", "--channels", "7", "--length", "33"])
    assert (r.artifact, r.channels, r.length, r.state_size) == ("dir", 7, 33, 16)
    b = build_parser().parse_args(["bench", "d1", "d2", "--sizes", "4096x1024",
                                   "--baselines", "cuda,jax", "--json", "o.json", "--html",
                                   "o.html", "--no-copy"])
    assert b.artifacts == ["d1", "d2"] and b.sizes == "4096x1024"
    assert b.baselines == "cuda,jax" and b.json_path == "o.json" and b.html_path == "o.html"
    assert b.no_copy
    d = build_parser().parse_args(["bench"])
    assert d.artifacts == [] and d.sizes == DEFAULT_SIZES and d.baselines == "all"


def test_unknown_command_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["frobnicate"])
    assert "invalid choice" in capsys.readouterr().err


def test_run_and_bench_without_a_gpu_say_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import explorer.runtime.cuda as cuda
    from explorer.runtime.artifact import write_artifact
    from tests.unit.test_runtime_artifact import PTX, _manifest

    art = write_artifact(tmp_path / "art", PTX, _manifest())
    monkeypatch.setattr(cuda, "gpu_unavailable_reason", lambda: "no CUDA device: CuPy sees none")
    assert main(["run", str(art)]) == 2
    assert main(["bench", str(art)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "scanweaver run: cannot run on the GPU: no CUDA device: CuPy sees none",
        "scanweaver bench: cannot run on the GPU: no CUDA device: CuPy sees none"]


def test_recurrence_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "rec.txt"
    f.write_text(AFFINE + "\n")
    assert cli._read_recurrence(str(f)).strip() == AFFINE
    assert cli._read_recurrence(AFFINE) == AFFINE


def test_console_script_help_runs_without_the_compiler() -> None:
    code = ("import sys; sys.modules['mlir'] = None; sys.modules['sympy'] = None\n"
            "from explorer.cli import main\n"
            "try:\n    main(['bench', '--help'])\nexcept SystemExit as e:\n"
            "    assert e.code == 0\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--sizes" in out.stdout and "--baselines" in out.stdout


@pytest.mark.skipif(importlib.util.find_spec("mlir") is None, reason="needs the MLIR bindings")
def test_compile_writes_a_loadable_artifact(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from explorer.runtime.artifact import load_artifact

    out = tmp_path / "seq"
    assert main(["compile", AFFINE, "--strategy", "sequential", "-o", str(out)]) == 0
    art = load_artifact(out)
    assert art.strategy == "sequential" and art.recurrence == AFFINE
    assert "wrote" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("mlir") is None, reason="needs the MLIR bindings")
def test_compile_backward_writes_the_adjoints_artifact(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import explorer as ex
    from explorer.runtime.artifact import load_artifact

    text = ex.PRESETS["selective scan"]
    out = tmp_path / "bw"
    assert main(["compile", text, "--backward", "-o", str(out)]) == 0
    art = load_artifact(out)
    assert art.recurrence == ex.grad(text).text
    # backwards in time, the adjoint and the gradients summed over n stored
    assert set(art.outputs) == {"lam_h", "grad_sum_dt", "grad_sum_x"}
    assert "the backward: lam_h[t, n]" in capsys.readouterr().out
    assert main(["compile", text, "--backward", "--option", "reverse=false", "-o",
                 str(tmp_path / "bw2")]) != 0
    assert "always runs backwards in time" in capsys.readouterr().err
    assert not (tmp_path / "bw2").exists()


def test_report_from_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from explorer.bench.results import Record, gbps, save_json

    recs = [Record("copy (roofline)", "roofline", 8, 1024, "ok", time_ms=0.01,
                   gbps=gbps(8, 1024, 0.01)),
            Record("cuda-sequential", "baseline", 8, 1024, "ok", time_ms=0.04,
                   gbps=gbps(8, 1024, 0.04), max_rel_err=1e-7)]
    src = save_json(tmp_path / "r.json", recs, {"gpu": "Some GPU", "driver": "9"})
    table = tmp_path / "t.txt"
    args = ["report", str(src), "--table", str(table)]
    if importlib.util.find_spec("plotly") is not None:
        args += ["--html", str(tmp_path / "f.html")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("Some GPU, driver 9")
    assert "cuda-sequential" in table.read_text() and "0.250" in table.read_text()
    if "--html" in args:
        assert "cuda-sequential" in (tmp_path / "f.html").read_text()


def test_errors_are_reported_without_a_traceback(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"scanweaver run: {tmp_path}: not an artifact directory (no manifest.json)\n"


def test_the_reference_of_a_reversed_artifact_is_flipped_in_time(tmp_path):
    """`scanweaver run` checks a kernel compiled with reverse=True against the reference of
    the inputs flipped in time (the forward reference would call a correct kernel wrong)."""
    import numpy as np

    import explorer as ex
    from explorer.cli import reference_outputs

    text = "h[t] = a[t] * h[t-1] + b[t]"
    c = ex.compile(text, target="cuda", strategy="blelloch", reverse=True)
    kernel = ex.load(c.save(tmp_path / "rev"))
    rng = np.random.default_rng(5)
    a = rng.uniform(0.5, 1.0, (3, 50)).astype(np.float32)
    b = rng.standard_normal((3, 50)).astype(np.float32)
    refs, source = reference_outputs(kernel, {"a": a, "b": b})
    assert "flipped" in source
    cpu = ex.compile(text, target="cpu", strategy="blelloch", reverse=True)(a=a, b=b)
    np.testing.assert_allclose(refs["h"], cpu, rtol=1e-4, atol=1e-5)
    forward, _ = reference_outputs(ex.load(ex.compile(text, target="cuda").save(
        tmp_path / "fwd")), {"a": a, "b": b})
    assert not np.allclose(forward["h"], refs["h"])


@pytest.mark.parametrize("reverse", [False, True])
def test_run_checks_a_last_state_against_the_state_at_the_last_step(tmp_path: Path,
                                                                     reverse: bool) -> None:
    """A compile storing ``h_last`` alone is checked against the reference state after the
    last step of its scan (time L-1, or 0 scanning backwards), never against the trajectory."""
    import numpy as np

    import explorer as ex
    from explorer.cli import reference_outputs

    text = "h[t] = a[t] * h[t-1] + b[t]"
    kernel = ex.load(ex.compile(text, target="cuda", outputs=("h_last",), reverse=reverse)
                     .save(tmp_path / "last"))
    assert list(kernel.output_names) == ["h_last"]
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 1.0, (4, 40)).astype(np.float32)
    b = rng.standard_normal((4, 40)).astype(np.float32)
    refs, _ = reference_outputs(kernel, {"a": a, "b": b})
    assert set(refs) == {"h_last"} and refs["h_last"].shape == (4,)
    cpu = ex.compile(text, target="cpu", outputs=("h_last",), reverse=reverse)(a=a, b=b)
    np.testing.assert_allclose(refs["h_last"], cpu, rtol=1e-4, atol=1e-5)
