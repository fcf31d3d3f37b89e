"""``scanweaver run`` and ``scanweaver bench``: the commands that run artifacts on the GPU.

``run`` checks an artifact on random inputs against the float64 reference; ``bench`` times
artifacts against the baselines and a device copy.  Both need NumPy and CuPy only (``bench``
uses PyTorch, JAX, cuda-cccl and accelerated-scan when they import).
"""

from __future__ import annotations

import argparse
import shlex
import time
from typing import Any

from explorer.cli.errors import CliError, _say
from explorer.cli.paths import _write_text, check_output
from explorer.cli.report_command import _title


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
    from explorer.groundtruth import at_offsets, named_outputs, stored_reference

    arrays = at_offsets(arrays, kernel.artifact.options.get("read_offsets"))
    if reverse:
        arrays = {k: flip(v) if k in timed else v for k, v in arrays.items()}
    ref = explorer.reference(kernel.artifact.recurrence, L=L, **arrays)
    trajectories = {k: flip(v) if reverse else np.asarray(v)
                    for k, v in named_outputs(kernel.artifact.recurrence, ref).items()}
    # what the kernel stores: its states and readouts, and its last states (the state at
    # the last step of the scan)
    out, _ = stored_reference(kernel.artifact.recurrence, trajectories, tuple(names), reverse)
    return out, "explorer.reference" + (" (flipped in time)" if reverse else "")


def _no_gpu(command: str) -> int:
    """Say why the GPU cannot be used (exit status 2: this machine, not the input)."""
    from explorer.runtime.cuda import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is None:
        return 0
    _say(f"scanweaver {command}: cannot run on the GPU: {reason}")
    return 2


def _forward_only(path: Any, art: Any) -> None:
    """``run`` and ``bench`` check and time a recurrence's outputs against its reference: a
    fused backward kernel's outputs are gradients, which they have no reference for."""
    if art.options.get("backward"):
        raise CliError(f"{path} is a fused backward kernel (compiled with backward=True): it "
                       "runs as the backward of the torch operator, ex.compile(text).torch(); "
                       "bench/grad_speed.py times it")


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from explorer.bench.affine import max_rel_error, tolerance
    from explorer.bench.inputs import random_inputs
    from explorer.runtime.artifact import load_artifact
    from explorer.runtime.cuda import CudaKernel

    art = load_artifact(args.artifact)
    _forward_only(args.artifact, art)
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
    # 16-bit outputs: their rounding beside float32's (explorer.bench.affine.tolerance)
    tol = args.tolerance if args.tolerance is not None else max(
        tolerance(kernel.narrow.get(name, "float32")) for name in outs)
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
    from explorer.bench.affine import tolerance
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
        art = load_artifact(path)
        _forward_only(path, art)
        if art.dtype != args.dtype:
            raise CliError(f"{path} takes {art.dtype} inputs: run it with --dtype {art.dtype} "
                           f"(this run is --dtype {args.dtype})")
    for path, flag in ((args.json_path, "--json"), (args.html_path, "--html"),
                       (args.table_path, "--table")):
        if path is not None:
            check_output(path, flag)
    if _no_gpu("bench"):
        return 2
    # the default tolerance of 16-bit inputs: their outputs' rounding beside float32's (an
    # artifact storing float32 outputs is held to it too)
    opts = Options(tolerance=args.tolerance if args.tolerance is not None else
                   tolerance(args.dtype), budget_ms=args.budget_ms, seed=args.seed,
                   flush_l2=not args.no_flush, dtype=args.dtype)
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
