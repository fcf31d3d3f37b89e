"""Every way the command line can be given something wrong ends in one line on stderr and a
non-zero exit status: never a traceback, never a hang.

The cases are enumerated, not picked: every subcommand x every argument that names a path, given
each kind of thing a path can name (nothing, a directory, a FIFO, a binary file, an empty file, a
text file, a path under a file), and every option given a value of the wrong type or range.
A FIFO is never opened, so none of these can block (an alarm fails the test if one does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from explorer.cli import main
from explorer.runtime.artifact import write_artifact
from tests.unit.test_runtime_artifact import PTX, _manifest

ROOT = Path(__file__).resolve().parents[2]
AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
HAS_COMPILER = importlib.util.find_spec("mlir") is not None
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="needs the MLIR bindings")

#: the kinds of thing a path argument may name
KINDS = ("missing", "directory", "fifo", "binary", "empty", "text", "under a file")


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    def boom(*_: object) -> None:
        raise TimeoutError("the command blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with one thing of every kind, a good artifact and a good results file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCANWEAVER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "directory").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "binary").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "text").write_text("x\n")
    write_artifact(tmp_path / "art", PTX, _manifest())
    from explorer.bench.results import Record, save_json

    save_json(tmp_path / "results.json", [Record("copy (roofline)", "roofline", 8, 1024, "ok",
                                                 time_ms=0.01)], {"gpu": "Some GPU"})
    return tmp_path


def path_of(kind: str) -> str:
    return {"under a file": "text/x"}.get(kind, kind)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exit_:   # argparse's usage errors
        status = exit_.code if isinstance(exit_.code, int) else 1
    return status, capsys.readouterr().err


def check(status: int, err: str, command: str, expect: str, lines: int | None = 1) -> None:
    assert status not in (0, None), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.startswith(f"scanweaver {command}: "), err
    if lines is not None:
        assert err.count("\n") == lines, err
    assert expect in err, err


# --- paths read --------------------------------------------------------------------------------

RECURRENCE = {"missing": "no such file", "directory": "is a directory", "fifo": "is a FIFO",
              "binary": "not UTF-8", "empty": "the recurrence is empty",
              "text": "only statements of the form", "under a file": "no such file"}
ARTIFACT = {"missing": "(it does not exist)", "directory": "(no manifest.json)",
            "fifo": "(it is a FIFO)", "binary": "(it is a file)", "empty": "(it is a file)",
            "text": "(it is a file)", "under a file": "(it does not exist)"}
RESULTS = {"missing": "no such file", "directory": "is a directory", "fifo": "is a FIFO",
           "binary": "not UTF-8", "empty": "not valid JSON", "text": "not valid JSON",
           "under a file": "Not a directory"}


@pytest.mark.parametrize("kind", KINDS)
def test_recurrence_argument(world: Path, kind: str, capsys: pytest.CaptureFixture[str]
                             ) -> None:
    if kind in ("empty", "text") and not HAS_COMPILER:
        pytest.skip("the parser's message comes from explorer.compile")
    status, err = run_cli(["compile", path_of(kind), "-o", "out"], capsys)
    # a recurrence error shows the text with a caret under it: the lines after the first
    check(status, err, "compile", RECURRENCE[kind], None if kind == "text" else 1)
    assert not (world / "out").exists()


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("kind", KINDS)
def test_artifact_argument(world: Path, command: str, kind: str,
                           capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "art", path_of(kind)] if command == "bench" else ["run", path_of(kind)]
    status, err = run_cli(args, capsys)
    check(status, err, command, ARTIFACT[kind])
    assert path_of(kind) in err


@pytest.mark.parametrize("kind", KINDS)
def test_report_argument(world: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli(["report", path_of(kind)], capsys)
    check(status, err, "report", RESULTS[kind])


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


ARTIFACT_FILES = {
    "manifest is a FIFO": (lambda a: _replace(a / "manifest.json", os.mkfifo), "FIFO"),
    "manifest is a directory": (lambda a: _replace(a / "manifest.json", Path.mkdir),
                                "is a directory"),
    "manifest is binary": (lambda a: (a / "manifest.json").write_bytes(b"\xff" * 10),
                           "not UTF-8"),
    "manifest is not JSON": (lambda a: (a / "manifest.json").write_text("{"), "not valid JSON"),
    "manifest nests deeply": (lambda a: (a / "manifest.json").write_text("[" * 50000),
                              "nested deeper"),
    "manifest without hash": (lambda a: (a / "manifest.json").write_text(json.dumps(
        {k: v for k, v in json.loads((a / "manifest.json").read_text()).items()
         if k != "hash"})), "missing field 'hash'"),
    "ptx is a FIFO": (lambda a: _replace(a / "kernel.ptx", os.mkfifo), "FIFO"),
    "ptx is a link": (lambda a: _replace(a / "kernel.ptx", lambda p: p.symlink_to("/etc/hostname")
                                         ), "symbolic link"),
    "ptx changed": (lambda a: (a / "kernel.ptx").write_text(PTX + "// edited\n"),
                    "hash mismatch"),
}


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("case", list(ARTIFACT_FILES))
def test_damaged_artifacts(world: Path, command: str, case: str,
                           capsys: pytest.CaptureFixture[str]) -> None:
    damage, expect = ARTIFACT_FILES[case]
    damage(world / "art")
    status, err = run_cli([command, "art"], capsys)
    check(status, err, command, expect)


RESULT_FILES = {
    "nested": ("[" * 100000, "nested too deeply"),
    "a list": ("[1, 2]", "no 'results' list"),
    "no results": ('{"environment": {}}', "no 'results' list"),
    "results not a list": ('{"results": {}}', "no 'results' list"),
    "environment not an object": ('{"results": [], "environment": 3}', "'environment'"),
    "a result not an object": ('{"results": [5]}', "results[0] is malformed"),
    "a result without fields": ('{"results": [{"method": "m"}]}', "results[0] is malformed"),
    "a count of the wrong type": ('{"results": [{"method": "m", "kind": "baseline", "C": "x", '
                                  '"L": 4, "status": "ok"}]}', "results[0].C must be an integer"),
    "a time of the wrong type": ('{"results": [{"method": "m", "kind": "baseline", "C": 1, '
                                 '"L": 4, "status": "ok", "time_ms": "soon"}]}',
                                 "results[0] is malformed"),
    "extra of the wrong type": ('{"results": [{"method": "m", "kind": "baseline", "C": 1, '
                                '"L": 4, "status": "ok", "extra": []}]}',
                                "results[0].extra must be an object"),
}


@pytest.mark.parametrize("case", list(RESULT_FILES))
def test_malformed_results(world: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    text, expect = RESULT_FILES[case]
    (world / "bad.json").write_text(text)
    status, err = run_cli(["report", "bad.json"], capsys)
    check(status, err, "report", expect)


def test_an_oversized_results_file_is_not_read(world: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from explorer.cli import RESULTS_LIMIT

    with open(world / "huge.json", "wb") as f:
        f.truncate(RESULTS_LIMIT + 1)   # sparse: refused before reading
    status, err = run_cli(["report", "huge.json"], capsys)
    check(status, err, "report", "more than")


# --- paths written -------------------------------------------------------------------------

OUTPUT_DIR = {"fifo": "is a FIFO, not a directory", "binary": "is a file, not a directory",
              "text": "is a file, not a directory", "under a file": "is not a directory"}
OUTPUT_FILE = {"fifo": "is a FIFO, not a file", "directory": "is a directory, not a file",
               "under a file": "is not a directory"}


@pytest.mark.parametrize("kind", list(OUTPUT_DIR))
def test_compile_output(world: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli(["compile", AFFINE, "-o", path_of(kind)], capsys)
    check(status, err, "compile", OUTPUT_DIR[kind])
    assert f"-o {path_of(kind)}" in err


@pytest.mark.parametrize("flag", ["--json", "--html", "--table"])
@pytest.mark.parametrize("kind", list(OUTPUT_FILE))
def test_bench_outputs(world: Path, flag: str, kind: str,
                       capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli(["bench", "art", flag, path_of(kind)], capsys)
    check(status, err, "bench", OUTPUT_FILE[kind])
    assert f"{flag} {path_of(kind)}" in err


@pytest.mark.parametrize("flag", ["--html", "--table"])
@pytest.mark.parametrize("kind", list(OUTPUT_FILE))
def test_report_outputs(world: Path, flag: str, kind: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli(["report", "results.json", flag, path_of(kind)], capsys)
    check(status, err, "report", OUTPUT_FILE[kind])
    assert "Some GPU" not in err


def test_an_unwritable_place_is_one_line(world: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    # /proc refuses new files even to root; the check before writing lets it through (it is a
    # directory), so this is the error of the write itself
    status, err = run_cli(["report", "results.json", "--table", "/proc/scanweaver.txt"],
                          capsys)
    check(status, err, "report", "/proc/scanweaver.txt")


@needs_compiler
def test_a_directory_in_place_of_an_artifact_file(world: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (world / "out" / "kernel.ptx").mkdir(parents=True)
    status, err = run_cli(["compile", AFFINE, "--strategy", "sequential", "-o", "out"], capsys)
    check(status, err, "compile", "kernel.ptx: Is a directory")


# --- option values ---------------------------------------------------------------------------

COUNTS = {"x": "must be an integer >= 1", "0": "must be an integer >= 1",
          "-1": "must be an integer >= 1", "1.5": "must be an integer >= 1"}
SEEDS = {"x": "must be an integer >= 0", "-1": "must be an integer >= 0"}
NUMBERS = {"x": "must be a positive number", "0": "must be a positive number",
           "-1": "must be a positive number", "nan": "must be a positive number",
           "inf": "must be a positive number"}


def _option_cases() -> Iterator[object]:
    for command, base in (("run", ["run", "art"]), ("bench", ["bench", "art"])):
        flags = {"--state-size": COUNTS, "--seed": SEEDS, "--tolerance": NUMBERS}
        if command == "run":
            flags |= {"--channels": COUNTS, "--length": COUNTS}
        else:
            flags |= {"--budget-ms": NUMBERS}
        for flag, values in flags.items():
            for value, expect in values.items():
                yield pytest.param([*base, flag, value], command, expect, 2,
                                   id=f"{command} {flag} {value}")
    compile_ = ["compile", AFFINE, "-o", "out"]
    for args, expect, status in [
        (["--block-size", "x"], "invalid int value: 'x'", 2),
        (["--block-size", "3"], "block_size must be a power of two in [32, 1024], got 3", 1),
        (["--block-size", "-1"], "block_size must be a power of two", 1),
        (["--elements-per-thread", "0"], "elements_per_thread must be a power of two", 1),
        (["--elements-per-thread", "x"], "invalid int value", 2),
        (["--strategy", "nope"], "unknown strategy 'nope'", 1),
        (["--target", "nope"], "unknown target 'nope'", 1),
        (["--target", "cpu"], "--target cpu: an artifact holds PTX", 1),
        (["--chip", "sm_1"], "unknown chip 'sm_1'", 1),
        (["--chip", ""], "unknown chip ''", 1),
        (["--option", "oops"], "--option takes KEY=VALUE, got 'oops'", 1),
        (["--option", "unknown=1"], "unknown option unknown", 1),
        (["--option", "=1"], "--option takes KEY=VALUE, got '=1'", 1),
        (["--option", "chip=5"], "unknown chip 5", 1),
        (["--option", "block_size=[1]"], "block_size must be an integer power of two", 1),
        (["--option", "chunk_tiles=true"], "chunk_tiles must be an integer", 1),
        (["--option", "opt_level=9"], "opt_level must be 0, 1, 2 or 3", 1),
        (["--option", "dtype=float64"], "unsupported dtype 'float64'", 1),
        (["--option", "chip=" + "[" * 5000], "unknown chip", 1),
        (["--bogus"], "unrecognized arguments: --bogus", 2),
    ]:
        yield pytest.param(compile_ + args, "compile", expect, status,
                           id="compile " + " ".join(args)[:40])
    for sizes, expect in [("3y4", "a size is CxL"), ("", "no sizes given"),
                          (",", "no sizes given"), ("0x5", "sizes must be positive"),
                          ("4x", "not an integer: ''"), ("2^x" + "x3", "a size is CxL"),
                          ("ax3", "not an integer: 'a'")]:
        yield pytest.param(["bench", "art", "--sizes", sizes], "bench", expect, 1,
                           id=f"bench --sizes {sizes!r}")
    for names in ("nope", "cuda,nope"):
        yield pytest.param(["bench", "--baselines", names], "bench", "unknown baseline 'nope'",
                           1, id=f"bench --baselines {names}")


@pytest.mark.parametrize("argv, command, expect, status", list(_option_cases()))
def test_option_values(world: Path, argv: list[str], command: str, expect: str, status: int,
                       capsys: pytest.CaptureFixture[str]) -> None:
    got, err = run_cli(argv, capsys)
    check(got, err, command, expect)
    assert got == status, err
    if status == 2:
        assert err.rstrip().endswith(f"(see scanweaver {command} --help)")
    assert not (world / "out").exists()


def test_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli([], capsys)
    assert status == 2 and err.count("\n") == 1
    assert "the following arguments are required: COMMAND" in err


# --- the console command itself ------------------------------------------------------------

def _console(args: list[str | bytes], cwd: Path, stdin: bytes = b""
             ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "explorer.cli", *args], input=stdin,
                          capture_output=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("args, stdin, expect", [
    (["compile", "fifo", "-o", "out"], b"", "recurrence file: fifo is a FIFO, not a file"),
    (["compile", "-", "-o", "out"], b"\xff\xfe", "recurrence on stdin: not UTF-8 text"),
    (["compile", b"\xff", "-o", "out"], b"", "no such file, and not a recurrence"),
    (["run", "fifo"], b"", "fifo: not an artifact directory (it is a FIFO)"),
    (["bench", "art", "--json", "fifo"], b"", "--json fifo: is a FIFO, not a file"),
    (["report", "fifo"], b"", "JSON: fifo is a FIFO, not a file"),
    (["report", "binary"], b"", "not UTF-8 text"),
])
def test_the_console_command(world: Path, args: list[str | bytes], stdin: bytes,
                             expect: str) -> None:
    out = _console(args, world, stdin)
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 1, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert expect in err, err


# --- what is left: an error nobody foresaw, an interrupt --------------------------------------

def test_an_unforeseen_error_is_one_line_too(world: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from explorer import cli

    def broken(args: object) -> int:
        raise TypeError("something\nwent wrong")

    monkeypatch.setattr(cli, "cmd_report", broken)
    status, err = run_cli(["report", "results.json"], capsys)
    assert status == 3
    assert err == ("scanweaver report: internal error (TypeError: something went wrong); set "
                   "SCANWEAVER_DEBUG=1 for the traceback\n")
    monkeypatch.setenv("SCANWEAVER_DEBUG", "1")
    with pytest.raises(TypeError):
        main(["report", "results.json"])


def test_an_interrupt(world: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    from explorer import cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_report", interrupted)
    assert run_cli(["report", "results.json"], capsys) == (130, "scanweaver report: interrupted\n")
