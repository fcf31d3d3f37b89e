"""Benchmarks: generated kernels against baselines and the memory roofline, on the GPU.

    from explorer import bench
    for record in bench.sweep("4096x1024,16x2^20", artifacts=["out/blelloch"]):
        print(record.method, record.time_ms)           # one result at a time (stoppable)
    result = bench.run("4096x1024", baseline_names="cuda,torch")
    print(result.table()); result.save_json("bench.json"); result.save_html("bench.html")

Every method is checked against a float64 reference before it is timed; a wrong result is
reported, never timed.  Times are CUDA-event medians after warm-up with L2 flushed before each
launch; bandwidth counts 12 bytes an element (read a and b, write h).  NumPy, CuPy and the front
end (sympy's affine decomposition says which artifacts are the affine scan the baselines solve)
are needed, never MLIR; the peers (PyTorch, JAX, cuda-cccl, accelerated-scan) are used when they
import.
"""

from __future__ import annotations

from explorer.bench.generated import generated
from explorer.bench.methods import BASELINES, COPY, Method, Problem, Skip, baselines
from explorer.bench.results import Record, environment, figure, finalize, format_table
from explorer.bench.sweep import BenchResult, Options, parse_sizes, run, sweep

__all__ = [
    "BASELINES", "COPY", "BenchResult", "Method", "Options", "Problem", "Record", "Skip",
    "baselines", "environment", "figure", "finalize", "format_table", "generated",
    "parse_sizes", "run", "sweep",
]
