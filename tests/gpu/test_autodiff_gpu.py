"""GPU tests of the derived backward (``Compiled.torch()``) on CUDA tensors.

Needs CuPy, a CUDA device and torch with CUDA (the module is skipped otherwise).  The ops are
compiled here where MLIR is installed; elsewhere (the GPU machine may have only numpy, sympy,
cupy and torch) they are read from the compiled records that

    python tests/gpu/test_autodiff_gpu.py --build tests/gpu/artifacts/autodiff

wrote where MLIR is (forward and adjoint of every recurrence below, ``target="cuda"``), and the
module is skipped when neither is there.

The reference is the one of ``tests/unit/test_autodiff.py``: torch autograd through a float64
torch loop of the recurrence, on the CPU.  Tolerances, on ``max|g - g_ref| / max|g_ref|`` per
gradient: ``1e-4`` at L = 37 (as on the CPU), ``2e-4`` for the long sequences (L = 20000, the
chunked scan with its carries; decays in (0.9, 1) keep the float32 error near the last few
thousand steps).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
RECORDS = Path(os.environ.get("SCANWEAVER_AUTODIFF_RECORDS", HERE / "artifacts" / "autodiff"))
HAS_MLIR = importlib.util.find_spec("mlir") is not None

#: (name, recurrence, compile options) run on the GPU; the records are built for these
BLELLOCH = {"strategy": "blelloch", "block_size": 32, "elements_per_thread": 2, "chunk_tiles": 1}
DEFAULT = {"strategy": "blelloch"}
SEQUENTIAL = {"strategy": "sequential"}
LANE = {"strategy": "blelloch", "lane_gradients": True}


#: a forward with a lane readout (a value per lane, beside the sum over n)
LANE_READOUT = ("h[t, n] = f[t, n] * h[t-1, n] + x[t] * B[t, n]\n"
                "y[t] = sum(C[t, n] * h[t, n])\n"
                "g[t, n] = C[t, n] * h[t, n] * x[t] + exp(f[t, n])")


#: diagonal recurrences whose backward the fused kernel runs (besides the presets)
KERNEL_ONLY = {
    "kernel-sigmoid-gate": "h[t, n] = sigmoid(f[t, n]) * h[t-1, n] + x[t] * B[t, n]\n"
                           "y[t] = sum(C[t, n] * h[t, n]) * x[t]",
    "kernel-two-readouts": "h[t, n] = exp(-softplus(u[t]) * A[n] * A[n]) * h[t-1, n]"
                           " + B[t, n] * x[t]\n"
                           "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]\n"
                           "z[t] = sum(h[t, n]) * u[t]",
}


#: a diagonal recurrence without timed inputs (called with ``L``): the fused kernel takes it
NO_INPUTS = "h[t, n] = A[n] * h[t-1, n] + B[n]"


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    import explorer as ex

    out = [(f"preset:{name}", text, BLELLOCH) for name, text in ex.PRESETS.items()]
    out += [
        ("abs-max-readout", "h[t] = a[t] * h[t-1] + b[t]\ny[t] = abs(h[t]) + max(h[t], x[t])",
         SEQUENTIAL),
        ("coupled-vector", "h[t, n] = f[t, n] * h[t-1, n] + 0.5 * q[t-1, n]\n"
                           "q[t, n] = 0.5 * q[t-1, n] - 0.1 * h[t-1, n] + x[t]\n"
                           "y[t] = sum(h[t, n] - q[t, n])", SEQUENTIAL),
        ("affine-default", ex.PRESETS["affine scan"], DEFAULT),
        ("selective-default", ex.PRESETS["selective scan"], DEFAULT),
        ("mamba-default", ex.PRESETS["Mamba selective scan"], DEFAULT),
        ("lane-readout", LANE_READOUT, DEFAULT),
        # the gradients of B and C as lane readouts of the adjoint (explorer.autodiff.grad)
        ("selective-lane", ex.PRESETS["selective scan"], LANE),
        ("mamba-lane", ex.PRESETS["Mamba selective scan"], LANE),
        ("lane-readout-lane", LANE_READOUT, LANE),
    ]
    out += [(name, text, DEFAULT) for name, text in KERNEL_ONLY.items()]
    return out


def _key(text: str, options: dict[str, Any]) -> str:
    return json.dumps({"text": text, "options": options}, sort_keys=True)


def kernel_applies(text: str) -> bool:
    """Whether the fused backward kernel takes ``text``."""
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose
    from explorer.passes.fused_adjoint import supported

    return supported(decompose(Recurrence.parse(text))) is None


def build(folder: Path) -> None:
    """Compile forward and adjoint of every case for CUDA and write their records."""
    import explorer as ex
    from explorer.frontend.recurrence import Recurrence as Parsed

    folder.mkdir(parents=True, exist_ok=True)
    index = {}
    for i, (name, text, options) in enumerate([*_cases(), ("no-inputs", NO_INPUTS, DEFAULT)]):
        opts = dict(options)
        strategy = opts.pop("strategy")
        lane = opts.pop("lane_gradients", False)
        # the op returns every output and its backward reads the states: all stored
        fwd = ex.compile(text, target="cuda", strategy=strategy, outputs="all", **opts)
        bwd = ex.grad(text, lane).compile(target="cuda", strategy=strategy, **opts)
        fwd.dump(folder / f"{i}-forward.json.gz")
        bwd.dump(folder / f"{i}-adjoint.json.gz")
        index[_key(text, options)] = [f"{i}-forward.json.gz", f"{i}-adjoint.json.gz"]
        if kernel_applies(text) and not lane:
            # the fused backward kernels, which the op runs for these by default (a loss of
            # the readouts alone: the "readouts" one)
            kinds = (True, "readouts") if Parsed.parse(text).readouts else (True,)
            for j, which in enumerate(kinds):
                ex.compile(text, target="cuda", strategy=strategy, backward=which).dump(
                    folder / f"{i}-backward{j}.json.gz")
                index[_key(text, options)].append(f"{i}-backward{j}.json.gz")
        print(f"built {name}")
    (folder / "index.json").write_text(json.dumps(index, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    parser = argparse.ArgumentParser(description="build the compiled records of these tests")
    parser.add_argument("--build", type=Path, default=RECORDS)
    build(parser.parse_args().build)
    sys.exit(0)

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
torch = pytest.importorskip("torch")

from explorer.runtime.cuda import gpu_available  # noqa: E402

if not gpu_available() or not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to CuPy and torch", allow_module_level=True)
if not HAS_MLIR and not (RECORDS / "index.json").exists():
    pytest.skip("neither MLIR nor compiled records: run `python tests/gpu/test_autodiff_gpu.py "
                "--build tests/gpu/artifacts/autodiff` where MLIR is installed",
                allow_module_level=True)

import explorer as ex  # noqa: E402
from explorer.frontend.recurrence import Recurrence  # noqa: E402
from explorer.torch_op import torch_op  # noqa: E402
from tests.unit.test_autodiff import (  # noqa: E402
    KERNEL_TOL,
    _inputs,
    _reference_grads,
    _rel,
    torch_reference,
)

CASES = _cases()
LONG_TOL = 2e-4


def _op(text: str, options: dict[str, Any]) -> Any:
    """The torch op of a CUDA compile: compiled here, or read from the records."""
    lane = bool(options.get("lane_gradients", False))
    if HAS_MLIR:
        opts = dict(options)
        strategy = opts.pop("strategy")
        opts.pop("lane_gradients", None)
        return ex.compile(text, target="cuda", strategy=strategy, **opts).torch(
            lane_gradients=lane)
    from explorer.compiler import load_compiled

    index = json.loads((RECORDS / "index.json").read_text())
    try:
        fwd, bwd, *kernel = index[_key(text, options)]
    except KeyError:
        pytest.skip("no record of this compile: rebuild the records")
    forward = load_compiled(RECORDS / fwd)
    op = torch_op(forward, adjoint=load_compiled(RECORDS / bwd), lane_gradients=lane)
    for k in kernel:   # the fused backward kernel
        torch_op(forward, adjoint=load_compiled(RECORDS / k), lane_gradients=lane)
    return op


def _cuda_grads(op: Any, rec: Recurrence, arrays: dict[str, np.ndarray],
                h0: dict[str, np.ndarray], cot: dict[str, Any]) -> dict[str, Any]:
    leaves = {k: torch.tensor(v, device="cuda", requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    out = op(**leaves)
    out = out if isinstance(out, dict) else {(rec.states + rec.readouts)[0]: out}
    for v in out.values():
        assert v.is_cuda
    # the outputs the cotangents name (a loss of some outputs: the others get no gradient)
    loss = sum((out[k] * cot[k].to("cuda", torch.float32)).sum() for k in out if k in cot)
    loss.backward()
    return {k: v.grad.cpu() for k, v in leaves.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("case_id, text, options", CASES, ids=[c[0] for c in CASES])
def test_gradients_on_the_gpu_match_torch_autograd(case_id: str, text: str,
                                                   options: dict[str, Any]):
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, ref = _reference_grads(rec, arrays, h0)
    ours = _cuda_grads(_op(text, options), rec, arrays, h0, cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors


FUSED_CASES = ["affine-default", "selective-default", "coupled-vector"]


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", FUSED_CASES)
def test_fused_backward_matches_torch_autograd(case_id: str):
    """The eager backward with its gradient formulas traced and compiled by inductor: with
    fuse_backward "auto" from the second call of a signature for a vector recurrence, with
    "always" from the first for any."""
    text, options = next((t, o) for n, t, o in CASES if n == case_id)
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, ref = _reference_grads(rec, arrays, h0)
    op = _op(text, options)
    policy = op.fuse_backward
    op.fused._fused.clear()
    op.fused._seen.clear()
    op.fused._replays.plans.clear()
    try:
        # a recurrence the fused backward kernel takes runs it with "auto"
        op.fuse_backward = "auto" if rec.vector and not kernel_applies(text) else "always"
        first = _cuda_grads(op, rec, arrays, h0, cot)
        assert op.fused.signatures == (0 if op.fuse_backward == "auto" else 1)
        second = _cuda_grads(op, rec, arrays, h0, cot)
        assert op.fused.signatures == 1
        third = _cuda_grads(op, rec, arrays, h0, cot)
    finally:
        op.fuse_backward = policy
    for ours in (first, second, third):
        errors = {k: _rel(ours[k], ref[k]) for k in ref}
        assert max(errors.values()) < KERNEL_TOL, errors
    assert all(torch.equal(second[k], third[k]) for k in ref)


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", ["affine-default", "preset:gated EMA", "preset:second order"])
def test_traced_backward_binds_its_launch_plan(case_id: str, monkeypatch: Any):
    """The traced backward checks the adjoint's outputs on its first call and then launches
    the plan of that call directly (``Runner.bind``): the same gradients, bit for bit, as the
    eager formulas, the runner's checking call made once per signature; on another stream
    the runner's call again (the plan is bound to its stream), with the same gradients."""
    from explorer.torch_runner import Runner

    text, options = next((t, o) for n, t, o in CASES if n == case_id)
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, _ = _reference_grads(rec, arrays, h0)
    op = _op(text, options)
    policy = op.fuse_backward
    calls: list[int] = []
    runner_call = Runner.__call__

    def counted(self: Any, *args: Any) -> Any:
        if self is op.adjoint_runner:   # the forward's runner runs every call
            calls.append(1)
        return runner_call(self, *args)

    try:
        op.fuse_backward = "never"
        eager = _cuda_grads(op, rec, arrays, h0, cot)
        op.fuse_backward = "traced"
        op.fused._fused.clear()
        op.fused._replays.plans.clear()
        monkeypatch.setattr(Runner, "__call__", counted)
        traced = [_cuda_grads(op, rec, arrays, h0, cot) for _ in range(4)]
        assert op.fused.signatures == 1
        assert len(calls) == 1, calls
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            other = _cuda_grads(op, rec, arrays, h0, cot)
        assert len(calls) == 2, calls
    finally:
        op.fuse_backward = policy
    for ours in (*traced, other):
        assert all(torch.equal(ours[k], eager[k]) for k in eager)


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", ["selective-default", "mamba-default", "selective-lane",
                                     "mamba-lane"])
def test_inputs_shared_by_channels_sum_their_gradients_in_the_adjoint(case_id: str):
    """B and C given once per batch row (Mamba's layout, ``(batch, 1, N, L)`` against
    ``(batch, D, L)``): right gradients, shaped like B and C; with lane gradients they are the
    adjoint's lane readouts, which its kernel adds into one row per batch row (the launch
    plan allocates those rows alone)."""
    text, options = next((t, o) for n, t, o in CASES if n == case_id)
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text, batch=(2, 3), n=4, length=300)
    for name in ("B", "C"):
        arrays[name] = np.ascontiguousarray(arrays[name][:, :1])
    cot, ref = _reference_grads(rec, arrays, h0)
    op = _op(text, options)
    ours = _cuda_grads(op, rec, arrays, h0, cot)
    assert ours["B"].shape == (2, 1, 4, 300) and ours["C"].shape == (2, 1, 4, 300)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors
    if not options.get("lane_gradients"):
        return
    kernel = op.adjoint_runner.compiled_for("cuda").runner("cuda")
    # allocated as returned: one row per batch row, not per channel
    rows = {p.outputs[o] for p in kernel._plans.plans.values()
            for o in ("grad_lane_B", "grad_lane_C")}
    assert rows == {(2, 1, 4, 300)}, rows


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["affine scan", "selective scan"])
def test_long_chunked_sequences(preset: str):
    text = ex.PRESETS[preset]
    rec = Recurrence.parse(text)
    length = 20000 if preset == "affine scan" else 3000
    arrays, h0 = _inputs(text, batch=(2,), n=4, length=length)
    if preset == "affine scan":
        arrays["a"] = (0.9 + 0.0999 * np.random.default_rng(0).random(arrays["a"].shape)
                       ).astype(np.float32)
    cot, ref = _reference_grads(rec, arrays, h0)
    name = "affine-default" if preset == "affine scan" else "selective-default"
    options = next(o for n, _, o in CASES if n == name)
    ours = _cuda_grads(_op(text, options), rec, arrays, h0, cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < LONG_TOL, errors


@pytest.mark.gpu
def test_runs_on_torchs_current_stream():
    """Inputs written on a side stream and used at once, without a synchronisation: the op must
    run on that stream (torch's current one) to see them."""
    text = ex.PRESETS["selective scan"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, ref = _reference_grads(rec, arrays, h0)
    op = _op(text, BLELLOCH)
    side = torch.cuda.Stream()
    host = {k: torch.tensor(v).pin_memory() for k, v in {**arrays, **h0}.items()}
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)   # keep the side stream busy while the copies queue
        leaves = {k: v.to("cuda", non_blocking=True).requires_grad_() for k, v in host.items()}
        out = op(**leaves)
        loss = sum((out[k] * cot[k].to("cuda", torch.float32)).sum() for k in out)
        loss.backward()
    side.synchronize()
    errors = {k: _rel(leaves[k].grad.cpu(), ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors


@pytest.mark.gpu
def test_the_eager_forward_launches_its_bound_plan():
    """The eager forward launches the plan bound to its signature (``forward_call``): the
    outputs bit for bit the runner's, without autograd (no tensor asks for a gradient) and
    through the autograd function, on torch's stream and on a side stream (a signature of its
    own); float64 tensors take the runner (the float64 reference), kept as such."""
    text = ex.PRESETS["selective scan"]
    arrays, h0 = _inputs(text)
    op = _op(text, BLELLOCH)
    op.forward_bound = type(op.forward_bound)(op.forward_bound.limit)   # this test's alone
    given = {k: torch.tensor(v, device="cuda") for k, v in {**arrays, **h0}.items()}
    values = [given.get(n) for n in op.specs.names]
    want = op.forward_runner(*values)
    for _ in range(2):
        got = op(**given)
        assert all(torch.equal(got[o], w) for o, w in zip(op.specs.outputs, want))
    assert [callable(v) for v in op.forward_bound.plans.values()] == [True]
    leaves = {k: v.clone().requires_grad_() for k, v in given.items()}
    got = op(**leaves)
    assert type(got["y"].grad_fn).__name__ == "_EagerBackward"
    assert all(torch.equal(got[o].detach(), w) for o, w in zip(op.specs.outputs, want))
    assert len(op.forward_bound.plans) == 1   # the same signature, the same launch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = op(**given)
    side.synchronize()
    assert all(torch.equal(got[o], w) for o, w in zip(op.specs.outputs, want))
    assert len(op.forward_bound.plans) == 2
    wide = op(**{k: v.double() for k, v in given.items()})
    assert all(_rel(wide[o].cpu(), w.cpu().double().numpy()) < KERNEL_TOL
               for o, w in zip(op.specs.outputs, want))
    assert list(op.forward_bound.plans.values())[-1] is False


@pytest.mark.gpu
def test_torch_compile_on_the_gpu():
    text = ex.PRESETS["selective scan"]
    arrays, h0 = _inputs(text)
    op = _op(text, BLELLOCH)
    names = list(arrays) + list(h0)

    def loss(*xs: Any) -> Any:
        out = op(**dict(zip(names, xs)))
        return (out["y"] * out["y"]).sum() + out["h"].sum()

    def grads(fn: Any) -> list[Any]:
        xs = [torch.tensor(v, device="cuda", requires_grad=True)
              for v in {**arrays, **h0}.values()]
        fn(*xs).backward()
        return [x.grad for x in xs]

    compiled = torch.compile(loss, fullgraph=True)
    for eager, traced in zip(grads(loss), grads(compiled)):
        assert torch.allclose(eager, traced, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_float64_cuda_tensors_run_the_reference():
    text = ex.PRESETS["affine scan"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text, batch=(2,), length=6)
    op = _op(text, BLELLOCH)
    leaves = {k: torch.tensor(v, dtype=torch.float64, device="cuda", requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    out = op(**leaves)
    assert out.dtype == torch.float64 and out.is_cuda
    ref = torch_reference(rec, {k: leaves[k].cpu() for k in arrays},
                          {k: leaves[k].cpu() for k in h0})["h"]
    assert torch.allclose(out.cpu(), ref)


@pytest.mark.gpu
def test_launch_plans_match_the_checking_path():
    """``launch_torch`` (a launch plan cached per shapes and strides) gives what ``prepare``
    gives, for tensors in the kernels' layout, broadcast parameters, inputs with one row per
    block of channels (B and C), a non-contiguous input and new data under a cached plan."""
    text = ex.PRESETS["selective scan"]
    op = _op(text, BLELLOCH)
    kernel = op._forward_for("cuda").runner("cuda")
    for seed in (0, 1):
        arrays, h0 = _inputs(text, batch=(2, 3), n=4, length=50, seed=seed)
        given = {k: torch.tensor(v, device="cuda") for k, v in arrays.items()}
        # x as the transpose of a (L, ...) tensor: not contiguous, laid out by the plan
        given["x"] = torch.tensor(np.ascontiguousarray(np.moveaxis(arrays["x"], -1, 0)),
                                  device="cuda").movedim(0, -1)
        assert not given["x"].is_contiguous()
        # B with a row per block of channels (as Mamba's), C the same but a strided view
        given["B"] = given["B"][:, :1].contiguous()
        given["C"] = given["C"][:, :1]
        for with_h0 in (False, True):
            call = dict(given)
            if with_h0:
                call.update({k: torch.tensor(v, device="cuda") for k, v in h0.items()})
            want = kernel(**{k: v.cpu().numpy() for k, v in call.items()})
            want = want if isinstance(want, dict) else {kernel.output_names[0]: want}
            for _ in range(2):   # the second call runs the cached plan
                got = kernel.launch_torch(**call)
                torch.cuda.synchronize()
                for k, v in want.items():
                    assert got[k].shape == tuple(v.shape), k
                    np.testing.assert_allclose(got[k].cpu().numpy(), v, rtol=1e-5,
                                               atol=1e-6, err_msg=k)
    assert len(kernel._plans.plans) >= 2   # with and without h0: two signatures


@pytest.mark.gpu
def test_launch_plans_refuse_what_prepare_refuses():
    text = ex.PRESETS["affine scan"]
    kernel = _op(text, BLELLOCH)._forward_for("cuda").runner("cuda")
    a = torch.rand(4, 16, device="cuda")
    with pytest.raises(ex.RecurrenceError):
        kernel.launch_torch(a=a, b=torch.rand(4, 17, device="cuda"))   # lengths differ
    with pytest.raises(ex.RecurrenceError):
        kernel.launch_torch(a=a, b=a, c=a)                                # unknown name
    with pytest.raises(ex.RecurrenceError):
        kernel.launch_torch(a=a, b=a.double())                            # float64, no cast


def _adjoint_calls(op: Any, monkeypatch: Any) -> list[int]:
    """A list that grows by one each time ``op``'s adjoint runner is called (for the rest of
    the test)."""
    from explorer.torch_runner import Runner

    calls: list[int] = []
    runner_call = Runner.__call__

    def counted(self: Any, *args: Any) -> Any:
        if self is op.adjoint_runner:
            calls.append(1)
        return runner_call(self, *args)
    monkeypatch.setattr(Runner, "__call__", counted)
    return calls


KERNEL_CASES = [c for c in CASES if c[2] == DEFAULT and kernel_applies(c[1])]


@pytest.mark.gpu
@pytest.mark.parametrize("loss", ["every output", "readouts"])
@pytest.mark.parametrize("length", [37, 300, 4500])
@pytest.mark.parametrize("case_id, text, options", KERNEL_CASES,
                         ids=[c[0] for c in KERNEL_CASES])
def test_backward_kernel_matches_torch_autograd(case_id: str, text: str, options: dict[str, Any],
                                                length: int, loss: str, monkeypatch: Any):
    """The fused backward kernel (the default backward of these on CUDA; ``fuse_backward=
    "kernel"`` here): every gradient, the
    initial states' included, against torch autograd through the float64 loop; one tile, one
    ragged tile, three tiles (the states recomputed from the saved ones), B and C shared by
    the channels of a batch row where the recurrence has them; the adjoint scan never runs.
    A loss of every output runs the ``backward=True`` kernel, one of the readouts alone the
    ``"readouts"`` one. Twice, the second time with other cotangents through the call bound
    by the first (its launch plan and sums kept, the tensors new)."""
    from tests.unit.test_fused_adjoint import _readouts_grads

    rec = Recurrence.parse(text)
    if loss == "readouts" and not rec.readouts:
        pytest.skip("no readouts")
    arrays, h0 = _inputs(text, batch=(2, 3), n=4, length=length)
    for name in ("B", "C"):
        if name in arrays:
            arrays[name] = np.ascontiguousarray(arrays[name][:, :1])
    cot, ref = (_reference_grads if loss == "every output" else _readouts_grads)(
        rec, arrays, h0)
    op = _op(text, options)
    calls = _adjoint_calls(op, monkeypatch)
    policy = op.fuse_backward
    try:
        op.fuse_backward = "kernel"
        for scale in (1.0, -2.5):
            ours = _cuda_grads(op, rec, arrays, h0, {k: v * scale for k, v in cot.items()})
            errors = {k: _rel(ours[k], ref[k] * scale) for k in ref}
            assert max(errors.values()) < (KERNEL_TOL if length < 1000 else LONG_TOL), errors
    finally:
        op.fuse_backward = policy
    which = "True" if loss == "every output" else "readouts"
    assert not calls and ("backward", which) in op._compiles
    assert op.bindings.plans   # the call was bound
    assert {k: tuple(v.shape) for k, v in ours.items()} == {
        k: tuple(v.shape) for k, v in {**arrays, **h0}.items()}



@pytest.mark.gpu
@pytest.mark.parametrize("length", [37, 1100, 4500])
def test_backward_kernel_of_a_recurrence_without_timed_inputs(length: int):
    """``h[t, n] = A[n] h[t-1, n] + B[n]`` called with ``L``: no input says the length, the
    output gradient does (0, 2 and 8 states saved, one a tile); every gradient, the initial
    state's included, against torch autograd through the float64 loop, twice (the second
    through the call bound by the first)."""
    rec = Recurrence.parse(NO_INPUTS)
    rng = np.random.default_rng(length)
    given = {"A": rng.uniform(0.5, 0.95, (6, 4)), "B": rng.standard_normal((6, 4)),
             "h0": rng.uniform(-1, 1, (6, 4))}
    cot = rng.standard_normal((6, 4, length))
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in given.items()}
    out = torch_reference(rec, {k: leaves[k] for k in ("A", "B")}, {"h0": leaves["h0"]},
                          length=length)["h"]
    (out * torch.tensor(cot)).sum().backward()
    ref = {k: v.grad.numpy() for k, v in leaves.items()}
    op = _op(NO_INPUTS, DEFAULT)
    policy = op.fuse_backward
    try:
        op.fuse_backward = "kernel"
        for _ in range(2):
            mine = {k: torch.tensor(v, dtype=torch.float32, device="cuda", requires_grad=True)
                    for k, v in given.items()}
            h = op(**mine, L=length)
            assert tuple(h.grad_fn.saved_tensors[-1].shape) == (6, 4, length // 512)
            got = torch.autograd.grad(h, list(mine.values()),
                                      torch.tensor(cot, dtype=torch.float32, device="cuda"))
            errors = {k: _rel(g.cpu(), ref[k]) for k, g in zip(mine, got)}
            assert max(errors.values()) < (KERNEL_TOL if length < 1000 else LONG_TOL), errors
    finally:
        op.fuse_backward = policy
    assert ("backward", "True") in op._compiles


@pytest.mark.gpu
def test_backward_kernel_fast_call_and_the_general_path(monkeypatch: Any):
    """The eager backward's bound call (``backward_kernel.fast``: one allocation, one memset,
    one launch, a view per gradient) is taken from a signature's first call, a cotangent not
    contiguous (strided, or the expanded one of a sum) copied contiguous first; a policy
    changed after it was bound takes the general path. The forward saves the states at the
    kernel's tile ends alone (the default), which the kernel reads as they are, and a backward
    that then runs the adjoint recomputes them; with ``op.checkpoints = False`` it saves every
    state, and the bound call hands the kernel their tiles' last steps. Every time the
    gradients against torch autograd through the float64 loop."""
    from explorer import backward_kernel
    from tests.unit.test_fused_adjoint import _readouts_grads

    text = ex.PRESETS["selective scan"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text, batch=(2, 3), n=4, length=1100)
    cot, ref = _readouts_grads(rec, arrays, h0)
    op = _op(text, DEFAULT)
    op.bindings = backward_kernel.bindings()   # what other tests bound on this op: dropped

    def check(ours: dict[str, Any]) -> None:
        errors = {k: _rel(ours[k], ref[k]) for k in ref}
        assert max(errors.values()) < KERNEL_TOL, errors

    def kept() -> list[Any]:
        return [v for v in op.bindings.plans.values()
                if v is False or isinstance(v, backward_kernel._Fast)]

    for _ in range(2):
        check(_cuda_grads(op, rec, arrays, h0, cot))
    assert [type(v) for v in kept()] == [backward_kernel._Fast]
    leaves = {k: torch.tensor(v, device="cuda", requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    (name,) = cot
    out = op(**leaves)[name]
    # the same cotangent, every other float of a buffer
    c = torch.as_tensor(cot[name], dtype=torch.float32, device="cuda")
    wide = torch.zeros((*c.shape, 2), dtype=torch.float32, device="cuda")
    wide[..., 0] = c
    g = wide[..., 0]
    assert not g.is_contiguous()
    got = torch.autograd.grad(out, list(leaves.values()), g)
    check({k: v.cpu() for k, v in zip(leaves, got)})
    assert False not in kept()
    fast = [v for v in kept() if v.copied]
    assert len(fast) == 1 and fast[0].copied == (op.specs.outputs.index(name),)
    # a loss of the sum: autograd hands the backward an expanded cotangent (strides of 0)
    out = op(**leaves)[name]
    got = torch.autograd.grad(out.sum(), list(leaves.values()))
    wide64 = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    torch_reference(rec, {k: wide64[k] for k in arrays},
                    {k: wide64[k] for k in h0})[name].sum().backward()
    errors = {k: _rel(v.cpu(), wide64[k].grad.numpy()) for k, v in zip(leaves, got)}
    assert max(errors.values()) < KERNEL_TOL, errors
    assert len([v for v in kept() if v.copied]) == 2 and False not in kept()
    # the default: checkpoints, the states at steps 511 and 1023 alone (the kernel's tiles of
    # 512; a saved output read while the output lives)
    res = op(**leaves)
    assert tuple(res[name].grad_fn.saved_tensors[-1].shape) == (2, 3, 4, 2)
    calls = _adjoint_calls(op, monkeypatch)
    policy = op.fuse_backward
    try:
        # every state saved: the bound call passes the kernel a view of its tiles' last steps
        op.checkpoints = False
        res = op(**leaves)
        assert tuple(res[name].grad_fn.saved_tensors[-1].shape) == (2, 3, 4, 1100)
        for _ in range(2):
            check(_cuda_grads(op, rec, arrays, h0, cot))
        fast = [v for v in kept() if isinstance(v, backward_kernel._Fast) and not v.copied]
        assert len(fast) == 2 and sorted(v.thin is None for v in fast) == [False, True]
        assert not calls
        op.checkpoints = "auto"
        op.fuse_backward = "never"
        check(_cuda_grads(op, rec, arrays, h0, cot))
        assert calls   # the adjoint scan ran: the bound call was not taken
        calls.clear()
        # a forward that saved one step in a tile, a backward that runs the adjoint: the
        # states recomputed by the forward's kernel
        op.fuse_backward = policy
        out = op(**leaves)[name]
        op.fuse_backward = "never"
        got = torch.autograd.grad(out, list(leaves.values()), c)
        check({k: v.cpu() for k, v in zip(leaves, got)})
        assert calls
    finally:
        op.fuse_backward = policy
        op.checkpoints = "auto"


@pytest.mark.gpu
@pytest.mark.parametrize("given", ["per channel", "one row for all"])
def test_backward_kernel_parameters_given_otherwise(given: str):
    """Parameters given for every channel (the kernel's rows are the channels', nothing
    summed after) and as one row every channel shares (all channels add into it): the
    gradients against torch autograd, as given (the other tests give them for the trailing
    batch axis)."""
    from tests.unit.test_fused_adjoint import _readouts_grads

    text = ex.PRESETS["selective scan"]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text, batch=(2, 3), n=4, length=300)
    for p in rec.params:
        v = arrays[p]
        arrays[p] = (np.ascontiguousarray(np.broadcast_to(v, (2, *v.shape[1:])))
                     if given == "per channel" else np.ascontiguousarray(v[0, :1]))
    cot, ref = _readouts_grads(rec, arrays, h0)
    op = _op(text, DEFAULT)
    ours = _cuda_grads(op, rec, arrays, h0, cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors
    assert ("backward", "readouts") in op._compiles
