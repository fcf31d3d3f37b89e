"""Speed of the derived backward: the adjoint scan plus its elementwise gradients, on the GPU.

    python bench/grad_speed.py                      # GPU machine (CuPy, torch, MLIR to compile)
    python bench/grad_speed.py --dry-run            # anywhere: small sizes on the CPU, checks only
    python bench/grad_speed.py --affine 4096x1024 --selective 2x512x16x1024 --json out.json

Where the GPU machine has no MLIR, compile here and run there (compiles do not depend on sizes):

    python bench/grad_speed.py --build .artifacts/grad        # here: forward + adjoint records
    python bench/grad_speed.py --records .artifacts/grad      # GPU: numpy, sympy, cupy, torch
    python bench/grad_speed.py --records .artifacts/grad --mamba-src ~/mamba   # + mamba-ssm

For the affine scan ``h[t] = a[t] * h[t-1] + b[t]`` and the Mamba selective scan (preset), the
backward of ``compile(text).torch()`` is compared with torch autograd through torch's
``associative_scan`` and, for the affine scan, accelerated-scan's backward.  Methods:

- ``ours``: the op in eager mode as it runs by default (``fuse_backward="auto"``): for the
  selective scan the fused backward kernel (``backward="readouts"``: the loss reads ``y``);
  otherwise the adjoint
  scan (our kernel, ``reverse=True``), then the gradient formulas, fused by inductor for a
  vector recurrence on the GPU from the second backward of a shape (the compile falls in the
  timing's warm-up), for a scalar one traced once per shape and replayed from the second
  backward (``"traced"``: the same torch operations without the formulas' Python);
- ``ours-fused``: the same with the formulas traced once per shape and fused by inductor for
  every recurrence (``fuse_backward="always"``, :mod:`explorer.fused_backward`; the compile
  counts in the setup time);
- ``ours-traced``: the formulas traced once per shape and replayed, for every recurrence
  (``fuse_backward="traced"``);
- ``ours-unfused``: the same with the gradient formulas as eager torch operations
  (``fuse_backward="never"``);
- ``torch-assoc-eager``: autograd through ``associative_scan(combine_mode="generic")`` in eager;
- ``accelerated-scan``: ``accelerated_scan.scalar.scan`` (Triton kernels, forward and backward;
  where the length is not a multiple of its block its kernels are launched as ``scan`` launches
  them, with spare memory after the saved states, which its backward reads past:
  :func:`_padded_scalar`); with ``--warp`` also ``accelerated-scan-warp`` (its CUDA warp
  kernels, built on first import);
- with ``--compile`` (slow to set up: inductor compiles each shape): ``ours+compile``, the same
  op inside ``torch.compile``, and ``torch-assoc``, ``torch-assoc-generic``: autograd through
  ``associative_scan`` under ``torch.compile``, ``combine_mode="pointwise"`` and ``"generic"``;
- with ``--mamba-src CHECKOUT`` (a ``state-spaces/mamba`` checkout), for the selective scan:
  ``mamba-ssm``, its CUDA forward and backward (``selective_scan_cuda.fwd``/``bwd``) built from
  ``csrc/selective_scan`` at benchmark time with torch's extension builder, float32 and sm_90
  only (the binding's dtype dispatch cut to float32 in the build folder; about 90 s on 16
  cores), called through an autograd function as mamba-ssm's ``SelectiveScanFn`` does (no z,
  no delta bias, no softplus: the preset). ``--mamba-module SO`` imports the module such a
  build left in its ``--mamba-build`` folder (``selective_scan_fp32*.so``) instead of building
  it again (the same machine image: torch's ABI).

A method whose setup (compiles included) outlasts ``--setup-limit`` seconds is skipped.

``--step`` times a training step instead of the backward alone: the forward, then
``torch.autograd.grad`` of its output with the same cotangent (a new graph each call, as a
training loop makes), timed as the backward is; ``--step sum`` the same for a loss of the
output's sum (the backward gets autograd's expanded cotangent of ones, as in a training loop's
``y.sum()``). No share of a copy is given (the bytes counted are the backward's).

Only the backward is timed: the forward runs once, then ``torch.autograd.grad(..., retain_graph=
True)`` is timed with CUDA events (warm-up, L2 flushed before each repetition, median), as
:mod:`explorer.bench.timing` does for the forward, the methods taking turns in :data:`ROUNDS`
rounds (the median is of all of a method's repetitions); ``host`` is the median host time of one
such call (enqueueing only), which bounds the backward when it exceeds the GPU time. Gradients are
checked before anything is timed (every method against a float64 loop over a few channels; a method
that fails is reported and not timed). Ratios are of one run on one GPU: ``baseline / ours`` (> 1:
ours is faster) and ``copy / ours``, a device-to-device copy of the bytes a backward must move at
least: the affine scan reads ``a``, the saved ``h`` and ``dL/dh`` and writes ``dL/da``, ``dL/db``
(20 bytes an element); the selective scan reads ``dt``, ``x``, ``B``, ``C``, ``dL/dy`` and writes
their gradients (``A`` and ``D`` are small), with ``B`` and ``C`` shared by the channels as in
Mamba's layout.

``--dry-run`` needs no GPU: small sizes on the CPU (``target="cpu"``, ``associative_scan`` in
its generic eager mode), the same correctness checks, ``torch.compile`` with the ``aot_eager``
backend, and no timing; whatever is missing (torch, MLIR) is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
#: the performance issue's shapes (channels x L) and the Mamba issue's (batch x D x N x L)
AFFINE_SIZES = ["4096x1024", "131072x2048", "16x1048576"]
SELECTIVE_SIZES = ["2x512x16x1024"]
DRY_AFFINE, DRY_SELECTIVE = ["8x300"], ["2x4x4x96"]
#: max |g - g_float64| / max |g_float64| accepted before timing (a float64 loop over a few
#: channels is the reference of every method, ours and the baseline alike)
CHECK_TOL = 1e-3
#: rounds in which every method is timed in turn (each with its share of --budget-ms)
ROUNDS = 4


def _combine(x: Any, y: Any) -> Any:
    """The affine combine, x earlier than y: (a_x a_y, a_y b_x + b_y)."""
    return (x[0] * y[0], y[0] * x[1] + y[1])


class Skip(Exception):
    """A method that cannot run here, and why."""


def _assoc(mode: str, compiled: bool) -> Callable[[Any, Any], Any]:
    """h of the affine scan over the last axis through torch's associative_scan."""
    import torch

    try:
        from torch._higher_order_ops.associative_scan import associative_scan
    except ImportError as err:
        raise Skip(f"torch associative_scan not importable ({err})") from None

    def scan(a: Any, b: Any) -> Any:
        return associative_scan(_combine, (a, b), dim=-1, combine_mode=mode)[1]

    return torch.compile(scan, dynamic=False, fullgraph=True) if compiled else scan


def _baselines(device: str, compiled: bool = False) -> dict[str, Callable[[Any, Any], Any]]:
    """torch's associative_scan with its generic combine in eager mode (no compile, the default);
    with ``compiled`` on the GPU also ``combine_mode="pointwise"`` and ``"generic"`` under
    torch.compile (inductor: tens of seconds of setup a shape)."""
    out = {"torch-assoc-eager": _assoc("generic", False)}
    if compiled and device == "cuda":
        out["torch-assoc"] = _assoc("pointwise", True)
        out["torch-assoc-generic"] = _assoc("generic", True)
    return out


def _accelerated(kind: str) -> Callable[[Any, Any], Any]:
    """h of the affine scan through accelerated-scan's autograd function: ``scalar`` (Triton,
    any length) or ``warp`` (its CUDA kernels, built by torch's extension loader on first
    import; lengths a power of two in [32, 65536])."""
    import os

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    try:
        if kind == "warp":
            from accelerated_scan.warp import scan
        else:
            from accelerated_scan.scalar import scan
    except Exception as err:  # noqa: BLE001 - not installed, or its build failed
        raise Skip(f"accelerated_scan.{kind} not importable ({type(err).__name__}: "
                   f"{str(err)[:200]})") from None
    padded = _padded_scalar() if kind == "scalar" else None

    def run(a: Any, b: Any) -> Any:
        a3, b3 = a.reshape(1, *a.shape), b.reshape(1, *b.shape)
        if padded is not None and a.shape[-1] % SCALAR_BLOCK:
            return padded.apply(a3, b3).reshape(a.shape)
        return scan(a3, b3).reshape(a.shape)

    return run


#: the block of accelerated-scan's Triton kernels (``BLOCK``, steps a program scans at once)
SCALAR_BLOCK = 2048


def _padded_scalar() -> Any:
    """accelerated-scan's Triton forward and backward kernels, launched as its ``scan`` launches
    them, with the saved states followed by :data:`SCALAR_BLOCK` spare floats.  Its backward
    kernel (0.3.1) loads ``states[t - 1]`` masked by ``t > 0`` alone: where the length is not a
    multiple of its block, the last sequence reads up to a block past the end of the states
    (compute-sanitizer: "Invalid __global__ read" in ``backward_scan``), which faults when that
    memory is not mapped (an illegal address that surfaced later in this benchmark, at 4096 x
    1024 with every method in one process).  The loads past the end are masked out of its
    results; the spare floats keep them inside an allocation.  None where the kernels are not
    importable (the run then calls ``scan`` itself)."""
    import torch

    try:
        from accelerated_scan.scalar import backward_scan, forward_scan
    except ImportError:
        return None

    class PaddedScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, forget: Any, inputs: Any) -> Any:
            B, C, T = forget.shape
            spare = torch.empty(B * C * T + SCALAR_BLOCK, device=inputs.device,
                                dtype=inputs.dtype)
            states = spare[:B * C * T].view(B, C, T)
            forward_scan[(B, C)](forget.contiguous(), inputs.contiguous(), states, seqlen=T,
                                 enable_fp_fusion=False)
            ctx.save_for_backward(forget, states)
            return states

        @staticmethod
        def backward(ctx: Any, d_states: Any) -> Any:
            forget, states = ctx.saved_tensors
            B, C, T = forget.shape
            d_forget, d_inputs = torch.empty_like(forget), torch.empty_like(states)
            backward_scan[(B, C)](forget, states, d_states.contiguous(), d_inputs, d_forget,
                                  seqlen=T, enable_fp_fusion=False)
            return d_forget, d_inputs

    return PaddedScan


# -- the problems -------------------------------------------------------------------------------
class Problem:
    """Inputs, the loss's cotangent and the three backward methods of one recurrence and size."""

    name: str
    text: str
    bytes_moved: int

    def __init__(self, device: str, target: str, compile_backend: str | None,
                 records: Path | None = None, warp: bool = False, mamba: Any = None,
                 lane_gradients: bool = False, step: str | None = None) -> None:
        self.device, self.target, self.compile_backend = device, target, compile_backend
        #: time the forward and the backward together (``--step``), not the backward alone:
        #: "cotangent" (the benchmark's) or "sum" (a loss of the output's sum: autograd hands
        #: the backward an expanded cotangent of ones)
        self.step = step
        self.records = records
        self.lane_gradients = lane_gradients
        self.warp = warp
        self.mamba = mamba
        self.peers: dict[str, Callable[[], Callable[[Any, Any], Any]]] = {}

    def op(self) -> Any:
        """The torch op: compiled here, or read from the records of ``--build``."""
        import explorer as ex

        if self.records is None:
            return ex.compile(self.text, target=self.target, strategy="blelloch").torch(
                lane_gradients=self.lane_gradients)
        return record_op(self.records, self.text)

    def inputs(self) -> dict[str, Any]:
        raise NotImplementedError

    def ours_forward(self, op: Any, xs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def baseline_forward(self, xs: dict[str, Any], scan: Callable[[Any, Any], Any]) -> Any:
        raise NotImplementedError

    def methods(self) -> dict[str, Callable[[], tuple[Any, Callable[[], Any]]]]:
        """name -> setup() giving (gradients once, a closure that reruns the backward)."""

        def backward_of(forward: Callable[[dict[str, Any]], Any]) -> tuple[Any, Any]:
            import torch

            xs = {k: v.detach().clone().requires_grad_() for k, v in self.inputs().items()}
            out = forward(xs)
            g = torch.ones_like(out) if self.step == "sum" else self.cotangent(out)
            self.last = (xs, g)
            self.last_forward = lambda: forward(xs)
            leaves = list(xs.values())

            def run() -> Any:
                return torch.autograd.grad(out, leaves, g, retain_graph=True)

            def step() -> Any:
                if self.step == "sum":
                    return torch.autograd.grad(forward(xs).sum(), leaves)
                return torch.autograd.grad(forward(xs), leaves, g)

            return dict(zip(xs, run())), (step if self.step else run)

        def ours(policy: str) -> Callable[[], tuple[Any, Any]]:
            def setup() -> tuple[Any, Any]:
                op = self.op()
                if self.device == "cpu":
                    op.fused.backend = "aot_eager"   # no C++ compiles in the dry run
                with _fusing(op, policy):
                    grads, run = backward_of(lambda xs: self.ours_forward(op, xs))

                def pinned() -> Any:
                    # the methods sharing the operator take turns: each sets its policy (a
                    # context manager a call would add its own host time to the operator's)
                    if op.fuse_backward != policy:
                        op.fuse_backward = policy
                    return run()
                return grads, pinned
            return setup

        def ours_compiled() -> tuple[Any, Any]:
            import torch

            if self.compile_backend is None:
                raise Skip("torch.compile not asked for")
            op = self.op()
            fn = torch.compile(lambda *v: self.ours_forward(op, dict(zip(names, v))),
                               backend=self.compile_backend, fullgraph=True, dynamic=False)
            names = list(self.inputs())
            return backward_of(lambda xs: fn(*xs.values()))

        def baseline(scan: Callable[[Any, Any], Any]) -> Callable[[], tuple[Any, Any]]:
            return lambda: backward_of(lambda xs: self.baseline_forward(xs, scan))

        def peer(make: Callable[[], Callable[[Any, Any], Any]]) -> Callable[[], Any]:
            return lambda: backward_of(lambda xs: self.baseline_forward(xs, make()))

        methods = {"ours": ours("auto"), "ours-fused": ours("always"),
                   "ours-traced": ours("traced"), "ours-unfused": ours("never"),
                   "ours+compile": ours_compiled}
        methods.update({name: baseline(scan) for name, scan in self.scans.items()})
        methods.update({name: peer(make) for name, make in self.peers.items()})
        def fused(forward: Callable[[dict[str, Any]], Any]) -> Callable[[], tuple[Any, Any]]:
            return lambda: backward_of(forward)
        methods.update({name: fused(f) for name, f in self.fused().items()})
        return methods

    def fused(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """Peers that take all the inputs at once (a forward of the whole recurrence)."""
        return {}

    def check(self, grads: dict[str, Any]) -> float:
        """max relative error of some gradients against a float64 loop over a few channels."""
        raise NotImplementedError

    def cotangent(self, out: Any) -> Any:
        import torch

        gen = torch.Generator(device=out.device).manual_seed(1)
        return torch.randn(out.shape, device=out.device, dtype=out.dtype, generator=gen)


def record_op(records: Path, text: str) -> Any:
    """The torch op of ``text`` from the forward and adjoint records that ``--build`` wrote into
    ``records`` (its ``index.json``): no compiler needed."""
    import explorer as ex
    from explorer.compiler import load_compiled
    from explorer.torch_op import torch_op

    fwd, adj, *kernel = json.loads((records / "index.json").read_text())[text]
    adjoint = load_compiled(records / adj)
    # records of --lane-gradients hold the adjoint with the lane gradients
    lane = adjoint.recurrence.text != ex.grad(text).text
    forward = load_compiled(records / fwd)
    op = torch_op(forward, adjoint=adjoint, lane_gradients=lane)
    for k in kernel:   # the fused backward kernel
        torch_op(forward, adjoint=load_compiled(records / k), lane_gradients=lane)
    return op


class AffineProblem(Problem):
    def __init__(self, size: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.C, self.L = (int(v) for v in size.lower().split("x"))
        self.name, self.text = f"affine {self.C}x{self.L}", AFFINE
        self.bytes_moved = 20 * self.C * self.L
        self.scans = _baselines(self.device, self.compile_backend == "inductor")
        if self.device == "cuda":
            self.peers["accelerated-scan"] = lambda: _accelerated("scalar")
            if self.warp:
                self.peers["accelerated-scan-warp"] = lambda: _accelerated("warp")

    def inputs(self) -> dict[str, Any]:
        import torch

        gen = torch.Generator(device=self.device).manual_seed(0)
        shape = (self.C, self.L)
        a = 0.9 + 0.099 * torch.rand(shape, device=self.device, generator=gen)
        b = torch.randn(shape, device=self.device, generator=gen)
        return {"a": a, "b": b}

    def ours_forward(self, op: Any, xs: dict[str, Any]) -> Any:
        return op(**xs)

    def baseline_forward(self, xs: dict[str, Any], scan: Callable[[Any, Any], Any]) -> Any:
        return scan(xs["a"], xs["b"])

    def check(self, grads: dict[str, Any]) -> float:
        """Channels 0 and 1 against float64 (every method has the same inputs and cotangent:
        the reference is computed once)."""
        if getattr(self, "_ref", None) is None:
            self._ref = self._reference()
        return max(_rel(grads[k][:2].double().cpu(), ref) for k, ref in self._ref.items())

    def _reference(self) -> dict[str, Any]:
        """torch autograd through a float64 loop; beyond 4096 steps (an autograd graph of
        millions of nodes) the adjoint recurrence written out, in Python floats."""
        import torch

        xs, g = self.last
        if self.L <= 4096:
            a, b = (xs[k][:2].detach().double().cpu().requires_grad_() for k in "ab")
            h, hs = torch.zeros(2, dtype=torch.float64), []
            for t in range(self.L):
                h = a[:, t] * h + b[:, t]
                hs.append(h)
            (torch.stack(hs, -1) * g[:2].double().cpu()).sum().backward()
            return {"a": a.grad, "b": b.grad}
        da, db = [], []
        for c in range(min(2, len(xs["a"]))):
            A = xs["a"][c].detach().double().cpu().tolist()
            B = xs["b"][c].detach().double().cpu().tolist()
            G = g[c].double().cpu().tolist()
            h, hs = 0.0, []
            for t in range(self.L):
                h = A[t] * h + B[t]
                hs.append(h)
            lam, ga, gb = 0.0, [0.0] * self.L, [0.0] * self.L
            for t in range(self.L - 1, -1, -1):   # lam[t] = dL/dh[t] + a[t+1] lam[t+1]
                lam = G[t] + (A[t + 1] * lam if t + 1 < self.L else 0.0)
                gb[t] = lam
                ga[t] = lam * (hs[t - 1] if t > 0 else 0.0)
            da.append(ga)
            db.append(gb)
        return {"a": torch.tensor(da, dtype=torch.float64),
                "b": torch.tensor(db, dtype=torch.float64)}


class SelectiveProblem(Problem):
    def __init__(self, size: str, **kw: Any) -> None:
        import explorer as ex

        super().__init__(**kw)
        self.b, self.d, self.n, self.L = (int(v) for v in size.lower().split("x"))
        self.name, self.text = f"selective {size}", ex.PRESETS["selective scan"]
        self.bytes_moved = 4 * (5 * self.b * self.d * self.L + 4 * self.b * self.n * self.L)
        self.scans = _baselines(self.device, self.compile_backend == "inductor")

    def inputs(self) -> dict[str, Any]:
        import torch

        gen = torch.Generator(device=self.device).manual_seed(0)
        dev = self.device
        b, d, n, L = self.b, self.d, self.n, self.L
        return {
            "dt": 0.01 + 0.09 * torch.rand(b, d, L, device=dev, generator=gen),
            "A": -(0.5 + 1.5 * torch.rand(d, n, device=dev, generator=gen)),
            "B": torch.randn(b, 1, n, L, device=dev, generator=gen),
            "x": torch.randn(b, d, L, device=dev, generator=gen),
            "C": torch.randn(b, 1, n, L, device=dev, generator=gen),
            "D": torch.randn(d, device=dev, generator=gen),
        }

    def ours_forward(self, op: Any, xs: dict[str, Any]) -> Any:
        return op(**xs)["y"]

    def fused(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """mamba-ssm's CUDA forward and backward (``--mamba-src``), float32."""
        if self.mamba is None:
            return {}
        fn = _mamba_function(self.mamba)
        return {"mamba-ssm": lambda xs: fn.apply(xs["x"], xs["dt"], xs["A"], xs["B"], xs["C"],
                                                 xs["D"])}

    def baseline_forward(self, xs: dict[str, Any], scan: Callable[[Any, Any], Any]) -> Any:
        import torch

        dt, x = xs["dt"][:, :, None, :], xs["x"][:, :, None, :]
        decay = torch.exp(dt * xs["A"][None, :, :, None])            # (b, d, n, L)
        h = scan(decay, dt * xs["B"] * x)
        return (xs["C"] * h).sum(-2) + xs["D"][:, None] * xs["x"]

    def check(self, grads: dict[str, Any]) -> float:
        """Channels 0 and 1 of every batch (B and C are shared by all channels: not checked)."""

        if getattr(self, "_ref", None) is None:
            self._ref = self._reference()
        v = self._ref
        ours = {"dt": grads["dt"][:, :2], "x": grads["x"][:, :2], "A": grads["A"][:2],
                "D": grads["D"][:2]}
        return max(_rel(ours[k].double().cpu(), v[k].grad) for k in ours)

    def _reference(self) -> dict[str, Any]:
        import torch

        xs, g = self.last
        sub = {"dt": xs["dt"][:, :2], "x": xs["x"][:, :2], "A": xs["A"][:2], "D": xs["D"][:2],
               "B": xs["B"][:, 0], "C": xs["C"][:, 0]}
        v = {k: t.detach().double().cpu().requires_grad_() for k, t in sub.items()}
        h, ys = torch.zeros(self.b, 2, self.n, dtype=torch.float64), []
        for t in range(self.L):
            dt, x = v["dt"][..., t, None], v["x"][..., t, None]
            h = torch.exp(dt * v["A"]) * h + dt * v["B"][:, None, :, t] * x
            ys.append((v["C"][:, None, :, t] * h).sum(-1) + v["D"] * x[..., 0])
        (torch.stack(ys, -1) * g[:, :2].double().cpu()).sum().backward()
        return v


def _mamba_function(module: Any) -> Any:
    """An autograd function over mamba-ssm's ``fwd`` and ``bwd`` (its own ``SelectiveScanFn``
    does the same; that module imports packages the GPU machine lacks): no z, no delta bias,
    no softplus, as the preset; the states it saves (``x``, one per 2048 steps) go to
    the backward."""
    import torch

    class MambaScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any) -> Any:
            out, x, *_ = module.fwd(u, delta, A, B, C, D, None, None, False)
            ctx.save_for_backward(u, delta, A, B, C, D, x)
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            u, delta, A, B, C, D, x = ctx.saved_tensors
            du, ddelta, dA, dB, dC, dD, *_ = module.bwd(
                u, delta, A, B, C, D, None, None, dout.contiguous(), x, None, None, False,
                False)
            return du, ddelta, dA, dB, dC, dD

    return MambaScan


# -- running ------------------------------------------------------------------------------------
def _rel(g: Any, ref: Any) -> float:
    return float((g - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _copy_ms(nbytes: int, device: str) -> float | None:
    if device != "cuda":
        return None
    import torch

    from explorer.bench.timing import Flusher, time_cuda

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return time_cuda(lambda: dst.copy_(src), flush=Flusher()).median_ms


class _Limit:
    """Raise :class:`Skip` in the main thread when a method's setup outlasts ``seconds``
    (SIGALRM; no limit where there is none, or with seconds <= 0)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.old: Any = None

    def _expired(self, *_: Any) -> None:
        raise Skip(f"setup took longer than {self.seconds:g} s (--setup-limit)")

    def __enter__(self) -> None:
        if self.seconds > 0 and hasattr(signal, "SIGALRM"):
            self.old = signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)


def host_ms(run: Callable[[], Any], reps: int = 20) -> float:
    """Median host time of one call of ``run`` (enqueueing, not waiting for the GPU)."""
    import torch

    run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(samples)[len(samples) // 2]


def kernel_times(run: Callable[[], Any], reps: int = 5) -> list[tuple[str, float, int]]:
    """(kernel, microseconds a call, launches a call) of ``run``'s GPU work (torch.profiler),
    the largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append((e.key[:70], us / reps, e.count // reps))
    return sorted(rows, key=lambda r: -r[1])


@contextmanager
def _fusing(op: Any, policy: str) -> Iterator[None]:
    """``op.fuse_backward`` set to ``policy`` for the block."""
    before = op.fuse_backward
    op.fuse_backward = policy
    try:
        yield
    finally:
        op.fuse_backward = before


def run_problem(p: Problem, reps_budget_ms: float, setup_limit: float = 0.0,
                kernels: bool = False, only: set[str] | None = None) -> dict[str, Any]:
    """Check and time every method of ``p`` (``only``: those named)."""
    record: dict[str, Any] = {"problem": p.name, "bytes": p.bytes_moved,
                              "timed": f"forward and backward ({p.step})" if p.step
                              else "backward",
                              "methods": {}}
    grads: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    forwards: dict[str, Any] = {}
    for name, setup in p.methods().items():
        if only is not None and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            with _Limit(setup_limit):
                grads[name], runs[name] = setup()
            forwards[name] = p.last_forward
            record["methods"][name] = {"setup_s": round(time.perf_counter() - t0, 2)}
        except Skip as why:
            record["methods"][name] = {"skipped": str(why)}
        except Exception as err:  # noqa: BLE001 - a failing method is reported, not fatal
            record["methods"][name] = {"skipped": f"{type(err).__name__}: {err}"[:300]}
    for name, g in grads.items():   # every method against a float64 loop over a few channels
        err = p.check(g)
        record["methods"][name]["max_rel_error"] = err
        if not err < CHECK_TOL:
            record["methods"][name]["failed"] = f"gradients differ from float64 by {err:.2e}"
            runs.pop(name)
    base_name = next((n for n in grads if n.startswith("torch-assoc")), "")
    ours, base = grads.get("ours"), grads.get(base_name)
    if ours is not None and base is not None:   # all of them, against each other
        record["ours_vs_torch_assoc_grads"] = max(_rel(ours[k], base[k]) for k in base)
    if p.device == "cuda":
        from explorer.bench.timing import Flusher, time_cuda

        flush = Flusher()
        # the methods take turns, ROUNDS times: a drift of the machine's host speed over the
        # run (these backwards are bound by their host time at short shapes) is shared by all
        samples: dict[str, list[float]] = {name: [] for name in runs}
        hosts: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(ROUNDS):
            for name, run in runs.items():
                samples[name] += time_cuda(run, flush=flush,
                                           budget_ms=reps_budget_ms / ROUNDS).samples_ms
                hosts[name].append(host_ms(run))
        for name, run in runs.items():
            record["methods"][name]["ms"] = statistics.median(samples[name])
            record["methods"][name]["host_ms"] = statistics.median(hosts[name])
            record["methods"][name]["forward_host_ms"] = host_ms(forwards[name])
            if kernels and name.startswith("ours"):
                try:
                    record["methods"][name]["kernels"] = kernel_times(run)
                except Exception as err:  # noqa: BLE001 - the profiler is optional
                    record["methods"][name]["kernels"] = [(f"no profile: {err}"[:70], 0.0, 0)]
        copy = None if p.step else _copy_ms(p.bytes_moved, p.device)
        record["copy_ms"] = copy
        timed = {n: m["ms"] for n, m in record["methods"].items() if "ms" in m}
        baselines = {n: t for n, t in timed.items() if not n.startswith("ours")}
        for name, m in record["methods"].items():
            if "ms" in m and copy:
                m["share_of_copy"] = copy / m["ms"]
            if "ms" in m and name.startswith("ours"):
                m["speedup"] = {b: t / m["ms"] for b, t in baselines.items()}
    return record


def _print(record: dict[str, Any], device: str) -> None:
    what = "" if record.get("timed", "backward") == "backward" else ", a training step timed"
    print(f"\n{record['problem']}{what}  ({record['bytes'] / 1e6:.1f} MB moved at least"
          + (f", copy {record['copy_ms']:.4f} ms)" if record.get("copy_ms") else ")"))
    if "ours_vs_torch_assoc_grads" in record:
        print("  ours against torch's associative_scan, all gradients: "
              f"{record['ours_vs_torch_assoc_grads']:.1e}")
    for name, m in record["methods"].items():
        if "skipped" in m:
            print(f"  {name:<22} skipped: {m['skipped']}")
            continue
        parts = [f"setup {m['setup_s']:.1f} s"]
        if "max_rel_error" in m:
            parts.append(f"grad error vs float64 {m['max_rel_error']:.1e}")
        if "failed" in m:
            parts.append("FAILED: " + m["failed"])
        if "ms" in m:
            parts.append(f"{m['ms']:.4f} ms (host {m['host_ms']:.3f} ms, forward's host "
                         f"{m['forward_host_ms']:.3f} ms)")
            for b, ratio in m.get("speedup", {}).items():
                parts.append(f"{ratio:.2f}x {b}")
            if "share_of_copy" in m:
                parts.append(f"{m['share_of_copy']:.2f} of copy")
        elif device != "cuda":
            parts.append("not timed (no GPU)")
        print(f"  {name:<22} " + ", ".join(parts))
        for kernel, us, count in m.get("kernels", []):
            print(f"      {us:9.1f} us  x{count}  {kernel}")


#: ``--variant``: the strategy and options of the forward and adjoint compiles.
#: ``blelloch-staged``: the adjoint's tiles through the stage (``blelloch`` gives a vector
#: recurrence's adjoint direct tiles, :data:`explorer.adjoint_options.DIRECT_ADJOINT`).
#: ``warp32-fast``: one warp a block and approximate exp, as ``mamba_speed.py``'s fastest forward
#: (mamba-ssm's kernels, forward and backward, are built with ``--use_fast_math``)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "blelloch": ("blelloch", {}),
    "blelloch-staged": ("blelloch", {"tile_layout": "staged"}),
    "warp32": ("warp_shuffle", {"block_size": 32}),
    "blelloch-direct": ("blelloch", {"tile_layout": "direct"}),
    "warp32-direct": ("warp_shuffle", {"block_size": 32, "tile_layout": "direct"}),
    "warp32-fast": ("warp_shuffle", {"block_size": 32, "fast_math": "fast"}),
}


def build(folder: Path, variant: str = "blelloch", lane_gradients: bool = False) -> None:
    """Compile the forward and the adjoint of both recurrences for CUDA; write the records
    (``lane_gradients``: the adjoint of :func:`explorer.autodiff.grad` with them)."""
    import explorer as ex

    strategy, options = VARIANTS[variant]
    folder.mkdir(parents=True, exist_ok=True)
    index = {}
    for i, text in enumerate([AFFINE, ex.PRESETS["selective scan"]]):
        ex.compile(text, target="cuda", strategy=strategy, outputs="all", **options).dump(
            folder / f"{i}-fwd.json.gz")
        ex.grad(text, lane_gradients).compile(target="cuda", strategy=strategy, **options).dump(
            folder / f"{i}-adj.json.gz")
        index[text] = [f"{i}-fwd.json.gz", f"{i}-adj.json.gz"]
        if ex.compile(text, target="cpu").form.kind == "diagonal" and not lane_gradients:
            # the fused backward kernels, the op's default backward of the selective scan: a
            # loss of the readouts alone runs the "readouts" one, a loss of the states too the
            # other
            fast = {k: v for k, v in options.items() if k == "fast_math"}
            for which, tag in ((True, "bwk"), ("readouts", "bwr")):
                ex.compile(text, target="cuda", strategy=strategy, backward=which,
                           **fast).dump(folder / f"{i}-{tag}.json.gz")
                index[text].append(f"{i}-{tag}.json.gz")
    (folder / "index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {len(index)} forward and adjoint records to {folder}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="small sizes on the CPU: correctness checks only, no timing")
    ap.add_argument("--affine", nargs="*", default=None, help="CxL sizes of the affine scan")
    ap.add_argument("--selective", nargs="*", default=None,
                    help="BxDxNxL sizes of the selective scan")
    ap.add_argument("--budget-ms", type=float, default=200.0, help="timing budget per method")
    ap.add_argument("--compile", action="store_true",
                    help="also time ours inside torch.compile and the torch.compile baselines "
                         "(inductor; slow to set up)")
    ap.add_argument("--warp", action="store_true",
                    help="also accelerated-scan's CUDA warp kernels (built on first import)")
    ap.add_argument("--kernels", action="store_true",
                    help="list the GPU kernels of our backward and their times (torch.profiler)")
    ap.add_argument("--setup-limit", type=float, default=120.0,
                    help="seconds a method's setup may take before it is skipped (0: none)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--build", type=Path, help="compile the ops (needs MLIR) into this folder")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="blelloch",
                    help="with --build: the strategy and options of the compiles")
    ap.add_argument("--records", type=Path, help="run the ops compiled by --build")
    ap.add_argument("--lane-gradients", action="store_true",
                    help="the gradients of B and C as lane readouts of the adjoint (with "
                         "--build, or compiling here; records say which they hold)")
    ap.add_argument("--mamba-src", type=Path,
                    help="a state-spaces/mamba checkout: build its CUDA selective scan "
                         "(forward and backward, float32, sm_90) and time its backward")
    ap.add_argument("--mamba-build", type=Path, default=Path("/tmp/mamba-ssm-grad"),
                    help="build folder for --mamba-src")
    ap.add_argument("--mamba-module", type=Path,
                    help="instead of --mamba-src: the module it built (selective_scan_fp32*.so "
                         "in its build folder), imported as it is")
    ap.add_argument("--step", nargs="?", const="cotangent", choices=["cotangent", "sum"],
                    help="time a training step (the forward, then the backward) instead of "
                         "the backward alone; 'sum': a loss of the output's sum")
    ap.add_argument("--methods", type=lambda v: set(v.split(",")), default=None,
                    help="comma list: time only these methods (e.g. ours,ours+compile)")
    args = ap.parse_args(argv)
    if args.build:
        build(args.build, args.variant, args.lane_gradients)
        return 0
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return 0
    if args.records is None:
        try:
            import mlir.ir  # noqa: F401
        except ImportError:
            print("skipped: MLIR's Python bindings are not installed (compile the ops where "
                  "they are with --build, then run with --records)")
            return 0
    cuda = False
    if not args.dry_run:
        from explorer.runtime.cuda import gpu_unavailable_reason

        why = gpu_unavailable_reason() or (None if torch.cuda.is_available()
                                           else "torch sees no CUDA device")
        if why:
            print(f"no GPU ({why}): running the dry run instead")
        cuda = why is None
    device = "cuda" if cuda else "cpu"
    kw = {"device": device, "target": "cuda" if cuda else "cpu",
          "compile_backend": ("inductor" if args.compile else None) if cuda else "aot_eager",
          "records": args.records, "warp": args.warp, "lane_gradients": args.lane_gradients,
          "step": args.step}
    affine = args.affine if args.affine is not None else (AFFINE_SIZES if cuda else DRY_AFFINE)
    selective = args.selective if args.selective is not None else (
        SELECTIVE_SIZES if cuda else DRY_SELECTIVE)
    env: dict[str, Any] = {}
    if cuda:   # what the numbers depend on, printed and kept with them
        from explorer.bench.results import environment

        env = environment()
        libs = ", ".join(f"{k} {v}" for k, v in env.get("libraries", {}).items())
        print(f"GPU: {env.get('gpu') or torch.cuda.get_device_name()}, driver "
              f"{env.get('driver', 'unknown')}; {libs}")
    if cuda and args.mamba_src is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from mamba_speed import build_mamba_grad

        kw["mamba"], secs, what = build_mamba_grad(args.mamba_src, args.mamba_build)
        print(f"mamba-ssm built in {secs:.1f} s from {what}")
        env["mamba-ssm"] = f"built from {what}"
    elif cuda and args.mamba_module is not None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("selective_scan_fp32", args.mamba_module)
        if spec is None or spec.loader is None:
            raise SystemExit(f"--mamba-module: {args.mamba_module} is not a module")
        kw["mamba"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kw["mamba"])
        print(f"mamba-ssm from {args.mamba_module} (built earlier with --mamba-src)")
        env["mamba-ssm"] = f"the module {args.mamba_module}"
    records, failed = [], False
    problems: list[Callable[[], Problem]] = [
        *(lambda s=s: AffineProblem(s, **kw) for s in affine),
        *(lambda s=s: SelectiveProblem(s, **kw) for s in selective)]
    for make in problems:
        try:
            problem = make()
        except Skip as why:
            print(f"skipped: {why}")
            continue
        record = run_problem(problem, args.budget_ms, args.setup_limit, args.kernels,
                             args.methods)
        _print(record, device)
        # a baseline with wrong gradients is reported; only ours failing fails the run
        failed |= any("failed" in m for n, m in record["methods"].items()
                      if n.startswith("ours"))
        records.append(record)
        if cuda:
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"device": device, "environment": env,
                                         "records": records}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
