"""What the benchmark runs: the copy roofline and the baselines (ours: ``bench.generated``).

Every method is set up for one problem (``(C, L)`` float32 arrays ``a``, ``b`` on the GPU) and
returns a :class:`Prepared`: ``run()`` enqueues the work without waiting, ``output()`` gives the
``(C, L)`` result for the correctness check.  A method that cannot run here raises :class:`Skip`
with the reason (library missing, size outside what it supports, too slow to be worth timing).
Peers are imported only inside ``setup``: nothing here needs them at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Skip(Exception):
    """This method does not run on this problem or machine; the message says why."""


@dataclass
class Problem:
    """One benchmark size and its device inputs (CuPy arrays, C-contiguous ``(C, L)``)."""

    C: int
    L: int
    a: Any
    b: Any
    ref: Any = None  # the float64 reference (CuPy), for methods that try variants
    #: the dtype of a and b (and of h for the methods that store it so): ``bfloat16`` ones
    #: are held as their 16-bit patterns (uint16; see explorer.runtime.dtypes)
    dtype: str = "float32"
    # views for the frameworks, made on first use
    _torch: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def elements(self) -> int:
        return self.C * self.L

    @property
    def bytes(self) -> int:
        """Bytes the scan must move: read a and b, write h (12 per element in float32, 6 in
        bfloat16 or float16)."""
        return 3 * (4 if self.dtype == "float32" else 2) * self.elements

    def torch(self, name: str) -> Any:
        if name not in self._torch:
            import torch

            x = getattr(self, name)
            self._torch[name] = (torch.from_dlpack(x.view("int16")).view(torch.bfloat16)
                                 if self.dtype == "bfloat16" else torch.from_dlpack(x))
        return self._torch[name]


@dataclass
class Prepared:
    run: Callable[[], Any]
    output: Callable[[], Any]
    timer: str = "cuda-events"  # or "host": run() returns something to block on
    block: Callable[[Any], Any] | None = None
    note: str = ""
    budget_ms: float | None = None  # a slower method may ask for fewer repetitions
    cleanup: Callable[[], None] | None = None
    # a method that solves its own problem (a recurrence other than the affine scan) checks
    # itself: check() -> max rel err, and says how many bytes it moves
    check: Callable[[], float] | None = None
    bytes_moved: int | None = None
    #: the kernels a call runs (ours: which of a compile's kernels its length launches)
    kernels: tuple[str, ...] = ()


@dataclass
class Method:
    name: str
    kind: str  # "roofline", "baseline" or "generated"
    setup: Callable[[Problem], Prepared]
    description: str = ""
    artifact: str | None = None
    #: the input dtypes it runs in (a problem of another dtype skips it)
    dtypes: tuple[str, ...] = ("float32",)


# --- the roofline ----------------------------------------------------------------------------

def _copy_setup(p: Problem) -> Prepared:
    import cupy as cp

    n = p.bytes // 2  # read n bytes, write n bytes: the scan's bytes (12 or 6 an element)
    src = cp.empty(n, dtype=cp.uint8)
    src.fill(1)
    dst = cp.empty(n, dtype=cp.uint8)

    def run() -> None:
        dst.data.copy_from_device_async(src.data, n)

    def output() -> Any:
        raise Skip("the copy has no scan result")

    return Prepared(run, output, note=f"cudaMemcpyAsync D2D of {n} bytes (reads + writes = "
                                      f"{p.bytes // p.elements if p.elements else 0} "
                                      "B/element)")


ALL_DTYPES = ("float32", "bfloat16", "float16")
COPY = Method("copy (roofline)", "roofline", _copy_setup,
              "device-to-device copy moving the scan's bytes (read a, b; write h)",
              dtypes=ALL_DTYPES)


# --- CUDA C sequential: one thread per sequence, coalesced through shared memory -------------

SEQUENTIAL_WARPS = 4
SEQUENTIAL_SOURCE = r"""
#define TILE 32
#define WARPS %(warps)d
extern "C" __global__ void __launch_bounds__(WARPS * 32)
affine_scan_sequential(const float* __restrict__ a, const float* __restrict__ b,
                       float* __restrict__ h, long long C, long long L)
{
    // Each warp owns 32 consecutive channels and walks time in tiles of 32 steps. A tile is
    // loaded row by row (32 consecutive time steps of one channel per load: coalesced), the
    // scan runs one thread per channel out of shared memory, and the results leave the same
    // coalesced way. The +1 column keeps the column reads free of bank conflicts.
    __shared__ float ta[WARPS][TILE][TILE + 1];
    __shared__ float tb[WARPS][TILE][TILE + 1];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long c0 = ((long long)blockIdx.x * WARPS + warp) * TILE;
    if (c0 >= C) return;
    const int rows = (int)min((long long)TILE, C - c0);
    float state = 0.0f;
    for (long long t0 = 0; t0 < L; t0 += TILE) {
        const long long t = t0 + lane;
        const bool in_time = t < L;
        #pragma unroll 8
        for (int i = 0; i < TILE; ++i) {
            float av = 0.0f, bv = 0.0f;
            if (i < rows && in_time) {
                const long long idx = (c0 + i) * L + t;
                av = __ldg(a + idx);
                bv = __ldg(b + idx);
            }
            ta[warp][i][lane] = av;
            tb[warp][i][lane] = bv;
        }
        __syncwarp();
        const int steps = (int)min((long long)TILE, L - t0);
        for (int k = 0; k < steps; ++k) {
            state = fmaf(ta[warp][lane][k], state, tb[warp][lane][k]);
            tb[warp][lane][k] = state;
        }
        __syncwarp();
        #pragma unroll 8
        for (int i = 0; i < TILE; ++i) {
            if (i < rows && in_time) h[(c0 + i) * L + t] = tb[warp][i][lane];
        }
        __syncwarp();
    }
}
"""

#: the sequential kernel walks L steps one after another: skip it when that takes too long
SEQUENTIAL_MAX_L = 1 << 26


def _cuda_sequential_setup(p: Problem) -> Prepared:
    import cupy as cp

    if p.L > SEQUENTIAL_MAX_L:
        raise Skip(f"L={p.L} > {SEQUENTIAL_MAX_L}")
    kernel = cp.RawKernel(SEQUENTIAL_SOURCE % {"warps": SEQUENTIAL_WARPS},
                          "affine_scan_sequential", options=("-std=c++14",))
    h = cp.full_like(p.a, cp.nan)  # poisoned: unwritten elements fail the check
    threads = SEQUENTIAL_WARPS * 32
    grid = (max(1, -(-p.C // threads)),)
    args = (p.a, p.b, h, cp.int64(p.C), cp.int64(p.L))

    def run() -> None:
        kernel(grid, (threads,), args)

    # a few hundred ms per launch at C=1, L=2**26: fewer repetitions
    return Prepared(run, lambda: h, note=f"CUDA C, one thread per channel, {SEQUENTIAL_WARPS} "
                                         "warps/block, 32x32 tiles through shared memory",
                    budget_ms=2000.0)


CUDA_SEQUENTIAL = Method("cuda-sequential", "baseline", _cuda_sequential_setup,
                         "CUDA C (cupy.RawKernel), one thread per channel, coalesced tiles")


# --- PyTorch ---------------------------------------------------------------------------------

#: the eager loop launches 2 kernels per time step; beyond this L one call takes seconds
TORCH_LOOP_MAX_L = 16384


def _torch_loop_setup(p: Problem) -> Prepared:
    try:
        import torch
    except ImportError as err:
        raise Skip(f"torch not importable ({err})") from None
    if p.L > TORCH_LOOP_MAX_L:
        raise Skip(f"L={p.L} > {TORCH_LOOP_MAX_L}: the eager loop costs ~2 launches a step")
    a, b = p.torch("a"), p.torch("b")
    out = torch.full_like(a, float("nan"))

    def run() -> None:
        h = torch.zeros(p.C, device=a.device, dtype=a.dtype)
        for t in range(p.L):
            h = torch.addcmul(b[:, t], a[:, t], h)
            out[:, t] = h

    return Prepared(run, lambda: out, note="eager loop over t: addcmul + column store",
                    budget_ms=1000.0)


TORCH_LOOP = Method("torch-loop", "baseline", _torch_loop_setup,
                    "PyTorch eager loop over time on the GPU", dtypes=ALL_DTYPES)


def _combine(x: Any, y: Any) -> Any:
    """The affine combine, x earlier than y: (a_x a_y, a_y b_x + b_y)."""
    return (x[0] * y[0], y[0] * x[1] + y[1])


def _torch_assoc_setup(p: Problem) -> Prepared:
    try:
        import torch
        from torch._higher_order_ops.associative_scan import associative_scan
    except ImportError as err:
        raise Skip(f"torch associative_scan not importable ({err})") from None
    a, b = p.torch("a"), p.torch("b")

    def scan(a: Any, b: Any) -> Any:
        return associative_scan(_combine, (a, b), dim=-1, combine_mode="pointwise")[1]

    # one compile a shape (dynamic=False): dynamo counts them per code object and fails past
    # its recompile limit (8), so a run of more shapes starts each from a clean cache
    torch._dynamo.reset()
    fn = torch.compile(scan, dynamic=False, fullgraph=True)
    result: dict[str, Any] = {}

    def run() -> None:
        result["h"] = fn(a, b)

    return Prepared(run, lambda: result["h"], note=f"torch {torch.__version__}, torch.compile, "
                                                   "combine_mode='pointwise'")


TORCH_ASSOC = Method("torch-associative-scan", "baseline", _torch_assoc_setup,
                     "torch associative_scan under torch.compile", dtypes=ALL_DTYPES)


# --- JAX -------------------------------------------------------------------------------------

def _jax_setup(p: Problem) -> Prepared:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
    except ImportError as err:
        raise Skip(f"jax not importable ({err})") from None
    if not any(d.platform == "gpu" for d in jax.devices()):
        raise Skip("jax sees no GPU")
    a = jax.dlpack.from_dlpack(p.a)
    b = jax.dlpack.from_dlpack(p.b)

    @jax.jit
    def scan(a: Any, b: Any) -> Any:
        return jax.lax.associative_scan(_combine, (a, b), axis=-1)[1]

    result: dict[str, Any] = {}

    def run() -> Any:
        result["h"] = scan(a, b)
        return result["h"]

    def output() -> Any:
        import cupy as cp

        return cp.from_dlpack(result["h"])

    return Prepared(run, output, timer="host", block=lambda r: r.block_until_ready(),
                    note=f"jax {jax.__version__}, jit; host timer around block_until_ready")


JAX_ASSOC = Method("jax-associative-scan", "baseline", _jax_setup,
                   "jax.lax.associative_scan under jit")


# --- CUB through cuda-cccl -------------------------------------------------------------------

def _cub_setup(p: Problem) -> Prepared:
    import cupy as cp
    import numpy as np

    if not hasattr(np, "row_stack"):
        # numba-cuda 0.30 registers an overload for np.row_stack, gone in NumPy 2.4
        np.row_stack = np.vstack  # type: ignore[attr-defined]
    try:
        import cuda.compute as cc
        from cuda.compute import ZipIterator, gpu_struct
    except Exception as err:  # ImportError, or the bindings failing to find CUDA
        raise Skip(f"cuda.compute (cuda-cccl) not importable: {err}") from None
    if p.elements >= 2**31:
        raise Skip("more than 2**31 items")
    pair = gpu_struct({"a": np.float32, "b": np.float32}, name="AffinePair")

    def combine(x: Any, y: Any) -> Any:
        return pair(x.a * y.a, y.a * x.b + y.b)

    # One device-wide scan over all C*L items: zeroing a at t = 0 of every channel cuts the
    # carry between channels, which is exact because h[-1] = 0 (a[:, 0] multiplies zero).
    a_cut = p.a.copy()
    a_cut[:, 0] = 0
    d_in = ZipIterator(a_cut.ravel(), p.b.ravel())
    init = pair(1.0, 0.0)
    n = p.elements

    def take_b(x: Any) -> Any:
        return x.b

    # cuda.compute reads the value type of an output transform from its annotations; this
    # module's annotations are strings (postponed evaluation), so give the real types
    take_b.__annotations__ = {"x": pair, "return": np.float32}

    def b_only() -> tuple[Any, Any]:
        # writes h alone: the 12 bytes an element of the problem
        from cuda.compute import TransformOutputIterator

        out = cp.full(n, cp.nan, dtype=cp.float32)
        return TransformOutputIterator(out, take_b), out

    def zipped() -> tuple[Any, Any]:
        # writes (a, b) pairs to two arrays: 16 bytes an element
        out_a = cp.full(n, cp.nan, dtype=cp.float32)
        out_b = cp.full(n, cp.nan, dtype=cp.float32)
        return ZipIterator(out_a, out_b), out_b

    def structs() -> tuple[Any, Any]:
        from numba import cuda as nb_cuda

        rec = nb_cuda.device_array(n, dtype=pair.dtype)
        mem = cp.cuda.UnownedMemory(rec.__cuda_array_interface__["data"][0], 8 * n, rec)
        out_b = cp.ndarray((n, 2), cp.float32, cp.cuda.MemoryPointer(mem, 0))[:, 1]
        out_b.fill(cp.nan)
        return rec, out_b

    from explorer.bench.affine import max_rel_error

    tried = []
    for layout, make in (("h only (TransformOutputIterator)", b_only),
                         ("(a, b) pairs (ZipIterator out)", zipped),
                         ("(a, b) structs", structs)):
        try:
            d_out, out_b = make()
            scanner = cc.make_inclusive_scan(d_in=d_in, d_out=d_out, op=combine,
                                             init_value=init)
            nbytes = scanner(temp_storage=None, d_in=d_in, d_out=d_out, op=combine,
                             init_value=init, num_items=n)
            temp = cp.empty(max(1, int(nbytes)), dtype=cp.uint8)
            if p.ref is not None:  # a variant this version gets wrong falls to the next one
                scanner(temp_storage=temp, d_in=d_in, d_out=d_out, op=combine, init_value=init,
                        num_items=n)
                rel = max_rel_error(out_b.reshape(p.C, p.L), p.ref, xp=cp)
                if not rel < 1e-3:
                    tried.append(f"{layout}: max rel err {rel:.1e}")
                    continue
                out_b.fill(cp.nan)  # the sweep's own check must see the next run's writes
            break
        except Exception as failure:
            text = str(failure).splitlines()[0][:80] if str(failure) else ""
            tried.append(f"{layout}: {type(failure).__name__}: {text}")
    else:
        raise Skip("no output layout worked: " + "; ".join(tried))

    def run() -> None:
        scanner(temp_storage=temp, d_in=d_in, d_out=d_out, op=combine, init_value=init,
                num_items=n)

    try:
        from importlib.metadata import version

        ver = version("cuda-cccl")
    except Exception:
        ver = "?"
    return Prepared(run, lambda: out_b.reshape(p.C, p.L),
                    note=f"cuda-cccl {ver} inclusive_scan over C*L items (a cut at t=0), "
                         f"gpu_struct + ZipIterator in; writes {layout}"
                         + (f"; rejected: {'; '.join(tried)}" if tried else ""))


CUB = Method("cub-inclusive-scan", "baseline", _cub_setup,
             "CUB DeviceScan via cuda.compute.inclusive_scan, affine combine")


# --- accelerated-scan (warp scan) ------------------------------------------------------------

def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _accelerated_scan_setup(p: Problem) -> Prepared:
    if not _pow2(p.L) or not 32 <= p.L <= 65536:
        raise Skip(f"accelerated-scan needs T a power of two in [32, 65536], L={p.L}")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    try:
        import torch
        from accelerated_scan import warp
    except Exception as err:  # ImportError or the JIT build failing
        raise Skip(f"accelerated_scan.warp not importable ({type(err).__name__}: {err})") \
            from None
    # its grid is (batch, channels): keep channels within gridDim.y's 65535
    D = p.C
    while D > 65535:
        if D % 2:
            raise Skip(f"C={p.C} cannot be split into batch x channels <= 65535")
        D //= 2
    B = p.C // D
    a = p.torch("a").view(B, D, p.L)
    b = p.torch("b").view(B, D, p.L)
    out = torch.full_like(b, float("nan"))
    forward = getattr(warp, "warpscan_forward", None)

    def run() -> None:
        if forward is not None:
            forward(a, b, out, False)
        else:
            out.copy_(warp.scan(a, b))

    return Prepared(run, lambda: out.view(p.C, p.L),
                    note=f"accelerated_scan.warp (B={B}, C={D}, T={p.L})"
                         + ("" if forward is not None else " through scan() (allocates)"))


ACCELERATED_SCAN = Method("accelerated-scan", "baseline", _accelerated_scan_setup,
                          "accelerated_scan.warp.scan (the CUDA warp-scan kernel)")


BASELINES: dict[str, Method] = {m.name: m for m in (
    CUDA_SEQUENTIAL, TORCH_LOOP, TORCH_ASSOC, JAX_ASSOC, CUB, ACCELERATED_SCAN)}

#: short names accepted on the command line
ALIASES = {"cuda": "cuda-sequential", "sequential": "cuda-sequential", "torch": "torch-loop",
           "torch-loop": "torch-loop", "torch-scan": "torch-associative-scan",
           "torch-compile": "torch-associative-scan", "jax": "jax-associative-scan",
           "cub": "cub-inclusive-scan", "cccl": "cub-inclusive-scan",
           "accelerated-scan": "accelerated-scan", "mamba": "accelerated-scan"}


def baselines(names: str | list[str] | None = None) -> list[Method]:
    """The baselines by name or alias (all of them for None or ``"all"``; ``"none"`` for none)."""
    if names is None:
        return list(BASELINES.values())
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if names in (["all"],):
        return list(BASELINES.values())
    if names in (["none"], []):
        return []
    out = []
    for n in names:
        key = ALIASES.get(n, n)
        if key not in BASELINES:
            raise ValueError(f"unknown baseline {n!r}; choose from "
                             f"{', '.join(sorted(set(BASELINES) | set(ALIASES)))}")
        if BASELINES[key] not in out:
            out.append(BASELINES[key])
    return out
