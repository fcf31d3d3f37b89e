"""Speed of the Mamba selective scan at real sizes, against mamba-ssm's CUDA forward.

    python bench/mamba_speed.py --build .artifacts/mamba          # here: compile (needs MLIR)
    python bench/mamba_speed.py --artifacts .artifacts/mamba \\
        --mamba-src /path/to/state-spaces/mamba --json out.json   # GPU: numpy, cupy, torch
    # bf16 inputs and output (fp32 state), as mamba-ssm takes them: --dtype bfloat16 in both

The recurrence is the preset "Mamba selective scan" (``delta_bias``, ``delta_softplus``, the
``D`` skip and the ``z`` gate, as mamba-ssm's ``selective_scan_fn`` computes them).  Shapes are
batch x D channels x N state lanes x L steps; ``B`` and ``C`` are shared by the D channels of a
batch row, ``(batch, 1, N, L)``, as in Mamba's layout.

Methods, each timed with CUDA events after warm-up, L2 flushed before each repetition, median
(:mod:`explorer.bench.timing`):

- ``ours (call)``: what a user's ``k(x=..., dt=..., ...)`` costs on torch tensors, marshalling
  and allocation of the outputs included;
- ``ours (kernels)``: the same launch prepared once (``k.prepare``), kernels only;
- ``mamba-ssm``: ``selective_scan_cuda.fwd`` built from the sources of ``--mamba-src``
  (``csrc/selective_scan``) at benchmark time with torch's extension builder, for sm_90 only, the
  forward alone (the backward's sources take minutes to build and are not needed here); nothing
  of it is kept in this repository.  ``--mamba-build`` names the build folder (reused);
- ``selective_scan_ref``: mamba-ssm's pure-torch reference, imported from ``--mamba-src``;
- ``torch associative_scan``: the same ``y`` in torch, the lanes' states by
  ``torch._higher_order_ops.associative_scan`` (eager, ``combine_mode="generic"``) over the
  (decay, input) pairs of every channel and lane, in float32 (up to ``--assoc-max-len`` steps:
  it holds several B x D x N x L arrays);
- ``copy``: a device-to-device copy of the bytes a fused forward must move at least: x, dt, z
  read and y written (batch x D x L each), B and C read (batch x N x L each).

Correctness comes first: on a sample of channels (first, last and a few between) ``y`` of every
method is compared with the float64 reference of the recurrence
(:func:`explorer.reference`); a method off by more than ``CHECK_TOL`` (relative to the
reference's largest value) is reported and not timed.  A size whose arrays do not fit the GPU's
free memory is skipped and says how much it would need.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the issue's shapes: batch 8, D = 1536, N = 16
DEFAULT_SHAPES = ["8x1536x16x2048", "8x1536x16x8192", "8x1536x16x32768", "8x1536x16x131072"]
#: max |y - y_float64| / max |y_float64| on the sampled channels before a method is timed
CHECK_TOL = 2e-3
#: the same with 16-bit inputs and output: y rounded to bf16 is off by up to 2^-9 of itself
CHECK_TOL_16 = 1e-2
#: ``--dtype``: the dtype of x, dt, z, B, C and y (A, D and delta_bias stay float32, the state
#: and the arithmetic are float32), as mamba-ssm's forward takes them
DTYPES = ("float32", "bfloat16")
#: largest copy timed for the roofline (bytes); longer ones are scaled from it
COPY_MAX = 4 * 2**30
#: channels checked against float64 (first, last and these many between)
SAMPLED = 4
#: the compiles ``--build`` makes (``--strategies`` names them): folder name -> strategy and
#: options. ``warp32-fast``: the warp-shuffle tree with one warp a block and approximate exp
#: (``fast_math="fast"``, as mamba-ssm's kernels are built with ``--use_fast_math``), the
#: fastest in fp32 on an H100 (README); ``warp32-fast16``: the same with 16 elements a thread,
#: the fastest in bf16; ``warp64-fast``: two warps a block; ``warp32``: exact exp
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "sequential": ("sequential", {}),
    "blelloch": ("blelloch", {}),
    "warp_shuffle": ("warp_shuffle", {}),
    "warp32": ("warp_shuffle", {"block_size": 32}),
    "warp64-fast": ("warp_shuffle", {"block_size": 64, "fast_math": "fast"}),
    "warp32-fast": ("warp_shuffle", {"block_size": 32, "fast_math": "fast"}),
    "warp32-fast16": ("warp_shuffle", {"block_size": 32, "fast_math": "fast",
                                       "elements_per_thread": 16}),
}
STRATEGIES = ("sequential", "blelloch", "warp32-fast", "warp32-fast16")


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    from explorer.bench.sweep import parse_count

    try:
        parts = [parse_count(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) != 4:
        raise SystemExit(f"a shape is batch x D x N x L, e.g. 8x1536x16x2048 (got {text!r})")
    return parts[0], parts[1], parts[2], parts[3]


# -- building here --------------------------------------------------------------------------------
def variants(names: tuple[str, ...]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, strategy, options) of each variant named (:data:`VARIANTS`); an unknown name
    stops the run before anything is compiled."""
    unknown = [s for s in names if s not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant {', '.join(unknown)}; choose from "
                         f"{', '.join(VARIANTS)}")
    return [(s, *VARIANTS[s]) for s in names]


def build(folder: Path, strategies: tuple[str, ...], dtype: str = "float32") -> None:
    """Compile the preset as each variant of :data:`VARIANTS` named into ``folder/<name>``
    (artifact directories), for inputs and output of ``dtype``."""
    import explorer as ex
    from explorer.presets import PRESETS

    chosen = variants(strategies)
    text = PRESETS["Mamba selective scan"]
    folder.mkdir(parents=True, exist_ok=True)
    for s, strategy, options in chosen:
        t0 = time.perf_counter()
        ex.compile(text, strategy=strategy, dtype=dtype, cache=False, **options).save(folder / s)
        print(f"compiled {s} in {time.perf_counter() - t0:.2f} s -> {folder / s}")


# -- mamba-ssm, built at benchmark time -----------------------------------------------------------
def _forward_only_source(cpp: str) -> str:
    """mamba-ssm's binding cut to its forward: everything before the backward's entry point
    ``selective_scan_bwd``, plus a module that binds ``fwd`` alone (the backward's kernels are
    not built; its launcher stays declared and unused)."""
    import re

    found = re.search(r"^std::vector<at::Tensor>\s*\nselective_scan_bwd\(", cpp, re.M)
    if found is None or "selective_scan_fwd(" not in cpp[:found.start()]:
        raise RuntimeError("selective_scan.cpp: no selective_scan_bwd after selective_scan_fwd "
                           "(another layout of mamba-ssm's sources)")
    head = cpp[:found.start()]
    return (head + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
            '    m.def("fwd", &selective_scan_fwd, "Selective scan forward");\n}\n')


#: our own dispatch for a float32-only build: the binding's macros are redefined to take float32
#: inputs and weights alone (other dtypes are refused with an error), so that only the float32
#: kernels are compiled and linked
_FP32_DISPATCH = """
#undef DISPATCH_ITYPE_FLOAT_AND_HALF_AND_BF16
#undef DISPATCH_WTYPE_FLOAT_AND_COMPLEX
#define DISPATCH_ITYPE_FLOAT_AND_HALF_AND_BF16(ITYPE, NAME, ...) \\
    { TORCH_CHECK(ITYPE == at::ScalarType::Float, NAME, ": built for float32 only"); \\
      using input_t = float; __VA_ARGS__(); }
#define DISPATCH_WTYPE_FLOAT_AND_COMPLEX(WTYPE, NAME, ...) \\
    { TORCH_CHECK(WTYPE == at::ScalarType::Float, NAME, ": built for float32 only"); \\
      using weight_t = float; __VA_ARGS__(); }
"""


def _fp32_source(cpp: str) -> str:
    """mamba-ssm's binding with its dtype dispatch cut to float32 (:data:`_FP32_DISPATCH`
    inserted before the kernels' declarations)."""
    anchor = "template<typename input_t, typename weight_t>\nvoid selective_scan_fwd_cuda"
    if anchor not in cpp or "selective_scan_bwd(" not in cpp:
        raise RuntimeError("selective_scan.cpp: no selective_scan_fwd_cuda declaration or no "
                           "selective_scan_bwd (another layout of mamba-ssm's sources)")
    return cpp.replace(anchor, _FP32_DISPATCH + anchor, 1)


def build_mamba_grad(src: Path, build_dir: Path) -> tuple[Any, float, str]:
    """Build mamba-ssm's selective-scan forward and backward, float32 only, for sm_90;
    (module with ``fwd`` and ``bwd``, seconds, what was built)."""
    return _build(src, build_dir, "selective_scan_fp32", _fp32_source,
                  ["selective_scan_fwd_fp32.cu", "selective_scan_bwd_fp32_real.cu"],
                  "forward and backward, fp32, sm_90")


def _csrc(src: Path) -> Path:
    csrc = src / "csrc" / "selective_scan"
    if not (csrc / "selective_scan.cpp").is_file():
        raise FileNotFoundError(f"{csrc}/selective_scan.cpp not found (--mamba-src is the "
                                "root of a state-spaces/mamba checkout)")
    return csrc


#: nvcc flags of mamba-ssm's own setup.py for its CUDA scan, for sm_90 only
NVCC_FLAGS = ["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__",
              "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__",
              "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__",
              "-U__CUDA_NO_BFLOAT162_CONVERSIONS__", "--expt-relaxed-constexpr",
              "--expt-extended-lambda", "--use_fast_math", "-gencode",
              "arch=compute_90,code=sm_90", "--threads", "4"]


def build_mamba(src: Path, build_dir: Path) -> tuple[Any, float, str]:
    """Build mamba-ssm's selective-scan forward for sm_90; (module, seconds, what was built)."""
    return _build(src, build_dir, "selective_scan_fwd_only", _forward_only_source,
                  [f"selective_scan_fwd_{t}.cu" for t in ("fp32", "fp16", "bf16")],
                  "forward, fp32/fp16/bf16, sm_90")


def _build(src: Path, build_dir: Path, name: str, cut: Callable[[str], str],
           kernels: list[str], what: str) -> tuple[Any, float, str]:
    """Build ``name`` with torch's extension builder from mamba-ssm's binding, rewritten by
    ``cut`` into the build folder, and its ``kernels`` (files of ``csrc/selective_scan``)."""
    from torch.utils.cpp_extension import load

    csrc = _csrc(src)
    build_dir.mkdir(parents=True, exist_ok=True)
    binding = build_dir / f"{name}.cpp"
    binding.write_text(cut((csrc / "selective_scan.cpp").read_text()))
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    t0 = time.perf_counter()
    module = load(name=name, sources=[str(binding)] + [str(csrc / k) for k in kernels],
                  extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=NVCC_FLAGS,
                  extra_include_paths=[str(csrc)], build_directory=str(build_dir),
                  verbose=False)
    return module, time.perf_counter() - t0, f"{csrc} ({what})"


def mamba_ref(src: Path) -> Callable[..., Any]:
    """mamba-ssm's ``selective_scan_ref`` (pure torch), imported from the checkout."""
    import types

    # the package's __init__ imports every model (and their optional kernels): bind the package
    # to its folder without running it, then import the one module
    if "mamba_ssm" not in sys.modules:
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__ = [str(src / "mamba_ssm")]
        sys.modules["mamba_ssm"] = pkg
    mod = importlib.import_module("mamba_ssm.ops.selective_scan_interface")
    return mod.selective_scan_ref  # type: ignore[no-any-return]


def _combine(x: Any, y: Any) -> Any:
    """The affine combine, x earlier than y: (a_x a_y, a_y b_x + b_y)."""
    return (x[0] * y[0], y[0] * x[1] + y[1])


def torch_assoc_y(p: Problem) -> Any:
    """``y`` of the preset through torch's ``associative_scan`` (eager, generic combine), in
    float32, returned in the inputs' dtype."""
    import torch
    import torch.nn.functional as F
    from torch._higher_order_ops.associative_scan import associative_scan

    x, z = p.x.float(), p.z.float()
    delta = F.softplus(p.dt.float() + p.dt_bias[:, None])               # (batch, D, L)
    a = torch.exp(delta[:, :, None, :] * p.A[None, :, :, None])         # (batch, D, N, L)
    b = (delta * x)[:, :, None, :] * p.B.float()                        # B: (batch, 1, N, L)
    h = associative_scan(_combine, (a, b), dim=-1, combine_mode="generic")[1]
    del a, b
    y = (h * p.C.float()).sum(2) + p.Dskip[:, None] * x
    return (y * z * torch.sigmoid(z)).to(p.x.dtype)


# -- the problem ----------------------------------------------------------------------------------
class Problem:
    """Inputs of one shape on the GPU, in Mamba's layout, and the float64 check."""

    def __init__(self, batch: int, D: int, N: int, L: int, seed: int = 0,
                 dtype: str = "float32") -> None:
        import torch

        self.batch, self.D, self.N, self.L, self.dtype = batch, D, N, L, dtype
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"

        def randn(*shape: int, scale: float = 1.0) -> Any:
            return torch.randn(*shape, generator=g, device=dev) * scale

        self.x = randn(batch, D, L)
        self.dt = randn(batch, D, L, scale=0.5) - 1.0   # softplus(dt + bias) ~ 0.1 .. 1
        self.z = randn(batch, D, L)
        self.B = randn(batch, 1, N, L)
        self.C = randn(batch, 1, N, L)
        self.A = -torch.rand(D, N, generator=g, device=dev) * 2.0 - 0.1   # decays
        self.Dskip = randn(D)
        self.dt_bias = randn(D, scale=0.1)
        if dtype != "float32":   # the timed inputs in 16 bits; the reference reads the same
            narrow = getattr(torch, dtype)
            self.x, self.dt, self.z, self.B, self.C = (
                t.to(narrow) for t in (self.x, self.dt, self.z, self.B, self.C))

    @property
    def fused_bytes(self) -> int:
        """What a fused forward must move: x, dt, z read, y written; B, C read (4 bytes each
        in float32, 2 in bfloat16)."""
        size = 4 if self.dtype == "float32" else 2
        return size * (4 * self.batch * self.D * self.L + 2 * self.batch * self.N * self.L)

    @property
    def tolerance(self) -> float:
        return CHECK_TOL if self.dtype == "float32" else CHECK_TOL_16

    def ours_arrays(self) -> dict[str, Any]:
        return {"x": self.x, "dt": self.dt, "z": self.z, "B": self.B, "C": self.C,
                "A": self.A, "D": self.Dskip, "dt_bias": self.dt_bias}

    def channels(self) -> list[tuple[int, int]]:
        """(batch row, channel) pairs checked against float64."""
        total = self.batch * self.D
        picks = sorted({0, total - 1, *[(i + 1) * total // (SAMPLED + 1) for i in range(SAMPLED)]})
        return [(c // self.D, c % self.D) for c in picks]

    def reference(self, text: str) -> dict[tuple[int, int], Any]:
        """Float64 y of the sampled channels (on the host)."""
        import explorer as ex

        out = {}
        for b, d in self.channels():
            def host(t: Any) -> Any:
                return t.detach().double().cpu().numpy()
            out[(b, d)] = ex.reference(
                text, x=host(self.x[b, d]), dt=host(self.dt[b, d]), z=host(self.z[b, d]),
                B=host(self.B[b, 0]), C=host(self.C[b, 0]), A=host(self.A[d]),
                D=float(self.Dskip[d]), dt_bias=float(self.dt_bias[d]))["y"]
        return out

    def error(self, y: Any, ref: dict[tuple[int, int], Any]) -> float:
        import numpy as np

        worst = 0.0
        for (b, d), r in ref.items():
            got = y[b, d].detach().double().cpu().numpy()
            scale = max(float(np.max(np.abs(r))), 1e-30)
            worst = max(worst, float(np.max(np.abs(got - r))) / scale)
        return worst


def check_dtypes(kernels: dict[str, Any], dtype: str) -> None:
    """Refuse artifacts compiled for another input dtype than the run's (they would be given
    tensors they do not read)."""
    wrong = {s: k.artifact.dtype for s, k in kernels.items() if k.artifact.dtype != dtype}
    if wrong:
        listed = ", ".join(f"{s} ({d})" for s, d in wrong.items())
        raise SystemExit(f"--dtype {dtype}, but these artifacts were compiled for another "
                         f"dtype: {listed}; build them with --build DIR --dtype {dtype}")


def _y(out: Any) -> Any:
    """The readout ``y`` of a call's result (a dict when states are returned too)."""
    return out["y"] if isinstance(out, dict) else out


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import explorer as ex
    from explorer.bench.timing import Flusher
    from explorer.presets import PRESETS

    text = PRESETS["Mamba selective scan"]
    device = torch.cuda.get_device_name()
    report: dict[str, Any] = {"device": device, "driver": _driver(), "torch": torch.__version__,
                              "rows": [], "dtype": args.dtype}
    print(f"GPU: {device}, driver {report['driver']}, torch {torch.__version__}, "
          f"{args.dtype}")
    kernels = {s: ex.load(args.artifacts / s) for s in args.strategies
               if (args.artifacts / s).is_dir()}
    check_dtypes(kernels, args.dtype)
    mamba = None
    if args.mamba_src is not None:
        try:
            mamba, secs, what = build_mamba(args.mamba_src, args.mamba_build)
            report["mamba_build"] = {"seconds": round(secs, 1), "what": what}
            print(f"mamba-ssm forward built in {secs:.1f} s from {what}")
        except Exception as err:   # the baseline is reported missing, the rest still runs
            report["mamba_build"] = {"error": f"{type(err).__name__}: {err}"}
            print(f"mamba-ssm: not built: {type(err).__name__}: {str(err)[-2000:]}")
    ref_fn = None
    if args.mamba_src is not None and not args.no_ref:
        try:
            ref_fn = mamba_ref(args.mamba_src)
        except Exception as err:
            print(f"selective_scan_ref: not importable: {type(err).__name__}: {err}")
    flush = Flusher()
    for shape in args.shapes:
        report["rows"].append(_one_shape(shape, text, kernels, mamba, ref_fn, flush, args))
        torch.cuda.empty_cache()
    return report


def _one_shape(shape: str, text: str, kernels: dict[str, Any], mamba: Any,
               ref_fn: Callable[..., Any] | None, flush: Any, args: argparse.Namespace
               ) -> dict[str, Any]:
    """Check, then time every method at one shape; the report's row."""
    import torch

    from explorer.bench.timing import time_cuda

    batch, D, N, L = _parse_shape(shape)
    row: dict[str, Any] = {"shape": shape, "methods": {}}
    p = Problem(batch, D, N, L, dtype=args.dtype)
    ref = p.reference(text)
    # the copy roofline: a copy of the fused bytes, or of COPY_MAX bytes scaled up to them
    # (past a few GiB a copy's bandwidth no longer changes, and two buffers of 24 GiB
    # would not fit beside the inputs)
    copied = min(p.fused_bytes, COPY_MAX)
    copy_src = torch.empty(copied // 4, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    t_copy = time_cuda(partial(copy_dst.copy_, copy_src), flush=flush).median_ms
    t_copy *= p.fused_bytes / copied
    del copy_src, copy_dst
    row["copy_ms"] = t_copy
    scaled = "" if copied == p.fused_bytes else f", scaled from {_gib(copied)}"
    print(f"\n{shape}: copy of the fused bytes ({_gib(p.fused_bytes)}{scaled}) "
          f"{t_copy:.3f} ms")

    def record(name: str, y: Any, fn: Callable[[], Any] | None) -> None:
        err = p.error(y, ref)
        entry: dict[str, Any] = {"max_rel_err": err}
        row["methods"][name] = entry
        if err > p.tolerance or not math.isfinite(err):
            entry["skipped"] = f"wrong: error {err:.2e} > {p.tolerance}"
            print(f"  {name:<22} WRONG (error {err:.2e}), not timed")
            return
        if fn is None:
            return
        t = time_cuda(fn, flush=flush, budget_ms=args.budget_ms).median_ms
        entry.update(ms=t, of_copy=t_copy / t)
        print(f"  {name:<22} {t:9.3f} ms  of copy {t_copy / t:6.3f}  err {err:.1e}")

    for s, k in kernels.items():
        try:
            arrays = p.ours_arrays()
            y = _y(k(**arrays))
            record(f"ours {s} (call)", y, partial(k, **arrays))
            del y
            prepared = k.prepare(**arrays)
            prepared.launch()
            record(f"ours {s} (kernels)", _y(prepared.result()), prepared.launch)
            del prepared
        except Exception as err:    # torch's and CuPy's OutOfMemoryError: say so, go on
            if "OutOfMemory" not in type(err).__name__:
                raise
            free, _ = torch.cuda.mem_get_info()
            row["methods"][f"ours {s} (call)"] = {"skipped": f"out of GPU memory ({err})"}
            print(f"  ours {s}: out of GPU memory ({_gib(free)} free): {str(err)[:200]}")
        torch.cuda.empty_cache()
    if mamba is not None:
        args_m = (p.x, p.dt, p.A, p.B, p.C, p.Dskip, p.z, p.dt_bias, True)
        y = mamba.fwd(*args_m)[2]
        record("mamba-ssm", y, lambda: mamba.fwd(*args_m))
        del y, args_m
    if ref_fn is not None and L <= args.ref_max_len:
        def call_ref() -> Any:
            return ref_fn(p.x, p.dt, p.A, p.B[:, 0], p.C[:, 0], D=p.Dskip, z=p.z,
                          delta_bias=p.dt_bias, delta_softplus=True)
        record("selective_scan_ref", call_ref(), call_ref)
        del call_ref
    if L <= args.assoc_max_len:
        try:
            record("torch associative_scan", torch_assoc_y(p), partial(torch_assoc_y, p))
        except Exception as err:    # out of memory, or this torch has no associative_scan
            row["methods"]["torch associative_scan"] = {"skipped": f"{type(err).__name__}: "
                                                                  f"{str(err)[:200]}"}
            print(f"  torch associative_scan: skipped ({type(err).__name__}: {str(err)[:200]})")
        torch.cuda.empty_cache()
    base = row["methods"].get("mamba-ssm", {}).get("ms")
    if base:
        for m in row["methods"].values():
            if "ms" in m:
                m["vs_mamba"] = base / m["ms"]
    return row


def _driver() -> str:
    try:
        import subprocess

        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return "?"


def table(report: dict[str, Any]) -> str:
    """Markdown: shape, method, ms, ratio to mamba-ssm, share of copy, error."""
    lines = [f"GPU: {report['device']} (driver {report['driver']}), "
             f"{report.get('dtype', 'float32')}",
             "", "| shape | method | ms | mamba-ssm / method | of copy | max rel err |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in report["rows"]:
        for name, m in row["methods"].items():
            if "ms" in m:
                vs = f"{m['vs_mamba']:.2f}" if "vs_mamba" in m else "-"
                lines.append(f"| {row['shape']} | {name} | {m['ms']:.3f} | {vs} | "
                             f"{m['of_copy']:.3f} | {m['max_rel_err']:.1e} |")
            else:
                lines.append(f"| {row['shape']} | {name} | - | - | - | {m.get('skipped', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, help="compile the preset into this folder (needs MLIR)")
    ap.add_argument("--artifacts", type=Path, help="artifact folder written by --build")
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGIES),
                    help=f"compiles to build or time, by folder name ({', '.join(VARIANTS)})")
    ap.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES,
                    help="batch x D x N x L, e.g. 8x1536x16x2048")
    ap.add_argument("--mamba-src", type=Path, help="root of a state-spaces/mamba checkout")
    ap.add_argument("--mamba-build", type=Path, default=Path("/tmp/mamba-fwd-build"))
    ap.add_argument("--no-ref", action="store_true", help="skip selective_scan_ref")
    ap.add_argument("--ref-max-len", type=int, default=8192,
                    help="longest L at which selective_scan_ref runs (it is slow)")
    ap.add_argument("--assoc-max-len", type=int, default=2048,
                    help="longest L at which torch's associative_scan runs (0: never; it holds "
                         "several batch x D x N x L arrays)")
    ap.add_argument("--budget-ms", type=float, default=300.0)
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="x, dt, z, B, C and y in this dtype (A, D, delta_bias, the state: "
                         "float32); --build compiles for it, a run checks the artifacts match")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if args.build is not None:
        build(args.build, tuple(args.strategies), args.dtype)
        return 0
    if args.artifacts is None:
        ap.error("--artifacts (a folder written by --build) is needed to run")
    report = run(args)
    print("\n" + table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
