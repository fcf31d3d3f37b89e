"""Compile speed: recurrence text -> PTX, uncached and cached, after the imports.

Prints the time of each stage (parse, decompose, MLIR build, pass pipeline) for the affine scan
and the selective scan, both strategies, the median of several runs (goal: under 1 s); then
``explorer.compile`` as a user calls it: uncached (every stage plus the ptxas report), from the
in-memory cache, and from the on-disk cache as a new process finds it (goal: under 10 ms).

    python bench/compile_speed.py [--repeat 5] [--chip sm_90]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from explorer.codegen import build_module, lower, validate  # noqa: E402
from explorer.frontend import Recurrence  # noqa: E402
from explorer.passes.affine import decompose  # noqa: E402

CASES = {
    "affine scan": "h[t] = a[t] * h[t-1] + b[t]",
    "selective scan": ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
                       "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]"),
}


def once(text: str, strategy: str, chip: str) -> dict[str, float]:
    t0 = time.perf_counter()
    rec = Recurrence.parse(text)
    t1 = time.perf_counter()
    form = decompose(rec)
    t2 = time.perf_counter()
    options = validate(strategy, "cuda", chip=chip)
    built = build_module(form, options)
    t3 = time.perf_counter()
    lowered = lower(built, options)
    t4 = time.perf_counter()
    assert lowered.ptx and ".entry" in lowered.ptx
    return {"parse": t1 - t0, "decompose": t2 - t1, "build": t3 - t2, "passes": t4 - t3,
            "total": t4 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chip", default="sm_90")
    args = ap.parse_args()
    once(CASES["affine scan"], "sequential", args.chip)    # load dialects and libraries once
    print(f"{'case':<16}{'strategy':<12}{'parse':>8}{'decomp':>8}{'build':>8}{'passes':>8}"
          f"{'total':>8}   (median of {args.repeat}, seconds)")
    for name, text in CASES.items():
        for strategy in ("sequential", "blelloch"):
            runs = [once(text, strategy, args.chip) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{name:<16}{strategy:<12}{med['parse']:8.3f}{med['decompose']:8.3f}"
                  f"{med['build']:8.3f}{med['passes']:8.3f}{med['total']:8.3f}")
    print()
    print(f"{'explorer.compile':<28}{'uncached':>10}{'memory':>10}{'disk':>10}   (seconds)")
    for name, text in CASES.items():
        for strategy in ("sequential", "blelloch"):
            print(f"{name + ' ' + strategy:<28}"
                  + "".join(f"{t:10.4f}" for t in driver_times(text, strategy, args.chip)))


def driver_times(text: str, strategy: str, chip: str) -> tuple[float, float, float]:
    """explorer.compile uncached, cached in memory, cached on disk (memory cleared first)."""
    import os
    import tempfile

    from explorer import compiler

    with tempfile.TemporaryDirectory() as cache:
        os.environ["SCANWEAVER_CACHE"] = cache
        compiler._MEMORY.clear()
        t0 = time.perf_counter()
        compiler.compile(text, strategy=strategy, chip=chip)
        t1 = time.perf_counter()
        compiler.compile(text, strategy=strategy, chip=chip)
        t2 = time.perf_counter()
        compiler._MEMORY.clear()
        again = compiler.compile(text, strategy=strategy, chip=chip)
        t3 = time.perf_counter()
        assert again.from_cache
    return t1 - t0, t2 - t1, t3 - t2


if __name__ == "__main__":
    main()
