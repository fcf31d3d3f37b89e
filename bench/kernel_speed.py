"""Speed of the generated kernels against a device copy, launched straight from PTX.

Two steps, so that the GPU machine needs only numpy + cupy:

    python3 bench/kernel_speed.py compile .artifacts/kspeed     # here: MLIR -> PTX + manifest
    PYTHONPATH=. python3 bench/kernel_speed.py run .artifacts/kspeed [VARIANT,...]   # GPU

``run`` follows each manifest exactly (kernels in list order, all with the full argument list;
grid_x = ceil(C*N / sequences_per_block) [* ceil(L / time_chunk)]; a kernel with
``launch_when_longer_than: X`` only when L > X; workspaces of C*N*ceil(L/T)*per_chunk zeroed
floats; dynamic shared memory as given), checks every output against a float64 reference
computed on the GPU, then times the launches with CUDA events against a device-to-device copy
of the same bytes (12 per element for the scalar scan) and prints copy_time / kernel_time.

A ``time_chunk`` chosen per call is chosen with the manifest's rule for this device
(:func:`explorer.runtime.artifact.choose_time_chunk`, SMs and resident blocks per SM from
CUDA's occupancy calculator), as :mod:`explorer.runtime.cuda` does. The section "chunk length"
then times the default Blelloch artifact with the rule's choice against forced chunk lengths:
unchunked (one block a sequence), the old fixed 8192 and chunk counts that give 1/4 to 4 times
the device's resident-block slots.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SCALAR = "h[t] = a[t] * h[t-1] + b[t]"
MAMBA = ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
         "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]")
COMPANION = "h[t] = a[t] * h[t-1] + c[t] * h[t-2] + x[t]"

# (folder name, recurrence, strategy, options)
VARIANTS: list[tuple[str, str, str, dict[str, int]]] = [
    ("seq_default", SCALAR, "sequential", {}),
    ("ble_default", SCALAR, "blelloch", {}),
    ("seq_b256", SCALAR, "sequential", {"block_size": 256}),
    ("seq_b128", SCALAR, "sequential", {"block_size": 128}),
    ("ble_b256_e4", SCALAR, "blelloch", {"block_size": 256, "elements_per_thread": 4}),
    ("ble_b256_e8", SCALAR, "blelloch", {"block_size": 256, "elements_per_thread": 8}),
    ("ble_b128_e8", SCALAR, "blelloch", {"block_size": 128, "elements_per_thread": 8}),
    ("ble_b512_e8", SCALAR, "blelloch", {"block_size": 512, "elements_per_thread": 8}),
    ("ble_b256_e4_ct4", SCALAR, "blelloch", {"block_size": 256, "elements_per_thread": 4,
                                             "chunk_tiles": 4}),
    ("seq_b64", SCALAR, "sequential", {"block_size": 64}),
    ("ble_b64_e16", SCALAR, "blelloch", {"block_size": 64, "elements_per_thread": 16}),
    ("ble_b128_e16", SCALAR, "blelloch", {"block_size": 128, "elements_per_thread": 16}),
    ("ble_b128_e8_ct8", SCALAR, "blelloch", {"block_size": 128, "elements_per_thread": 8,
                                             "chunk_tiles": 8}),
    ("ble_b128_e8_ct32", SCALAR, "blelloch", {"block_size": 128, "elements_per_thread": 8,
                                              "chunk_tiles": 32}),
    ("ble_b64_e8", SCALAR, "blelloch", {"block_size": 64, "elements_per_thread": 8}),
    ("mamba_ble_default", MAMBA, "blelloch", {}),
    ("mamba_seq", MAMBA, "sequential", {"block_size": 256}),
    ("mamba_ble", MAMBA, "blelloch", {"block_size": 256, "elements_per_thread": 4}),
    ("mamba_seq_b128", MAMBA, "sequential", {"block_size": 128}),
    ("mamba_ble_b128_e8", MAMBA, "blelloch", {"block_size": 128, "elements_per_thread": 8}),
    ("comp_seq", COMPANION, "sequential", {"block_size": 256}),
    ("comp_ble", COMPANION, "blelloch", {"block_size": 256, "elements_per_thread": 4,
                                         "chunk_tiles": 2}),
    ("comp_ble_default", COMPANION, "blelloch", {}),
]

SIZES = [(4096, 1024), (16, 2**20), (131072, 2048), (1, 2**26), (1024, 16384), (4096, 65536)]
#: more sizes for the chunk-length section: where unchunked starts to pay
THRESHOLD_SIZES = [(256, 131072), (512, 65536), (768, 32768)]


# -- compile (needs MLIR) ----------------------------------------------------------------------
def compile_all(out: Path) -> None:
    from explorer.codegen import build_module, lower, validate
    from explorer.codegen.ptxas import ptxas_report
    from explorer.frontend import Recurrence
    from explorer.passes.affine import decompose

    out.mkdir(parents=True, exist_ok=True)
    for name, text, strategy, opts in VARIANTS:
        o = validate(strategy, "cuda", **opts)
        form = decompose(Recurrence.parse(text))
        built = build_module(form, o)
        lowered = lower(built, o)
        assert lowered.ptx is not None
        folder = out / name
        folder.mkdir(exist_ok=True)
        (folder / "kernel.ptx").write_text(lowered.ptx)
        manifest = {"recurrence": text, "strategy": strategy, "options": o.as_dict(),
                    "kernels": [dict(k.manifest(), args=built.args) for k in built.kernels]}
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
        report = ptxas_report(lowered.ptx, o.chip) or {}
        for k, v in sorted(report.items()):
            print(f"{name:18s} {k:28s} regs {v['registers']:3d} spills "
                  f"{v['spills_stores']}/{v['spills_loads']} smem {v['shared_bytes']}")


# -- run (numpy + cupy only) -------------------------------------------------------------------
REF_SOURCE = r"""
extern "C" __global__ void ref_scalar(const float* a, const float* b, double* h,
                                      long long C, long long L) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s = 0.0;
    for (long long t = 0; t < L; ++t) {
        s = (double)a[c * L + t] * s + (double)b[c * L + t];
        h[c * L + t] = s;
    }
}
extern "C" __global__ void ref_companion(const float* a, const float* cc, const float* x,
                                         double* h, long long C, long long L) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double h1 = 0.0, h2 = 0.0;
    for (long long t = 0; t < L; ++t) {
        double n = (double)a[c * L + t] * h1 + (double)cc[c * L + t] * h2 + (double)x[c * L + t];
        h2 = h1; h1 = n;
        h[c * L + t] = n;
    }
}
extern "C" __global__ void ref_mamba(const float* dt, const float* x, const float* B,
                                     const float* Cm, const float* A, const float* D,
                                     double* h, double* y, long long C, long long N,
                                     long long L) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (long long n = 0; n < N; ++n) {
        double s = 0.0;
        for (long long t = 0; t < L; ++t) {
            double d = dt[c * L + t];
            s = exp(d * (double)A[c * N + n]) * s + d * (double)B[(c * N + n) * L + t]
                * (double)x[c * L + t];
            h[(c * N + n) * L + t] = s;
        }
    }
    for (long long t = 0; t < L; ++t) {
        double acc = (double)D[c] * (double)x[c * L + t];
        for (long long n = 0; n < N; ++n)
            acc += (double)Cm[(c * N + n) * L + t] * h[(c * N + n) * L + t];
        y[c * L + t] = acc;
    }
}
"""


class Runner:
    """One artifact on the device: launches its kernels the way the manifest says."""

    def __init__(self, folder: Path) -> None:
        import cupy as cp

        from explorer.runtime.artifact import Machine, validate_manifest

        self.manifest = json.loads((folder / "manifest.json").read_text())
        self.module = cp.RawModule(path=str(folder / "kernel.ptx"))
        self.infos = validate_manifest(dict(self.manifest, format="scanweaver-artifact/1"))
        self.kernels = []
        per_sm = []
        for k, info in zip(self.manifest["kernels"], self.infos, strict=True):
            fn = self.module.get_function(k["name"])
            if k["shared_bytes"] > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = k["shared_bytes"]
            self.kernels.append((k, fn))
            if info.chunked_per_call:
                try:
                    per_sm.append(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                        fn.ptr, info.threads, info.shared_bytes))
                except AttributeError:   # no occupancy calculator: threads per SM alone
                    per_sm.append(2048 // info.threads)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.machine = Machine(sms, min(per_sm) if per_sm else 1)
        self.sizes: dict[str, int] = {}

    @property
    def rule(self) -> Any:
        return next((a.chunk_rule for a in self.infos[0].args if a.chunk_rule), None)

    def bind(self, arrays: dict[str, Any], C: int, N: int, L: int,
             time_chunk: int | None = None) -> tuple[list[Any], dict[str, Any]]:
        import cupy as cp

        from explorer.runtime.artifact import size_values

        args: list[Any] = []
        outputs: dict[str, Any] = {}
        self.sizes = size_values(self.infos[0].args, C, N, L, self.machine, time_chunk)
        sizes = {k: np.int64(v) for k, v in self.sizes.items()}
        for a, info in zip(self.manifest["kernels"][0]["args"], self.infos[0].args,
                           strict=True):
            role = a["role"]
            if role == "size":
                args.append(sizes[a["name"]])
            elif role == "workspace":
                args.append(cp.zeros(info.workspace_size(C, N, L, self.sizes),
                                     dtype=cp.float32))
            elif role == "output":
                shape = (C, N, L) if a["lane"] else (C, L)
                outputs[a["name"]] = cp.full(shape, np.nan, dtype=cp.float32)
                args.append(outputs[a["name"]])
            elif role == "h0":
                args.append(cp.zeros((C, N) if a["lane"] else (C,), dtype=cp.float32))
            else:
                args.append(arrays[a["name"]])
        return args, outputs

    def launches(self, C: int, N: int, L: int) -> list[tuple[Any, Any, int]]:
        """The launches of the call last bound (its sizes: the chunk length it took)."""
        out = []
        for (k, fn), info in zip(self.kernels, self.infos, strict=True):
            if not info.launched(L, self.sizes):
                continue
            out.append((k, fn, info.grid(C, N, L, self.sizes)[0]))
        return out

    def launch(self, plan: list[tuple[Any, Any, int]], args: list[Any]) -> None:
        for k, fn, grid in plan:
            fn((grid,), tuple(k["block"]), tuple(args), shared_mem=k["shared_bytes"])


def _time(fn: Any, reps: int) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` launches (CUDA events, after a warm-up)."""
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def _reps(ms_guess: float) -> int:
    return int(max(3, min(50, 300.0 / max(ms_guess, 1e-3))))


def _scalar_problem(rng: Any, ref_mod: Any, C: int, L: int) -> tuple[Any, Any, Any]:
    """Random inputs of the scalar scan on the device and their float64 states."""
    import cupy as cp

    a = rng.uniform(0.5, 1.0, (C, L), dtype=cp.float32)
    b = rng.uniform(-1.0, 1.0, (C, L), dtype=cp.float32)
    ref = cp.empty((C, L), dtype=cp.float64)
    ref_mod.get_function("ref_scalar")(((C + 127) // 128,), (128,),
                                       (a, b, ref, np.int64(C), np.int64(L)))
    return a, b, ref


def _copy_ms(nbytes: int) -> float:
    import cupy as cp

    n = nbytes // 2
    src = cp.ones(n, dtype=cp.uint8)
    dst = cp.empty(n, dtype=cp.uint8)
    return _time(lambda: dst.data.copy_from_device_async(src.data, n), 50)


def rel_err(out: Any, ref: Any) -> float:
    import cupy as cp

    scale = cp.max(cp.abs(ref), axis=-1, keepdims=True) + 1e-30
    return float(cp.max(cp.abs(out.astype(cp.float64) - ref) / scale))


def _chunk_choices(r: Runner, C: int, L: int) -> list[tuple[str, int]]:
    """(label, time_chunk) to time: the rule's choice, unchunked, the old fixed 8192 and the
    chunk counts that give 1/4 .. 4 times the device's block slots."""
    rule = r.rule
    tiles = -(-L // rule.tile)
    out = [("rule", r.rule.choose(C, 1, L, r.machine)), ("unchunked", tiles * rule.tile),
           ("fixed 8192", 8192)]
    for f in (0.5, 1, 2, 4):
        chunks = max(1, -(-int(f * r.machine.slots) // C))
        T = rule.tile * max(1, -(-tiles // chunks))
        out.append((f"{f:g}x slots", T))
    seen: set[int] = set()
    return [(k, T) for k, T in out if not (T in seen or seen.add(T))]  # type: ignore[func-returns-value]


def chunk_section(ref_mod: Any, runner: Runner, rng: Any) -> None:
    import cupy as cp

    print(f"\nchunk length, ble_default: machine {runner.machine.sms} SMs x "
          f"{runner.machine.blocks_per_sm} blocks/SM = {runner.machine.slots} slots, rule "
          f"{runner.rule}")
    print(f"{'size':>14s} {'choice':12s} {'T':>9s} {'blocks':>8s} {'kernels':>7s} {'ms':>9s} "
          f"{'copy ms':>8s} {'ratio':>6s} {'rel err':>8s}")
    for C, L in SIZES + THRESHOLD_SIZES:
        a, b, ref = _scalar_problem(rng, ref_mod, C, L)
        copy = _copy_ms(12 * C * L)
        for label, T in _chunk_choices(runner, C, L):
            args, outs = runner.bind({"a": a, "b": b}, C, 1, L, time_chunk=T)
            plan = runner.launches(C, 1, L)
            runner.launch(plan, args)
            cp.cuda.Device().synchronize()
            err = rel_err(outs["h"], ref)
            blocks = C * -(-L // T)
            if not err < 1e-4:
                print(f"{C:>6d}x{L:<7d} {label:12s} {T:9d} WRONG: rel err {err:.3g}")
                continue
            ms = _time(lambda plan=plan, args=args: runner.launch(plan, args), 30)
            print(f"{C:>6d}x{L:<7d} {label:12s} {T:9d} {blocks:8d} {len(plan):7d} {ms:9.4f} "
                  f"{copy:8.4f} {copy / ms:6.3f} {err:8.1e}", flush=True)
            del args, outs
        del a, b, ref
        cp.get_default_memory_pool().free_all_blocks()


def run_all(folder: Path, only: list[str] | None = None, chunks: bool = True) -> None:
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"GPU: {props['name'].decode()}  (CUDA runtime {cp.cuda.runtime.runtimeGetVersion()})")
    ref_mod = cp.RawModule(code=REF_SOURCE)
    runners = {name: Runner(folder / name) for name, *_ in VARIANTS
               if (folder / name / "manifest.json").exists() and (only is None or name in only)}
    rng = cp.random.default_rng(0)
    # scalar scan at the four sizes: correctness then speed
    print(f"{'size':>14s} {'variant':18s} {'ms':>9s} {'copy ms':>8s} {'ratio':>6s} "
          f"{'rel err':>8s}")
    for C, L in SIZES:
        a, b, ref = _scalar_problem(rng, ref_mod, C, L)
        copy = _copy_ms(12 * C * L)
        for name, r in runners.items():
            if r.manifest["recurrence"] != SCALAR:
                continue
            if r.manifest["strategy"] == "sequential" and C < 1024:
                print(f"{C:>6d}x{L:<7d} {name:18s} skipped: one thread per sequence, {C} "
                      "sequences (measured earlier: below 0.001 of copy)")
                continue
            args, outs = r.bind({"a": a, "b": b}, C, 1, L)
            plan = r.launches(C, 1, L)
            t0 = time.perf_counter()
            r.launch(plan, args)
            cp.cuda.Device().synchronize()
            guess = (time.perf_counter() - t0) * 1e3
            err = rel_err(outs["h"], ref)
            if not err < 1e-4:
                print(f"{C:>6d}x{L:<7d} {name:18s} WRONG: rel err {err:.3g}")
                continue
            ms = _time(lambda r=r, plan=plan, args=args: r.launch(plan, args), _reps(guess))
            print(f"{C:>6d}x{L:<7d} {name:18s} {ms:9.4f} {copy:8.4f} {copy / ms:6.3f} "
                  f"{err:8.1e}", flush=True)
            del args, outs
        del a, b, ref
        cp.get_default_memory_pool().free_all_blocks()
    if chunks and "ble_default" in runners:
        chunk_section(ref_mod, runners["ble_default"], rng)
    # other recurrences: correctness (and speed, bytes counted per kernel's own traffic)
    for C, N, L in [(64, 16, 4096), (4, 16, 2**18)]:
        dt = rng.uniform(0.01, 0.2, (C, L), dtype=cp.float32)
        x = rng.uniform(-1, 1, (C, L), dtype=cp.float32)
        B = rng.uniform(-1, 1, (C, N, L), dtype=cp.float32)
        Cm = rng.uniform(-1, 1, (C, N, L), dtype=cp.float32)
        A = rng.uniform(-2, -0.1, (C, N), dtype=cp.float32)
        D = rng.uniform(-1, 1, (C,), dtype=cp.float32)
        h = cp.empty((C, N, L), dtype=cp.float64)
        y = cp.empty((C, L), dtype=cp.float64)
        ref_mod.get_function("ref_mamba")(((C + 31) // 32,), (32,), (
            dt, x, B, Cm, A, D, h, y, np.int64(C), np.int64(N), np.int64(L)))
        nbytes = 4 * (C * L * 3 + C * N * L * 3)     # dt, x, y; B, C, h
        copy = _copy_ms(nbytes)
        for name in ("mamba_ble_default", "mamba_seq", "mamba_ble", "mamba_seq_b128",
                     "mamba_ble_b128_e8"):
            if name not in runners:
                continue
            r = runners[name]
            args, outs = r.bind({"dt": dt, "x": x, "B": B, "C": Cm, "A": A, "D": D}, C, N, L)
            plan = r.launches(C, N, L)
            r.launch(plan, args)
            cp.cuda.Device().synchronize()
            eh, ey = rel_err(outs["h"], h), rel_err(outs["y"], y)
            ok = eh < 1e-4 and ey < 1e-4
            if ok and "seq" in name and C * N < 1024:
                print(f"mamba {C}x{N}x{L} {name:12s} h err {eh:.1e} y err {ey:.1e} (not timed)")
                continue
            ms = _time(lambda r=r, plan=plan, args=args: r.launch(plan, args), 20) if ok else 0
            print(f"mamba {C}x{N}x{L} {name:12s} h err {eh:.1e} y err {ey:.1e} "
                  + (f"{ms:.4f} ms, ratio to copy of its bytes {copy / ms:.3f}" if ok
                     else "WRONG"), flush=True)
    for C, L in [(4096, 1024), (2, 2**20)]:
        a = rng.uniform(0.2, 0.6, (C, L), dtype=cp.float32)
        c = rng.uniform(-0.3, 0.3, (C, L), dtype=cp.float32)
        x = rng.uniform(-1, 1, (C, L), dtype=cp.float32)
        ref = cp.empty((C, L), dtype=cp.float64)
        ref_mod.get_function("ref_companion")(((C + 127) // 128,), (128,), (
            a, c, x, ref, np.int64(C), np.int64(L)))
        copy = _copy_ms(16 * C * L)
        for name in ("comp_seq", "comp_ble", "comp_ble_default"):
            if name not in runners:
                continue
            r = runners[name]
            args, outs = r.bind({"a": a, "c": c, "x": x}, C, 1, L)
            plan = r.launches(C, 1, L)
            r.launch(plan, args)
            cp.cuda.Device().synchronize()
            err = rel_err(outs["h"], ref)
            ok = err < 1e-4
            if ok and "seq" in name and C < 1024:
                print(f"companion {C}x{L} {name:10s} err {err:.1e} (not timed)")
                continue
            ms = _time(lambda r=r, plan=plan, args=args: r.launch(plan, args), 20) if ok else 0
            print(f"companion {C}x{L} {name:10s} err {err:.1e} "
                  + (f"{ms:.4f} ms, ratio to copy of its bytes {copy / ms:.3f}" if ok
                     else "WRONG"), flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("compile", "run"):
        sys.exit("usage: kernel_speed.py compile FOLDER | run FOLDER [VARIANT,...]")
    if sys.argv[1] == "compile":
        compile_all(Path(sys.argv[2]))
    else:
        run_all(Path(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) == 4 else None)
