"""The torch operator's fused and traced backwards (:mod:`explorer.fused_backward`): traced once
per signature (and compiled, or replayed), they must give the eager formulas' gradients, be
taken only where the policy says, keep one graph per signature, and fall back to the eager
formulas (with one warning) where they cannot be made. On the CPU the graphs compile with
``aot_eager`` (no code generation); the GPU tests compile them with inductor."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import explorer as ex

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                                reason="compiling needs the MLIR Python bindings")

from explorer.fused_backward import check_policy  # noqa: E402
from explorer.torch_op import torch_op  # noqa: E402
from tests.unit.test_autodiff import BLELLOCH, _compile, _inputs  # noqa: E402

SELECTIVE = ex.PRESETS["selective scan"]
AFFINE = ex.PRESETS["affine scan"]


@pytest.fixture
def op_of() -> Iterator[Any]:
    """The operator of a compile, its fused backward compiled with ``aot_eager`` and with no
    signature kept; its settings are put back afterwards (operators are shared by key)."""
    made: list[Any] = []

    def make(text: str) -> Any:
        op = _compile(text, BLELLOCH).torch()
        made.append((op, op.fuse_backward, op.fused.backend, op.fused.auto_devices))
        op.fused.backend = "aot_eager"
        _forget(op)
        return op
    yield make
    for op, policy, backend, devices in made:
        op.fuse_backward, op.fused.backend, op.fused.auto_devices = policy, backend, devices
        _forget(op)


def _forget(op: Any) -> None:
    for kept in (op.fused._fused, op.fused._seen, op.fused._failed, op.fused._replays.plans):
        kept.clear()


def _grads(op: Any, arrays: dict[str, np.ndarray], grad: set[str] | None = None,
           readout_only: bool = False) -> dict[str, Any]:
    leaves = {k: torch.tensor(v, requires_grad=grad is None or k in grad)
              for k, v in arrays.items()}
    out = op(**leaves)
    outs = out if isinstance(out, dict) else {"h": out}
    loss = sum((v * torch.cos(v)).sum() for k, v in outs.items()
               if not readout_only or k != "h")
    loss.backward()
    return {k: v.grad for k, v in leaves.items() if v.grad is not None}


@pytest.mark.parametrize("text", [SELECTIVE, AFFINE])
def test_fused_gradients_match_the_eager_formulas(op_of: Any, text: str) -> None:
    arrays, _ = _inputs(text)
    op = op_of(text)
    op.fuse_backward = "never"
    eager = _grads(op, arrays)
    op.fuse_backward = "always"
    fused = _grads(op, arrays)
    assert op.fused.signatures == 1
    again = _grads(op, arrays)
    assert op.fused.signatures == 1   # the compile of the signature is reused
    assert set(fused) == set(eager) == set(again) == set(arrays)
    for k in eager:
        assert torch.allclose(fused[k], eager[k], rtol=1e-6, atol=1e-7), k
        assert torch.equal(fused[k], again[k]), k


@pytest.mark.parametrize("text", [SELECTIVE, AFFINE, ex.PRESETS["Mamba selective scan"]])
def test_traced_gradients_are_the_eager_ones(op_of: Any, text: str) -> None:
    """The replayed trace runs the eager formulas' operations in their order: the same bits,
    with the adjoint called without its operator's dispatch."""
    arrays, _ = _inputs(text)
    op = op_of(text)
    op.fuse_backward = "never"
    eager = _grads(op, arrays)
    op.fuse_backward = "traced"
    traced = [_grads(op, arrays) for _ in range(2)]
    assert op.fused.signatures == 1
    (run,) = op.fused._fused.values()
    targets = [n.target for n in run.__self__.graph.nodes if n.op == "call_function"]
    assert op.adjoint_overload not in targets   # called directly
    assert sum(getattr(t, "__name__", "") == "adjoint" for t in targets) >= 1
    if text == AFFINE:   # its reshapes to the canonical layout and back are all identities
        assert {getattr(t, "__name__", "") for t in targets} == {"adjoint", "getitem"}
    for run in traced:
        assert set(run) == set(eager) == set(arrays)
        for k in eager:
            assert torch.equal(run[k], eager[k]), k


@pytest.mark.parametrize("text", [AFFINE, SELECTIVE])
def test_an_eager_backward_replays_its_graph_from_what_autograd_hands_it(
        op_of: Any, text: str, monkeypatch: Any) -> None:
    """Once a signature's graph ran, the eager backward of that key (what autograd hands it)
    replays it directly, without the names and layouts of the general path: the same bits as
    the eager formulas; another key (gradients asked of one input alone, a loss of the readouts
    alone, another policy) takes the general path first, and binds its own."""
    arrays, _ = _inputs(text)
    op = op_of(text)
    op.fuse_backward = "never"
    eager = _grads(op, arrays)
    readouts = _grads(op, arrays, readout_only=True) if text == SELECTIVE else None
    op.fuse_backward = "traced"
    assert set(_grads(op, arrays)) == set(arrays)
    assert len(op.fused._replays.plans) == 1
    general: list[int] = []
    unpack = op._unpack
    monkeypatch.setattr(op, "_unpack", lambda *a, **k: general.append(1) or unpack(*a, **k))
    for _ in range(2):
        again = _grads(op, arrays)
        assert not general   # the replay ran
        assert set(again) == set(eager)
        for k in eager:
            assert torch.equal(again[k], eager[k]), k
    first = sorted(arrays)[0]
    one = _grads(op, arrays, grad={first})
    assert general and set(one) == {first} and torch.equal(one[first], eager[first])
    assert len(op.fused._replays.plans) == 2
    if readouts is not None:   # no cotangent of the states: None among autograd's gradients
        general.clear()
        for _ in range(2):
            got = _grads(op, arrays, readout_only=True)
            for k in readouts:
                assert torch.equal(got[k], readouts[k]), k
        assert len(general) == 1 and len(op.fused._replays.plans) == 3
    op.fuse_backward = "never"
    general.clear()
    _grads(op, arrays)
    assert general


def test_identity_views_are_dropped_and_others_kept() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from explorer.fused_backward import _drop_identity_views

    def f(x: Any) -> Any:
        same = x.view(4, 1, 6).select(1, 0)              # x's own layout
        moved = x.view(2, 2, 6).permute(1, 0, 2)[1:]     # another layout: kept
        return same * 2, moved.expand(1, 2, 6).unsqueeze(0) + 1   # expand to its own shape

    x = torch.arange(24.0).view(4, 6)
    graph = make_fx(f, tracing_mode="fake")(x)
    before = len(graph.graph.nodes)
    _drop_identity_views(graph.graph)
    graph.recompile()
    assert len(graph.graph.nodes) == before - 3   # view and select of x, the expand
    for got, want in zip(graph(x), f(x), strict=True):
        assert torch.equal(got, want)


def test_a_traced_adjoint_must_return_the_layout_it_was_traced_with(op_of: Any) -> None:
    """The views after the adjoint were traced on its fake outputs: a runner returning other
    strides is an error that keeps the eager formulas, not other elements read."""
    op = op_of(AFFINE)
    arrays, _ = _inputs(AFFINE)
    op.fuse_backward = "never"
    eager = _grads(op, arrays)
    runner = op.adjoint_runner

    def transposed(*args: Any) -> Any:
        out = runner(*args)
        outs = out if isinstance(out, tuple) else (out,)
        moved = tuple(t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in outs)
        return moved if isinstance(out, tuple) else moved[0]

    op.fuse_backward = "traced"
    op.adjoint_runner = transposed
    try:
        with pytest.warns(RuntimeWarning, match="could not be traced .*its trace had"):
            got = _grads(op, arrays)
    finally:
        op.adjoint_runner = runner
    assert op.fused.signatures == 0
    for k in eager:
        assert torch.equal(got[k], eager[k]), k


def test_a_traced_adjoint_is_bound_after_its_first_call(op_of: Any) -> None:
    """The adjoint's node calls the runner (and checks its outputs) once, then what the
    runner's ``bind`` gave for that call (on CUDA, its launch plan; None, as on the CPU,
    keeps the checked call): the same gradients."""
    op = op_of(AFFINE)
    arrays, _ = _inputs(AFFINE)
    op.fuse_backward = "never"
    eager = _grads(op, arrays)
    runner = op.adjoint_runner
    calls: list[str] = []

    class Binding:
        def __init__(self, bindable: bool) -> None:
            self.bindable = bindable

        def __call__(self, *args: Any) -> Any:
            calls.append("checked")
            return runner(*args)

        def bind(self, *args: Any) -> Any:
            assert runner.bind(*args) is None   # CPU tensors take no launch plan

            def launch(*call: Any) -> Any:
                calls.append("bound")
                return runner(*call)

            return launch if self.bindable else None

    op.fuse_backward = "traced"
    try:
        for bindable, want in ((True, ["checked", "bound", "bound"]),
                               (False, ["checked", "checked", "checked"])):
            _forget(op)   # the graphs and their replays
            calls.clear()
            op.adjoint_runner = Binding(bindable)
            got = [_grads(op, arrays) for _ in range(3)]
            assert calls == want
            for g in got:
                assert all(torch.equal(g[k], eager[k]) for k in eager)
    finally:
        op.adjoint_runner = runner


def test_each_signature_compiles_once(op_of: Any) -> None:
    """Shapes, the gradients asked for and the output gradients given make a signature."""
    op = op_of(SELECTIVE)
    op.fuse_backward = "always"
    arrays, _ = _inputs(SELECTIVE)
    longer, _ = _inputs(SELECTIVE, length=23)
    _grads(op, arrays)
    _grads(op, longer)
    assert op.fused.signatures == 2
    some = _grads(op, arrays, grad={"x", "A"})
    assert set(some) == {"x", "A"} and op.fused.signatures == 3
    _grads(op, arrays, readout_only=True)   # dL/dh not given
    assert op.fused.signatures == 4
    op.fuse_backward = "never"
    eager = _grads(op, arrays, grad={"x", "A"})
    for k in some:
        assert torch.allclose(some[k], eager[k], rtol=1e-6, atol=1e-7), k


def test_auto_fuses_vector_recurrences_on_its_devices_from_the_second_call(op_of: Any
                                                                          ) -> None:
    op = op_of(SELECTIVE)
    arrays, _ = _inputs(SELECTIVE)
    assert op.fuse_backward == "auto"
    _grads(op, arrays)
    _grads(op, arrays)
    assert op.fused.signatures == 0          # CPU tensors: never fused by auto
    op.fused.auto_devices = ("cpu",)
    _grads(op, arrays)
    assert op.fused.signatures == 0          # the first call of a signature runs eager
    _grads(op, arrays)
    assert op.fused.signatures == 1
    scalar = op_of(AFFINE)                   # a scalar recurrence: auto replays its trace
    scalar.fused.auto_devices = ("cpu",)
    affine, _ = _inputs(AFFINE)
    _grads(scalar, affine)
    assert scalar.fused.signatures == 0
    for _ in range(2):
        _grads(scalar, affine)
    assert [k[0] for k in scalar.fused._fused] == ["traced"]
    wide = {k: v.astype(np.float64) for k, v in arrays.items()}   # float64 runs the reference
    for _ in range(2):
        _grads(op, wide)
    assert op.fused.signatures == 1


def test_a_failed_compile_keeps_the_eager_formulas_and_warns_once(op_of: Any) -> None:
    op = op_of(AFFINE)
    arrays, _ = _inputs(AFFINE)
    op.fuse_backward = "never"
    eager = _grads(op, arrays)
    op.fuse_backward = "always"
    op.fused.backend = "no-such-backend"
    with pytest.warns(RuntimeWarning, match="could not be compiled"):
        first = _grads(op, arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the failure is remembered: no second try, no warning
        second = _grads(op, arrays)
    assert op.fused.signatures == 0
    for k in eager:
        assert torch.equal(first[k], eager[k]) and torch.equal(second[k], eager[k]), k


@pytest.mark.parametrize(("value", "policy"), [("auto", "auto"), ("always", "always"),
                                               ("traced", "traced"), ("never", "never"),
                                               (True, "always"),
                                               (False, "never")])
def test_policies(value: object, policy: str) -> None:
    assert check_policy(value) == policy


@pytest.mark.parametrize("bad", ["sometimes", "AUTO", 1, None, ["auto"]])
def test_unknown_policies_are_refused(bad: object) -> None:
    with pytest.raises(ValueError,
                       match="fuse_backward must be one of auto, always, traced, never"):
        check_policy(bad)


def test_torch_op_sets_the_policy(op_of: Any) -> None:
    op = op_of(AFFINE)
    assert torch_op(op.compiled, fuse_backward="never") is op and op.fuse_backward == "never"
    assert torch_op(op.compiled) is op and op.fuse_backward == "never"   # None: unchanged
    with pytest.raises(ValueError, match="fuse_backward"):
        torch_op(op.compiled, fuse_backward="maybe")
    op.fuse_backward = True
    assert op.fuse_backward == "always"
    with pytest.raises(ValueError, match="fuse_backward must be one of"):
        op.fuse_backward = "bogus"   # the attribute is checked too
    assert op.fuse_backward == "always"


def test_a_compile_is_logged(op_of: Any, caplog: Any) -> None:
    op = op_of(AFFINE)
    op.fuse_backward = "always"
    arrays, _ = _inputs(AFFINE)
    with caplog.at_level("INFO", logger="explorer.fused_backward"):
        _grads(op, arrays)
        _grads(op, arrays)
    compiled = [r for r in caplog.records if r.name == "explorer.fused_backward"]
    assert len(compiled) == 1 and "compiled the fused backward" in compiled[0].getMessage()
