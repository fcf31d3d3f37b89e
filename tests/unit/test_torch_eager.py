"""The torch operator's eager path (:func:`explorer.torch_eager.eager`): in eager mode a call runs
the operator's forward, autograd formula and adjoint as a plain autograd function, without the
custom operators' dispatch; traced, fake or wrapped tensors take the registered operators. Both
paths must give the same outputs and gradients, and each must be taken where it should be."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np
import pytest

import explorer as ex

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                                reason="compiling needs the MLIR Python bindings")

from explorer.torch_eager import eager as _eager  # noqa: E402
from tests.unit.test_autodiff import BLELLOCH, _compile, _inputs  # noqa: E402

TEXT = ex.PRESETS["selective scan"]


def _leaves(arrays: dict[str, np.ndarray], grad: set[str] | None = None) -> dict[str, Any]:
    return {k: torch.tensor(v, requires_grad=grad is None or k in grad)
            for k, v in arrays.items()}


def _values(op: Any, given: dict[str, Any]) -> list[Any]:
    return [given.get(n) for n in op.specs.names]


def test_eager_calls_run_the_autograd_function_and_match_the_operator():
    arrays, _ = _inputs(TEXT)
    op = _compile(TEXT, BLELLOCH).torch()
    eager, dispatched = _leaves(arrays), _leaves(arrays)
    out = op(**eager)
    assert type(out["y"].grad_fn).__name__ == "_EagerBackward"
    outs = dict(zip(op.specs.outputs, op.forward_op(*_values(op, dispatched))))
    y_op, h_op = outs["y"], outs["h"]
    assert type(y_op.grad_fn).__name__.startswith("GeneratedBackwardFor_scanweaver_fwd")
    assert torch.equal(out["y"], y_op) and torch.equal(out["h"], h_op)
    (out["y"].square().sum() + out["h"].sum()).backward()
    (y_op.square().sum() + h_op.sum()).backward()
    for k in arrays:
        assert eager[k].grad is not None, k
        assert torch.allclose(eager[k].grad, dispatched[k].grad, rtol=1e-6, atol=1e-7), k


def test_eager_path_computes_only_the_gradients_asked_for():
    arrays, _ = _inputs(TEXT)
    op = _compile(TEXT, BLELLOCH).torch()
    some = _leaves(arrays, grad={"x", "A"})
    every = _leaves(arrays)
    op(**some)["y"].sum().backward()
    op(**every)["y"].sum().backward()
    for k in arrays:
        if k in {"x", "A"}:
            assert torch.equal(some[k].grad, every[k].grad), k
        else:
            assert some[k].grad is None, k


def test_calls_autograd_would_not_record_skip_the_autograd_function(
        monkeypatch: pytest.MonkeyPatch):
    """Under ``torch.no_grad()``, in inference mode, or with no tensor asking for a gradient,
    an eager call is the forward alone: the same outputs as the autograd function's, no graph,
    and the autograd function never runs; a tensor asking for one (grad mode on) takes it, and
    so does a call under forward-mode AD (which the autograd function refuses, as before)."""
    from explorer import torch_op
    from explorer.torch_eager import records

    arrays, _ = _inputs(TEXT)
    op = _compile(TEXT, BLELLOCH).torch()
    want = op(**_leaves(arrays))
    plain = {k: torch.tensor(v) for k, v in arrays.items()}
    leaves = _leaves(arrays, grad={"A"})
    assert not records(_values(op, plain)) and records(_values(op, leaves))
    applied: list[int] = []
    real = torch_op._Eager.apply

    def counted(*args: Any) -> Any:
        applied.append(1)
        return real(*args)

    monkeypatch.setattr(torch_op._Eager, "apply", counted)
    with torch.no_grad():
        assert not records(_values(op, leaves))
        in_no_grad = op(**leaves)
    for got in (op(**plain), in_no_grad):
        for k in op.specs.outputs:
            assert got[k].grad_fn is None and not got[k].requires_grad, k
            assert torch.equal(got[k], want[k].detach()), k
    with torch.inference_mode():
        got = op(**plain)
    assert got["y"].is_inference() and torch.equal(got["y"], want["y"].detach())
    assert not applied
    got = op(**leaves)
    assert applied == [1] and type(got["y"].grad_fn).__name__ == "_EagerBackward"
    got["y"].sum().backward()
    assert leaves["A"].grad is not None and leaves["x"].grad is None
    # forward-mode AD: a dual tensor asks for no gradient, and its tangent must not be dropped
    # silently: the autograd function runs, and refuses it (it has no jvp)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = {**plain, "x": fwad.make_dual(plain["x"], torch.ones_like(plain["x"]))}
        assert records(_values(op, dual))
        with pytest.raises(NotImplementedError, match="jvp"):
            op(**dual)
    assert applied == [1, 1]


def test_fake_and_traced_tensors_take_the_registered_operator():
    from torch._subclasses.fake_tensor import FakeTensorMode

    arrays, _ = _inputs(TEXT)
    op = _compile(TEXT, BLELLOCH).torch()
    real = _leaves(arrays)
    assert _eager(_values(op, real))
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) for k, v in real.items()}
        assert not _eager(_values(op, fake))
        out = op(**fake)   # the eager path would run the kernels on fake tensors and fail
        assert tuple(out["y"].shape) == tuple(arrays["x"].shape)
    seen: list[bool] = []

    def traced(x: Any) -> Any:
        seen.append(_eager([x]))
        return x * 2

    torch.compile(traced, backend="eager", fullgraph=True)(torch.ones(3))
    assert seen == [False]
    with warnings.catch_warnings():   # torch.jit.trace is deprecated, and still traces
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.trace(traced, torch.ones(3), check_trace=False)
    assert seen == [False, False]
    from torch.overrides import TorchFunctionMode

    with TorchFunctionMode():
        assert not _eager(_values(op, real))
    x = torch.ones(3)
    assert _eager([x, None, 3])
    assert torch.func.vmap(lambda v: (seen.append(_eager([v])), v)[1])(torch.ones(2, 3)) \
        is not None and seen[-1] is False
