"""Gradients of compiled recurrences (:mod:`explorer.autodiff`, ``Compiled.torch()``) on the CPU.

The reference: torch autograd through a float64 torch loop of the recurrence written here
(:func:`torch_reference`, the statements evaluated step by step from the parsed tree, independent
of the affine form and of the derivation), on the same float32-representable inputs, with a random
cotangent for every output.  Tolerances, on ``max|g - g_ref| / max|g_ref|`` for every gradient:

- the kernels (float32 tensors, ``target="cpu"``): ``KERNEL_TOL = 1e-4`` (the largest error seen
  is about 1e-6, on the second-order recurrences whose adjoint has a double pole at 0.8);
- the NumPy path (:meth:`Backward.vjp`, the same float32 adjoint scan, float64 elementwise): the
  same tolerance.

``torch.autograd.gradcheck`` in float64: the kernels compute in float32, so float64 tensors run the
float64 reference of the same forward and of the same adjoint recurrence (documented in
:mod:`explorer.torch_op`); gradcheck runs there with its default tolerances (eps 1e-6, atol 1e-5,
rtol 1e-3), which checks the derivation exactly.  On the float32 kernels gradcheck runs with
``eps=1e-2, atol=rtol=1e-2`` (a central difference in float32 is good to about 1e-5).

Shapes are small (batch (2, 3), N = 3, L = 37; parameters broadcast over the first batch axis so
that their gradients are summed over it), and the compiles are cached: the file runs in about a
minute on two cores.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import explorer as ex

torch = pytest.importorskip("torch")
#: a mark, not an import-time skip: tests/gpu/test_autodiff_gpu.py imports the reference from
#: here on machines without MLIR
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                                reason="MLIR's Python bindings are not installed")

from explorer.autodiff import BackwardNames, grad, to_text  # noqa: E402
from explorer.frontend.names import RESERVED_NAMES, h0_name  # noqa: E402
from explorer.frontend.recurrence import (  # noqa: E402
    Binary,
    Call,
    Num,
    Recurrence,
    Ref,
    Unary,
    fold,
)
from tests.corpus import CASES, Case  # noqa: E402

KERNEL_TOL = 1e-4
BATCH, N, L = (2, 3), 3, 37
#: small tiles, so that 37 steps make several tiles and chunks (reduce, carry, rescan)
BLELLOCH = {"strategy": "blelloch", "block_size": 32, "elements_per_thread": 1,
            "chunk_tiles": 1}
SEQUENTIAL = {"strategy": "sequential", "block_size": 32}

#: recurrences beyond the presets and the corpus: readouts non-linear in the state, derivatives
#: the language cannot spell (abs, max, a power of a sum over n), coupled vector states, a state
#: read only by another, and names chosen to collide with those the backward would pick
EXTRA = [
    Case("nonlinear-readout", "h[t] = a[t] * h[t-1] + x[t]\n"
                              "y[t] = tanh(h[t]) * x[t] + h[t] * h[t] / 2", "scalar"),
    Case("abs-max-readout", "h[t] = a[t] * h[t-1] + b[t]\ny[t] = abs(h[t]) + max(h[t], x[t])",
         "scalar"),
    Case("square-of-a-sum", "h[t, n] = f[t, n] * h[t-1, n] + x[t]\n"
                            "y[t] = sum(C[t, n] * h[t, n]) ** 2", "diagonal"),
    Case("lane-sum-readout", "h[t, n] = f[t, n] * h[t-1, n] + k[n] * x[t]\n"
                             "y[t] = sum(C[t, n] * h[t, n]) + sum(C[t, n]) * x[t]", "diagonal"),
    Case("coupled-vector", "h[t, n] = f[t, n] * h[t-1, n] + 0.5 * q[t-1, n]\n"
                           "q[t, n] = 0.5 * q[t-1, n] - 0.1 * h[t-1, n] + x[t]\n"
                           "y[t] = sum(h[t, n] - q[t, n])", "dense"),
    Case("dense-params", "h[t] = a[t] * h[t-1] + 0.3 * w[t-1] + x[t]\n"
                         "w[t] = -0.2 * h[t-1] + gamma * w[t-1] + b[t]", "dense"),
    Case("second-order-inputs", "h[t] = a[t] * h[t-1] - 0.25 * h[t-2] + x[t]\n"
                                "y[t] = 2 * h[t] - x[t]", "dense"),
    Case("read-by-another", "g2[t] = 2 * x[t]\nh[t] = a[t] * h[t-1] + g2[t-1]", "dense"),
    Case("powers-logs", "h[t] = a[t] / (1 + a[t] ** 2) * h[t-1] + sqrt(k) * log(2 + x[t])\n"
                        "y[t] = min(h[t], 0.5) * x[t]", "scalar"),
    Case("mamba-bias", "h[t, n] = exp(-softplus(A[n]) * dt[t]) * h[t-1, n] "
                       "+ dt[t] * B[t, n] * x[t] + r[n]\n"
                       "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]", "diagonal"),
    Case("lane-readout", "h[t, n] = f[t, n] * h[t-1, n] + x[t] * B[t, n]\n"
                         "y[t] = sum(C[t, n] * h[t, n])\n"
                         "g[t, n] = C[t, n] * h[t, n] * x[t] + exp(f[t, n])", "diagonal"),
    Case("adversarial-names",
         "h[t] = lam_h[t] * h[t-1] + grad_h[t] * fwd_h + lam_h_2[t] + lam_h_next[t]\n"
         "y[t] = grad_y[t] * abs(h[t]) + lam_h0 * d_h[t] + N", "scalar"),
]


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(id, text, compile options): every preset, every corpus recurrence, the extras."""
    out, seen = [], set()
    for name, text in ex.PRESETS.items():
        out.append((f"preset:{name}", text, BLELLOCH))
        seen.add(text)
    for case in CASES + EXTRA:
        if case.text not in seen:
            out.append((case.name, case.text, SEQUENTIAL))
            seen.add(case.text)
    return out


CASE_LIST = _cases()


def _inputs(text: str, batch: tuple[int, ...] = BATCH, n: int = N, length: int = L,
            seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Arrays (from the corpus' maker of well-conditioned inputs) with every parameter
    broadcast over the first batch axis, and an initial state for every state."""
    arrays = Case("", text, "").inputs(batch, length, n, seed=seed)
    rec = Recurrence.parse(text)
    for p in rec.params:
        arrays[p] = np.ascontiguousarray(arrays[p][:1])
    rng = np.random.default_rng(seed + 1)
    h0 = {h0_name(s): rng.uniform(-1, 1, (*batch, n) if rec.vector else batch)
          .astype(np.float32) for s in rec.states}
    return arrays, h0


# ----------------------------------------------------------------------------------------------
# The reference: the recurrence as a float64 torch loop
# ----------------------------------------------------------------------------------------------
_TORCH_FUNCS = {"exp": "exp", "log": "log", "tanh": "tanh", "sqrt": "sqrt", "abs": "abs",
                "sigmoid": "sigmoid"}


def torch_reference(rec: Recurrence, arrays: dict[str, Any], h0: dict[str, Any] | None = None,
                    length: int | None = None) -> dict[str, Any]:
    """Run the statements step by step with torch (autograd records every step)."""
    h0 = h0 or {}
    vector = rec.vector

    def view(name: str) -> Any:   # batch + (N or 1, L or 1)
        x = arrays[name]
        if name not in rec.inputs:
            x = x.unsqueeze(-1)
        if name not in rec.lane_names:
            x = x.unsqueeze(-2)
        return x

    views = {n: view(n) for n in rec.inputs + rec.params}
    steps = length if length is not None else arrays[rec.inputs[0]].shape[-1]
    batches = [v.shape[:-2] for v in views.values()]
    batches += [(v.shape[:-1] if vector else v.shape) for v in h0.values()]
    batch = torch.broadcast_shapes(*batches)
    width = max([v.shape[-2] for v in views.values()]
                + [v.shape[-1] for v in h0.values() if vector] + [1])
    full = (*batch, width)
    zero = torch.zeros(full, dtype=torch.float64)
    history = {}
    for s in rec.states:
        start = zero
        if h0_name(s) in h0:
            v = h0[h0_name(s)]
            start = zero + (v if vector else v.unsqueeze(-1))
        history[s] = [zero] * (rec.order[s] - 1) + [start]

    def evaluate(expr: Any, t: int, current: dict[str, Any]) -> Any:
        def visit(e: Any, args: list[Any]) -> Any:
            if isinstance(e, Num):
                return torch.tensor(e.value, dtype=torch.float64)
            if isinstance(e, Ref):
                if e.name in history:
                    return current[e.name] if e.lag == 0 else history[e.name][-e.lag]
                v = views[e.name]
                return v[..., t] if e.lag is not None else v[..., 0]
            if isinstance(e, Unary):
                return -args[0] if e.op == "-" else args[0]
            if isinstance(e, Binary):
                a, b = args
                return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "**": a ** b}[e.op]
            assert isinstance(e, Call)
            if e.func == "sum":
                return torch.broadcast_to(args[0], full).sum(-1, keepdim=True)
            if e.func in ("max", "min"):
                return (torch.maximum if e.func == "max" else torch.minimum)(*args)
            if e.func == "softplus":
                return torch.nn.functional.softplus(args[0])
            return getattr(torch, _TORCH_FUNCS[e.func])(args[0])

        return fold(expr, visit)

    outs: dict[str, list[Any]] = {n: [] for n in rec.states + rec.readouts}
    for t in range(steps):
        current: dict[str, Any] = {}
        for s in rec.states:
            current[s] = torch.broadcast_to(evaluate(rec.statement(s).expr, t, current), full)
        for s in rec.states:
            history[s] = history[s][1:] + [current[s]]
            outs[s].append(current[s])
        for r in rec.readouts:
            y = torch.broadcast_to(evaluate(rec.statement(r).expr, t, current), full)
            outs[r].append(y if r in rec.lane_readouts else y[..., 0])
    result = {}
    for name, values in outs.items():
        arr = torch.stack(values, -1)
        result[name] = arr[..., 0, :] if name in rec.states and not vector else arr
    return result


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------
def _reference_grads(rec: Recurrence, arrays: dict[str, np.ndarray], h0: dict[str, np.ndarray],
                     seed: int = 7) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(cotangents, gradients) of sum_o <w_o, o> through the float64 torch loop."""
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    out = torch_reference(rec, {k: leaves[k] for k in arrays}, {k: leaves[k] for k in h0})
    gen = torch.Generator().manual_seed(seed)
    cot = {k: torch.randn(v.shape, dtype=torch.float64, generator=gen) for k, v in out.items()}
    loss = sum((out[k] * cot[k]).sum() for k in out)
    loss.backward()
    return cot, {k: v.grad.numpy() for k, v in leaves.items()}


def _rel(ours: Any, ref: np.ndarray) -> float:
    ours = ours.detach().double().numpy() if hasattr(ours, "detach") else np.asarray(ours)
    assert ours.shape == ref.shape
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-12))


def _as_dict(out: Any, rec: Recurrence) -> dict[str, Any]:
    return out if isinstance(out, dict) else {(rec.states + rec.readouts)[0]: out}


def _torch_grads(op: Any, rec: Recurrence, arrays: dict[str, np.ndarray],
                 h0: dict[str, np.ndarray], cot: dict[str, Any],
                 dtype: Any = None) -> dict[str, np.ndarray]:
    dtype = dtype or torch.float32
    leaves = {k: torch.tensor(v, dtype=dtype, requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    out = _as_dict(op(**leaves), rec)
    loss = sum((out[k] * cot[k].to(dtype)).sum() for k in out)
    loss.backward()
    return {k: v.grad for k, v in leaves.items()}


def _compile(text: str, options: dict[str, Any], **more: Any) -> Any:
    opts = dict(options)
    strategy = opts.pop("strategy")
    return ex.compile(text, target="cpu", strategy=strategy, **opts, **more)


# ----------------------------------------------------------------------------------------------
# Gradients against torch autograd
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case_id, text, options", CASE_LIST, ids=[c[0] for c in CASE_LIST])
def test_gradients_match_torch_autograd(case_id: str, text: str, options: dict[str, Any]):
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, ref = _reference_grads(rec, arrays, h0)
    c = _compile(text, options)
    # the torch op (float32 kernels)
    ours = _torch_grads(c.torch(), rec, arrays, h0, cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors
    # the NumPy path: the same adjoint scan, float64 elementwise
    opts = {k: v for k, v in options.items() if k != "strategy"}
    vjp = grad(rec).vjp({k: v.numpy() for k, v in cot.items()}, target="cpu",
                        strategy=options["strategy"], options=opts, **arrays, **h0)
    errors = {k: _rel(vjp[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors


@pytest.mark.parametrize("case_id, text, options", CASE_LIST, ids=[c[0] for c in CASE_LIST])
def test_gradcheck_float64(case_id: str, text: str, options: dict[str, Any]):
    """float64 tensors run the float64 reference of the forward and of the adjoint recurrence:
    gradcheck with its default tolerances checks the derivation itself."""
    arrays, h0 = _inputs(text, batch=(2,), n=2, length=5, seed=3)
    op = _compile(text, options).torch()
    names = list(arrays) + list(h0)
    leaves = tuple(torch.tensor(v, dtype=torch.float64, requires_grad=True)
                   for v in {**arrays, **h0}.values())

    def f(*xs: Any) -> Any:
        out = op(**dict(zip(names, xs)))
        return tuple(out.values()) if isinstance(out, dict) else out

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("text", [ex.PRESETS["affine scan"], ex.PRESETS["selective scan"]])
def test_gradcheck_on_the_float32_kernels(text: str):
    """The kernels compute in float32: central differences with eps 1e-2 are good to ~1e-5."""
    arrays, h0 = _inputs(text, batch=(2,), n=2, length=6, seed=5)
    op = _compile(text, BLELLOCH).torch()
    names = list(arrays) + list(h0)
    leaves = tuple(torch.tensor(v, dtype=torch.float32, requires_grad=True)
                   for v in {**arrays, **h0}.values())

    def f(*xs: Any) -> Any:
        out = op(**dict(zip(names, xs)))
        return tuple(out.values()) if isinstance(out, dict) else out

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(f, leaves, eps=1e-2, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("strategy", ["sequential", "blelloch", "kogge_stone"])
def test_every_strategy_runs_the_adjoint_backwards(strategy: str):
    text = ex.PRESETS["second order"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text, length=70)
    cot, ref = _reference_grads(rec, arrays, h0)
    options = {**BLELLOCH, "strategy": strategy}
    ours = _torch_grads(_compile(text, options).torch(), rec, arrays, h0, cot)
    assert max(_rel(ours[k], ref[k]) for k in ref) < KERNEL_TOL


def test_mamba_layout_sums_the_gradients_of_shared_arrays():
    """B and C shared by the D channels of a batch (``B[:, None]``): their gradients are
    summed over the channels."""
    text = ex.PRESETS["selective scan"]
    rec = Recurrence.parse(text)
    rng = np.random.default_rng(0)
    b, d, n, length = 2, 3, 4, 40
    arrays = {"dt": rng.uniform(0.01, 0.1, (b, d, length)), "A": -rng.uniform(0.1, 1, (d, n)),
              "B": rng.standard_normal((b, 1, n, length)), "x": rng.standard_normal((b, d, length)),
              "C": rng.standard_normal((b, 1, n, length)), "D": rng.standard_normal(d)}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    cot, ref = _reference_grads(rec, arrays, {})
    ours = _torch_grads(_compile(text, BLELLOCH).torch(), rec, arrays, {}, cot)
    for k in ref:
        assert tuple(ours[k].shape) == arrays[k].shape
        assert _rel(ours[k], ref[k]) < KERNEL_TOL, k


def test_a_reverse_scan_is_differentiated_too():
    """A forward compiled with reverse=True (h[t] = A_t h[t+1] + b_t): its adjoint runs forwards
    in time; the reference is the forward loop over the flipped sequences."""
    text = ex.PRESETS["gated EMA"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    flipped = {k: (np.ascontiguousarray(v[..., ::-1]) if k in rec.inputs else v)
               for k, v in arrays.items()}
    cot_f, ref_f = _reference_grads(rec, flipped, h0)
    cot = {k: v.flip(-1) for k, v in cot_f.items()}
    ref = {k: (np.ascontiguousarray(v[..., ::-1]) if k in rec.inputs else v)
           for k, v in ref_f.items()}
    ours = _torch_grads(_compile(text, SEQUENTIAL, reverse=True).torch(), rec, arrays, h0, cot)
    assert max(_rel(ours[k], ref[k]) for k in ref) < KERNEL_TOL


def test_initial_states_are_optional():
    text = "h[t] = a[t] * h[t-1] + 0.1 * w[t-1] + x[t]\nw[t] = 0.5 * w[t-1] - 0.2 * h[t-1]"
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    only_w = {"w0": h0["w0"]}
    cot, ref = _reference_grads(rec, arrays, only_w)
    op = _compile(text, SEQUENTIAL).torch()
    ours = _torch_grads(op, rec, arrays, only_w, cot)
    assert set(ours) == set(ref) and "h0" not in ours
    assert max(_rel(ours[k], ref[k]) for k in ref) < KERNEL_TOL
    # no initial state at all, positional tensors
    out = op(*(torch.tensor(arrays[k]) for k in rec.inputs + rec.params))
    assert set(out) == {"h", "w"}


def test_a_recurrence_without_inputs_takes_the_length():
    text = "h[t] = 0.9 * h[t-1] + c"
    rec = Recurrence.parse(text)
    c_ = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    h0 = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    ref = torch_reference(rec, {"c": c_}, {"h0": h0}, length=9)["h"]
    ref.sum().backward()
    op = _compile(text, SEQUENTIAL).torch()
    c32, h32 = (v.detach().float().requires_grad_() for v in (c_, h0))
    out = op(c=c32, h0=h32, L=9)
    assert out.shape == (2, 9)
    out.sum().backward()
    assert _rel(c32.grad, c_.grad.numpy()) < KERNEL_TOL
    assert _rel(h32.grad, h0.grad.numpy()) < KERNEL_TOL
    with pytest.raises(TypeError, match="L="):
        op(c=c32)


def test_only_the_outputs_used_get_cotangents():
    text = ex.PRESETS["selective scan"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in arrays.items()}
    torch_reference(rec, leaves)["y"].square().sum().backward()
    op = _compile(text, BLELLOCH).torch()
    ours = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
    op(**ours)["y"].square().sum().backward()
    assert max(_rel(ours[k].grad, leaves[k].grad.numpy()) for k in ours) < KERNEL_TOL


def test_torch_compile_traces_forward_and_backward():
    text = ex.PRESETS["selective scan"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    op = _compile(text, BLELLOCH).torch()
    names = list(arrays) + list(h0)

    def loss(*xs: Any) -> Any:
        out = op(**dict(zip(names, xs)))
        return (out["y"] * out["y"]).sum() + out["h"].sum()

    def grads(fn: Any) -> list[Any]:
        xs = [torch.tensor(v, requires_grad=True) for v in {**arrays, **h0}.values()]
        fn(*xs).backward()
        return [x.grad for x in xs]

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    for eager, traced in zip(grads(loss), grads(compiled)):
        assert torch.allclose(eager, traced, rtol=1e-5, atol=1e-6)
    assert rec.readouts == ("y",)


def test_opcheck_passes_on_both_operators():
    text = ex.PRESETS["selective scan"]
    arrays, h0 = _inputs(text, batch=(2,), n=2, length=8)
    op = _compile(text, BLELLOCH).torch(lane_gradients=True)
    args = [torch.tensor(v) for v in {**arrays, **h0}.values()]
    result = torch.library.opcheck(op.forward_op, args)
    assert set(result.values()) == {"SUCCESS"}, result
    bw = op.backward.recurrence
    rng = np.random.default_rng(0)
    adjoint_args: list[Any] = []
    for name in bw.inputs + bw.params:
        shape = (2, 2, 8) if name in bw.inputs else (2,)
        if name in bw.lane_names:
            shape = (2, 2, 8) if name in bw.inputs else (2, 2)
        elif name in bw.inputs:
            shape = (2, 8)
        adjoint_args.append(torch.tensor(rng.uniform(-1, 1, shape), dtype=torch.float32))
    adjoint_args += [None] * len(bw.states)
    result = torch.library.opcheck(op.adjoint_op, [*adjoint_args, None, None])
    assert set(result.values()) == {"SUCCESS"}, result
    # its lane readouts (the gradients of B and C) summed to a batch shape of one row
    assert op.adjoint_specs.sums == ["grad_lane_B", "grad_lane_C"]
    result = torch.library.opcheck(op.adjoint_op, [*adjoint_args, [1], None])
    assert set(result.values()) == {"SUCCESS"}, result
    whole = op.adjoint_op(*adjoint_args, None, None)
    summed = op.adjoint_op(*adjoint_args, [1], None)
    k = op.adjoint_specs.outputs.index("grad_lane_B")
    assert summed[k].shape == (1, 2, 8) and whole[k].shape == (2, 2, 8)
    torch.testing.assert_close(summed[k], whole[k].sum(0, keepdim=True))


def test_one_operator_per_compile():
    a = _compile(ex.PRESETS["affine scan"], SEQUENTIAL)
    b = _compile(ex.PRESETS["affine scan"], BLELLOCH)
    assert a.torch() is a.torch()
    assert a.torch().forward_op is not b.torch().forward_op
    assert str(a.key) in repr(a.torch())


def test_the_op_refuses_what_it_cannot_take():
    op = _compile(ex.PRESETS["affine scan"], SEQUENTIAL).torch()
    a = torch.ones(2, 5)
    with pytest.raises(TypeError, match="float32"):
        op(a=a.to(torch.int32), b=a)
    with pytest.raises(TypeError, match="unexpected"):
        op(a=a, b=a, c=a)
    with pytest.raises(TypeError, match="missing"):
        op(a=a)


# ----------------------------------------------------------------------------------------------
# The backward recurrence as its own compile
# ----------------------------------------------------------------------------------------------
def test_the_adjoint_of_the_selective_scan_reads_like_its_math():
    bw = ex.grad(ex.PRESETS["selective scan"])
    assert bw.text == ("lam_h[t, n] = exp(A[n] * dt_next[t]) * lam_h[t-1, n] "
                       "+ C[t, n] * grad_y[t] + grad_h[t, n]\n"
                       "grad_sum_dt[t] = sum(lam_h[t, n] * (A[n] * (-B[t, n] * dt[t] * x[t] "
                       "+ fwd_h[t, n]) + B[t, n] * x[t]))\n"
                       "grad_sum_x[t] = sum(lam_h[t, n] * B[t, n] * dt[t])")
    assert bw.names.next == {"dt": "dt_next"}
    # with lane gradients, those of the inputs with the axis n are lane readouts
    lines = ex.grad(ex.PRESETS["selective scan"], lane_gradients=True).text.splitlines()
    assert lines == [*bw.text.splitlines()[:2], "grad_lane_B[t, n] = lam_h[t, n] * dt[t] * x[t]",
                     bw.text.splitlines()[2], "grad_lane_C[t, n] = grad_y[t] * fwd_h[t, n]"]
    # the gradients of the inputs without the axis n are the adjoint's lane-summed readouts
    assert bw.names.summed == {"dt": "grad_sum_dt", "x": "grad_sum_x"}
    # exp(A dt) h[t-1] = h[t] - dt B x: the saved states are read at their own step
    assert bw.names.previous == {} and bw.names.trajectory == {"h": "fwd_h"}
    assert "dL/dx = grad_sum_x  (the adjoint's readout) + grad_y * (D)" in bw.summary()
    # dL/dA has no term beside it to bound h[t] - dt B x's rounding: it keeps h[t-1]
    assert "dL/dA = lam_h * (dt*h[t-1]*exp(A*dt))  summed over t" in bw.summary()
    assert "read at their own step: fwd_h[t] = h[t]" in bw.summary()


def test_the_adjoint_compiles_through_every_stage_backwards():
    bw = ex.grad(ex.PRESETS["second order"])
    assert bw.text == ("lam_h[t] = 1.6 * lam_h[t-1] + lam_h_1[t-1] + grad_h[t]\n"
                       "lam_h_1[t] = -0.64 * lam_h[t-1]")
    c = bw.compile(target="cuda", strategy="blelloch")
    assert c.options["reverse"] is True
    assert '"reverse"' in c.stages["scan-plan"].text
    assert {"recurrence", "affine", "plan", "mlir", "llvm", "ptx"} <= set(c.stages)
    with pytest.raises(ex.OptionError, match="reverse"):
        bw.compile(target="cpu", reverse=False)


def test_direct_terms_the_language_cannot_spell_are_arrays():
    bw = ex.grad("h[t] = a[t] * h[t-1] + b[t]\ny[t] = abs(h[t])")
    assert bw.names.direct == {("h", 0): "d_h"}
    assert bw.text.splitlines()[0] == "lam_h[t] = a_next[t] * lam_h[t-1] + d_h[t]"


def test_backward_names_collide_with_nothing():
    """Names the backward would pick first, taken by the recurrence: each moves aside, and no
    name (or initial-state keyword) of the backward is one of the forward's or reserved."""
    text = next(c.text for c in EXTRA if c.name == "adversarial-names")
    rec = Recurrence.parse(text)
    bw = ex.grad(rec)
    names: BackwardNames = bw.names
    ours = {*names.adjoint.values(), *names.next.values(), *names.cotangent.values(),
            *names.trajectory.values(), *names.direct.values()}
    user = set(rec.inputs + rec.params + rec.states + rec.readouts)
    user |= {h0_name(s) for s in rec.states}
    assert not ours & user
    assert not ours & set(RESERVED_NAMES)
    assert not {h0_name(s) for s in bw.recurrence.states} & (ours | user)
    assert names.adjoint[("h", 0)] == "lam_h_3"
    assert names.next["lam_h"] == "lam_h_next_2"
    assert names.direct[("h", 0)] == "d_h_2"
    assert len(ours) == len(names.adjoint) + len(names.next) + len(names.cotangent) + \
        len(names.trajectory) + len(names.direct)


@pytest.mark.parametrize("name", ["lam", "grad", "x_next", "d", "fwd", "lam_h0", "h_next",
                                  "grad_grad_h", "C", "N", "lam_lam_h"])
def test_any_user_name_gives_a_backward_that_parses(name: str):
    text = f"h[t] = {name}[t] * h[t-1] + x[t]\ny[t] = abs(h[t]) * {name}[t]"
    bw = ex.grad(text)
    assert bw.recurrence.states == tuple(bw.names.adjoint.values())


def test_the_printer_spells_what_the_parser_reads():
    import sympy

    x, y = sympy.symbols("x y", real=True)
    cases = [-x * y, x / (y + 1), 1 / (1 + sympy.exp(-x)), x ** 2 - 3 * y, sympy.sqrt(x) / 2,
             sympy.Max(x, y, 1), -(x + y) * y, x ** -2, sympy.Rational(1, 3) * x]
    for e in cases:
        text = to_text(e, lambda n: f"{n}[t]")
        rec = Recurrence.parse(f"h[t] = ({text}) * h[t-1]")
        from explorer.passes.affine import decompose

        got = decompose(rec).A[0, 0]
        assert sympy.simplify(got - e) == 0, (e, text, got)


def test_a_given_adjoint_compile_is_used_and_checked():
    """``torch_op(compiled, adjoint=...)``: the adjoint compiled elsewhere (a record read without
    MLIR on a GPU machine); one of another recurrence is refused."""
    from explorer.torch_op import torch_op

    text = ex.PRESETS["gated EMA"]
    c = _compile(text, SEQUENTIAL)
    adjoint = ex.grad(text).compile(target="cpu", strategy="sequential", block_size=32)
    op = torch_op(c, adjoint=adjoint)
    assert op._compiles[("adjoint", "cpu")] is adjoint
    with pytest.raises(ValueError, match="adjoint"):
        torch_op(c, adjoint=c)


def test_an_adjoint_record_without_the_summed_gradients_is_refused():
    """A record of the adjoint that stores only its states (made with outputs='states') lacks
    the gradients summed in its kernel: refused when given, not a KeyError mid-backward."""
    from explorer.torch_op import torch_op

    text = ex.PRESETS["selective scan"]
    c = _compile(text, SEQUENTIAL)
    bw = grad(text)
    states_only = bw.compile(target="cpu", strategy="sequential", outputs="states")
    with pytest.raises(ValueError, match="outputs='all'"):
        torch_op(c, adjoint=states_only)


def test_the_blelloch_adjoint_of_a_vector_recurrence_takes_direct_tiles_on_the_gpu():
    """Its lane loop stores every lane's adjoint from registers (adjoint_options.DIRECT_ADJOINT);
    other strategies, scalar recurrences, the CPU and an explicit tile_layout keep theirs."""
    vector = ex.grad(ex.PRESETS["selective scan"])
    scalar = ex.grad(ex.PRESETS["affine scan"])
    assert vector.compile(target="cuda").scan_plan.layout == "direct"
    assert vector.compile(target="cuda", strategy="warp_shuffle").scan_plan.layout == "staged"
    assert vector.compile(target="cuda", tile_layout="staged").scan_plan.layout == "staged"
    assert vector.compile(target="cpu").scan_plan.layout == "staged"
    assert scalar.compile(target="cuda").scan_plan.layout == "staged"


def test_that_direct_adjoint_takes_its_own_tile_unless_one_is_given():
    """adjoint_options.ADJOINT_TILE: fewer elements a thread for the lane loop that holds every
    stream in registers; a tile given to compile(), or chosen for the forward of a torch
    operator, is kept; the other plans keep the compile defaults."""
    from explorer.adjoint_options import ADJOINT_TILE

    vector = ex.grad(ex.PRESETS["selective scan"])
    tile = ("block_size", "elements_per_thread")
    got = vector.compile(target="cuda").options
    assert {k: got[k] for k in tile} == ADJOINT_TILE
    assert vector.compile(target="cuda", elements_per_thread=8).options[tile[1]] == 8
    assert vector.compile(target="cuda", block_size=32).options[tile[0]] == 32
    for other in (vector.compile(target="cpu"), vector.compile(target="cuda", tile_layout="staged"),
                  ex.grad(ex.PRESETS["affine scan"]).compile(target="cuda")):
        assert (other.scan_plan.threads, other.scan_plan.elements) == (128, 8)
    # the operator passes the forward's tile to its adjoint only where it is not the default
    op = ex.compile(ex.PRESETS["selective scan"], target="cpu").torch()
    assert not set(tile) & set(op._options())
    op = ex.compile(ex.PRESETS["selective scan"], target="cpu", block_size=64,
                    elements_per_thread=2).torch()
    assert {k: op._options()[k] for k in tile} == {"block_size": 64, "elements_per_thread": 2}
