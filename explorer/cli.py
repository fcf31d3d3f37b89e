"""The ``scanweaver`` console command: compile a recurrence, run an artifact, benchmark artifacts.

    scanweaver compile "h[t] = a[t] * h[t-1] + b[t]" --strategy blelloch -o out/blelloch
    scanweaver run out/blelloch --channels 4096 --length 1024
    scanweaver bench out/blelloch out/sequential --sizes 4096x1024,16x2^20 \\
        --baselines all --json bench.json --html bench.html
    scanweaver report bench.json --html bench.html     # figure from saved results

``compile`` needs the compiler (sympy, MLIR); ``run`` and ``bench`` need NumPy and CuPy only
(PyTorch, JAX, cuda-cccl and accelerated-scan are used by ``bench`` when they import).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_SIZES = "4096x1024,16x2^20,131072x2048,1x2^26"


def _option_value(text: str) -> Any:
    """``--option k=v`` values: JSON when it parses (numbers, booleans), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scanweaver",
        description="Compile affine recurrences to GPU kernels, run and benchmark them.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("compile", help="compile a recurrence into an artifact directory")
    c.add_argument("recurrence", help="the recurrence text, e.g. 'h[t] = a[t] * h[t-1] + b[t]' "
                                      "(a file name or '-' reads it from that file / stdin)")
    c.add_argument("-o", "--output", required=True, help="artifact directory to write")
    c.add_argument("--strategy", default="blelloch", help="scan strategy (default: blelloch)")
    c.add_argument("--target", default="cuda", help="cuda or cpu (default: cuda)")
    c.add_argument("--block-size", type=int, default=None, help="threads per block")
    c.add_argument("--elements-per-thread", type=int, default=None)
    c.add_argument("--chip", default=None, help="e.g. sm_90")
    c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other compile option (repeatable)")

    r = sub.add_parser("run", help="run an artifact on random inputs and check it")
    r.add_argument("artifact", help="artifact directory")
    r.add_argument("--channels", "-C", type=int, default=4096)
    r.add_argument("--length", "-L", type=int, default=1024)
    r.add_argument("--state-size", "-N", type=int, default=16,
                   help="lane count N for vector (Mamba) states (default 16)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--tolerance", type=float, default=None,
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
    b.add_argument("--tolerance", type=float, default=None)
    b.add_argument("--budget-ms", type=float, default=300.0,
                   help="timing budget per method and size (default 300 ms)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--no-flush", action="store_true",
                   help="do not evict L2 between timed launches")
    b.add_argument("--state-size", "-N", type=int, default=16,
                   help="lanes N for artifacts with vector (Mamba) states (default 16)")
    b.add_argument("--quiet", action="store_true", help="no progress display")

    p = sub.add_parser("report", help="table and figure from a bench JSON file (no GPU needed)")
    p.add_argument("json_in", metavar="JSON", help="a file written by scanweaver bench --json")
    p.add_argument("--html", dest="html_path", default=None, help="write the plotly figure")
    p.add_argument("--table", dest="table_path", default=None, help="write the text table")
    return parser


def _read_recurrence(text: str) -> str:
    if text == "-":
        return sys.stdin.read()
    p = Path(text)
    if "[" not in text and p.is_file():
        return p.read_text()
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
        if "=" not in item:
            raise SystemExit(f"scanweaver compile: --option takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        opts[key.strip().replace("-", "_")] = _option_value(value)
    return opts


def cmd_compile(args: argparse.Namespace) -> int:
    import explorer

    text = _read_recurrence(args.recurrence)
    t0 = time.perf_counter()
    compiled = explorer.compile(text, target=args.target, strategy=args.strategy,
                                **compile_options(args))
    compiled.save(args.output)
    print(f"wrote {args.output} ({args.strategy}, {args.target}) in "
          f"{time.perf_counter() - t0:.2f} s")
    return 0


def reference_outputs(kernel: Any, arrays: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The float64 reference: ``explorer.reference`` where sympy imports, else the affine scan
    computed from the arrays directly (for the plain affine recurrence)."""
    import numpy as np

    names = kernel.output_names
    try:
        import explorer

        ref = explorer.reference(kernel.artifact.recurrence, **arrays)
        refs = ref if isinstance(ref, dict) else {names[0]: ref}
        return {k: np.asarray(v) for k, v in refs.items()}, "explorer.reference"
    except ImportError:
        pass
    from explorer.bench.affine import affine_roles, affine_scan_f64

    roles = affine_roles(kernel.artifact.recurrence)
    if roles is None:
        raise SystemExit("no float64 reference here: explorer.reference needs sympy for "
                         f"{kernel.artifact.recurrence!r}")
    state, a, b = roles
    return {state: affine_scan_f64(arrays[a], arrays[b])}, "affine scan (NumPy, float64)"


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from explorer.bench.affine import TOLERANCE, max_rel_error
    from explorer.bench.inputs import random_inputs
    from explorer.runtime.artifact import load_artifact
    from explorer.runtime.cuda import CudaKernel, gpu_available

    art = load_artifact(args.artifact)
    if not gpu_available():
        print("scanweaver run: no CUDA device (CuPy with a GPU is needed)", file=sys.stderr)
        return 2
    kernel = CudaKernel.from_artifact(art, poison=True)
    arrays = random_inputs(kernel, args.channels, args.length, args.state_size, args.seed)
    t0 = time.perf_counter()
    out = kernel(**arrays)
    elapsed = time.perf_counter() - t0
    outs = out if isinstance(out, dict) else {kernel.output_names[0]: out}
    refs, source = reference_outputs(kernel, arrays)
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
    from explorer.bench.results import environment, finalize, save_json
    from explorer.bench.sweep import BenchResult, Options, run_meta, sweep
    from explorer.runtime.cuda import gpu_available

    if not gpu_available():
        print("scanweaver bench: no CUDA device (CuPy with a GPU is needed)", file=sys.stderr)
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
        Path(args.table_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table_path).write_text(table + "\n")
    if args.json_path:
        result.save_json(args.json_path)
        print(f"wrote {args.json_path}")
    if args.html_path:
        try:
            result.save_html(args.html_path, title)
            print(f"wrote {args.html_path}")
        except ImportError as err:
            print(f"no figure: {err}", file=sys.stderr)
    return 0


def _title(env: dict[str, Any]) -> str:
    return (f"{env.get('gpu') or 'unknown GPU'}, driver {env.get('driver', '?')}, "
            f"CUDA runtime {env.get('cuda_runtime', '?')}")


def cmd_report(args: argparse.Namespace) -> int:
    from explorer.bench.results import format_table, load_json, save_html

    records, env = load_json(args.json_in)
    table = format_table(records, _title(env))
    print(table)
    if args.table_path:
        Path(args.table_path).write_text(table + "\n")
    if args.html_path:
        save_html(args.html_path, records, _title(env))
        print(f"wrote {args.html_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(argv) if argv is not None else sys.argv[1:]
    args = build_parser().parse_args(raw)
    args.argv = raw
    handler = {"compile": cmd_compile, "run": cmd_run, "bench": cmd_bench,
               "report": cmd_report}[args.command]
    from explorer.errors import CompileError, LaunchError, OptionError, RecurrenceError
    from explorer.runtime.artifact import ArtifactError

    try:
        return handler(args)
    except (RecurrenceError, OptionError, CompileError, LaunchError, ArtifactError) as err:
        print(f"scanweaver {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
