"""Tuning sweep: the generated kernels under many options, against a device copy.

Two steps, so that the GPU machine needs only numpy + cupy:

    python3 bench/kernel_speed.py compile .artifacts/kspeed     # here: explorer.compile, saved
    PYTHONPATH=. python3 bench/kernel_speed.py run .artifacts/kspeed [VARIANT,...]   # GPU

``compile`` writes one artifact per variant (``Compiled.save``: PTX, manifest, hash) and prints
ptxas's registers and spills. ``run`` times them with the benchmark of ``scanweaver bench``
(:func:`explorer.bench.sweep`: every kernel checked against float64 first, CUDA events, L2
flushed, a device copy of the same bytes as the roofline), then the section "chunk length"
times the default Blelloch artifact with the chunk rule's choice against forced chunk
lengths. Every launch goes through :mod:`explorer.runtime.cuda`, as a user's does (workspaces,
the look-back's flags zeroed before each launch, the chunk rule for this device).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SCALAR = "h[t] = a[t] * h[t-1] + b[t]"
MAMBA = ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
         "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]")
COMPANION = "h[t] = a[t] * h[t-1] + c[t] * h[t-2] + x[t]"

# (folder name, recurrence, strategy, options)
VARIANTS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("seq_default", SCALAR, "sequential", {}),
    ("ble_default", SCALAR, "blelloch", {}),
    ("seq_b256", SCALAR, "sequential", {"block_size": 256}),
    ("ble_b256_e4", SCALAR, "blelloch", {"block_size": 256, "elements_per_thread": 4}),
    ("ble_b256_e8", SCALAR, "blelloch", {"block_size": 256, "elements_per_thread": 8}),
    ("ble_b512_e8", SCALAR, "blelloch", {"block_size": 512, "elements_per_thread": 8}),
    ("ble_b128_e16", SCALAR, "blelloch", {"block_size": 128, "elements_per_thread": 16}),
    ("ble_b128_e8_ct32", SCALAR, "blelloch", {"chunk_tiles": 32}),
    ("ble_lookback", SCALAR, "blelloch", {"grid": "lookback"}),
    ("ble_lookback_t1", SCALAR, "blelloch", {"grid": "lookback", "lookback_tiles": 1}),
    ("ble_lookback_t16", SCALAR, "blelloch", {"grid": "lookback", "lookback_tiles": 16}),
    ("ble_lookback_b256", SCALAR, "blelloch", {"grid": "lookback", "block_size": 256}),
    ("ks_default", SCALAR, "kogge_stone", {}),
    ("ks_lookback", SCALAR, "kogge_stone", {"grid": "lookback"}),
    ("mamba_ble_default", MAMBA, "blelloch", {}),
    ("mamba_seq_b128", MAMBA, "sequential", {"block_size": 128}),
    ("mamba_ble_lookback", MAMBA, "blelloch", {"grid": "lookback"}),
    ("comp_seq", COMPANION, "sequential", {"block_size": 256}),
    ("comp_ble_default", COMPANION, "blelloch", {}),
]

SIZES = "4096x1024,16x2^20,131072x2048,1x2^26,1024x2^14,64x2^18,4x2^24"
#: more sizes for the chunk-length section: where unchunked starts to pay
CHUNK_SIZES = [(4096, 1024), (16, 2**20), (1, 2**26), (1024, 16384), (256, 131072),
               (512, 65536), (768, 32768)]


# -- compile (needs MLIR) ----------------------------------------------------------------------
def compile_all(out: Path) -> None:
    import explorer
    from explorer.codegen.ptxas import ptxas_report

    out.mkdir(parents=True, exist_ok=True)
    for name, text, strategy, opts in VARIANTS:
        compiled = explorer.compile(text, target="cuda", strategy=strategy, **opts)
        compiled.save(out / name)
        report = ptxas_report(compiled.ptx or "", compiled.options["chip"]) or {}
        for kernel, v in sorted(report.items()):
            print(f"{name:20s} {kernel:34s} regs {v['registers']:3d} spills "
                  f"{v['spills_stores']}/{v['spills_loads']} smem {v['shared_bytes']}")


# -- run (numpy + cupy only) -------------------------------------------------------------------
def _chunk_choices(rule: Any, machine: Any, C: int, L: int) -> list[tuple[str, int]]:
    """(label, time_chunk) to time: the rule's choice, unchunked, and the chunk counts that
    give 1/2 .. 4 times the device's resident-block slots."""
    tiles = -(-L // rule.tile)
    out = [("rule", rule.choose(C, 1, L, machine)), ("unchunked", tiles * rule.tile)]
    for f in (0.5, 1, 2, 4):
        chunks = max(1, -(-int(f * machine.slots) // C))
        out.append((f"{f:g}x slots", rule.tile * max(1, -(-tiles // chunks))))
    seen: set[int] = set()
    unique = []
    for label, T in out:
        if T not in seen:
            seen.add(T)
            unique.append((label, T))
    return unique


def chunk_section(folder: Path) -> None:
    import cupy as cp

    from explorer.bench.affine import affine_scan_f64, max_rel_error, random_problem
    from explorer.bench.timing import Flusher, time_cuda
    from explorer.runtime.cuda import CudaKernel, device_machine

    kernel = CudaKernel.from_artifact(folder / "ble_default", poison=True)
    machine = device_machine(kernel.artifact)
    rule = next(a.chunk_rule for a in kernel.artifact.kernels[0].args
                if a.chunk_rule is not None)
    flush = Flusher()
    print(f"\nchunk length, ble_default: {machine.sms} SMs x {machine.blocks_per_sm} blocks/SM "
          f"= {machine.slots} slots, rule {rule}")
    print(f"{'size':>14s} {'choice':12s} {'T':>9s} {'kernels':>7s} {'ms':>9s} {'copy ms':>8s} "
          f"{'of copy':>7s} {'rel err':>8s}")
    for C, L in CHUNK_SIZES:
        a, b = random_problem(C, L, seed=C + L, xp=cp)
        ref = affine_scan_f64(a, b, xp=cp)
        src = cp.empty(12 * C * L, dtype=cp.uint8)
        dst = cp.empty_like(src)
        def copy_once(src: Any = src, dst: Any = dst) -> None:
            dst[...] = src
        copy = time_cuda(copy_once, flush=flush).median_ms
        for label, T in _chunk_choices(rule, machine, C, L):
            run = kernel.prepare(time_chunk=T, a=a, b=b)
            run.launch()
            err = max_rel_error(run.result(), ref, xp=cp)
            if not err < 1e-4:
                print(f"{C:>6d}x{L:<7d} {label:12s} {T:9d} WRONG: rel err {err:.3g}")
                continue
            ms = time_cuda(run.launch, flush=flush).median_ms
            print(f"{C:>6d}x{L:<7d} {label:12s} {T:9d} {len(run._bound):7d} {ms:9.4f} "
                  f"{copy:8.4f} {copy / ms:7.3f} {err:8.1e}", flush=True)
        del a, b, ref, src, dst
        cp.get_default_memory_pool().free_all_blocks()


def run_all(folder: Path, only: list[str] | None = None, chunks: bool = True) -> int:
    from explorer.cli import main
    from explorer.runtime.cuda import gpu_available

    if not gpu_available():
        print("run needs a CUDA GPU and CuPy (compile runs anywhere MLIR is installed)")
        return 1
    names = [name for name, *_ in VARIANTS
             if (folder / name / "manifest.json").exists() and (only is None or name in only)]
    if not names:
        print(f"no artifacts in {folder}: run `bench/kernel_speed.py compile {folder}` first")
        return 1
    status = main(["bench", *(str(folder / n) for n in names), "--sizes", SIZES,
                   "--baselines", "none"])
    if chunks and (folder / "ble_default" / "manifest.json").exists():
        chunk_section(folder)
    return status


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("compile", "run"):
        print(__doc__)
        raise SystemExit(2)
    if sys.argv[1] == "compile":
        compile_all(Path(sys.argv[2]))
    else:
        raise SystemExit(run_all(Path(sys.argv[2]),
                                 sys.argv[3].split(",") if len(sys.argv) > 3 else None))
