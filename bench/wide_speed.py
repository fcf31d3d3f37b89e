"""Speed of the wide tile accesses (``vector_width``): affine-scan artifacts with the option on
and off, each timed against a device copy of the same bytes, on the GPU machine (NumPy + CuPy).

    python bench/wide_speed.py ART_DIR [--shapes 4096x1024,1x2^26] [--tag e16] [--json out.json]

``ART_DIR`` holds ``affine-<dtype>`` and ``affine-<dtype>-v1`` artifacts (``wide/`` of
``tests/gpu/build_artifacts.py --wide-only``). Per shape and dtype: the median time of the
kernels (CUDA events, after a warm-up) and "of copy": the time of copying a and b
(``cudaMemcpyAsync`` device to device, median alike), scaled to the scan's bytes (3 arrays
of the dtype an element against the copy's 4), divided by the kernel's time. Before timing,
each output is checked by its residual ``max |h[t] - (a[t] h[t-1] + b[t])| / max |h|`` in
float64 on the inputs as the kernel read them (rounded to the dtype).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SHAPES = "4096x1024,131072x2048,1024x16384,1x2^26,16x2^20"
DTYPES = ("float32", "bfloat16", "float16")


def _shape(text: str) -> tuple[int, int]:
    def num(s: str) -> int:
        base, _, exp = s.partition("^")
        return int(base) ** int(exp) if exp else int(base)
    c, _, ell = text.partition("x")
    return num(c), num(ell)


def _median_ms(cp: Any, fn: Any, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    times.sort()
    return times[len(times) // 2]


def _copy_ms(cp: Any, srcs: tuple[Any, ...], reps: int) -> float:
    """Median time of a device-to-device copy of ``srcs`` (``cudaMemcpyAsync``: an
    elementwise CuPy copy ran at half the bandwidth for a (1, 2^26) array on an H100)."""
    dsts = [cp.empty_like(s) for s in srcs]
    rt = cp.cuda.runtime

    def copy() -> None:
        stream = cp.cuda.get_current_stream().ptr
        for d, s in zip(dsts, srcs, strict=True):
            rt.memcpyAsync(d.data.ptr, s.data.ptr, s.nbytes, rt.memcpyDeviceToDevice, stream)
    return _median_ms(cp, copy, reps)


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    from explorer.runtime.cuda import CudaKernel
    from explorer.runtime.dtypes import from_storage, to_storage

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("art", type=Path)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tag", default="",
                   help="artifacts affine-<dtype>-<tag> and affine-<dtype>-<tag>-v1")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    print(f"{'C x L':>14} {'dtype':>9} {'wide ms':>9} {'scalar ms':>9} {'copy ms':>8} "
          f"{'wide/copy':>9} {'scalar/copy':>11} {'speedup':>7} {'resid wide':>10} "
          f"{'resid scalar':>12}")
    for shape in args.shapes.split(","):
        C, L = _shape(shape)
        for dtype in args.dtypes.split(","):
            tag = f"-{args.tag}" if args.tag else ""
            kernels = {v: CudaKernel.from_artifact(args.art / f"affine-{dtype}{tag}{s}")
                       for v, s in (("wide", ""), ("scalar", "-v1"))}
            rng = cp.random.default_rng(C + L)
            a = (0.5 + 0.5 * rng.random((C, L), dtype=cp.float32)).astype(cp.float32)
            b = rng.standard_normal((C, L), dtype=cp.float32)
            row: dict[str, Any] = {"C": C, "L": L, "dtype": dtype}
            if dtype == "float32":
                ar, br = a, b
            else:
                ar = from_storage(to_storage("a", a, dtype, cp), dtype, cp)
                br = from_storage(to_storage("b", b, dtype, cp), dtype, cp)
            for v, k in kernels.items():
                run = k.prepare(a=a, b=b)
                run.launch()
                h = cp.asarray(run.result(), dtype=cp.float64)
                prev = cp.concatenate([cp.zeros((C, 1)), h[:, :-1]], axis=1)
                res = cp.abs(h - (ar.astype(cp.float64) * prev + br.astype(cp.float64)))
                row[f"resid_{v}"] = float(res.max() / max(float(cp.abs(h).max()), 1e-30))
                del h, prev, res
                row[f"{v}_ms"] = _median_ms(cp, run.launch, args.reps)
                del run
            a_st, b_st = ((a, b) if dtype == "float32" else
                          (to_storage("a", a, dtype, cp), to_storage("b", b, dtype, cp)))
            # copying a and b moves 4 arrays an element; the scan 3 (a, b read, h written)
            row["copy_ms"] = _copy_ms(cp, (a_st, b_st), args.reps) * 3 / 4
            del a_st, b_st, a, b, ar, br
            cp.get_default_memory_pool().free_all_blocks()
            for v in ("wide", "scalar"):
                row[f"{v}_of_copy"] = row["copy_ms"] / row[f"{v}_ms"]
            rows.append(row)
            print(f"{shape:>14} {dtype:>9} {row['wide_ms']:9.3f} {row['scalar_ms']:9.3f} "
                  f"{row['copy_ms']:8.3f} {row['wide_of_copy']:9.2f} {row['scalar_of_copy']:11.2f}"
                  f" {row['scalar_ms'] / row['wide_ms']:7.2f} {row['resid_wide']:10.1e} "
                  f"{row['resid_scalar']:12.1e}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
