"""``sigmoid`` and ``softplus`` at inputs far past float32's ``exp`` range (|x| > 88): the
forward kernels, the derived backward (its adjoint recurrence and its gradient formulas) and the
NumPy evaluations must stay finite and agree with float64, where ``log(1 + exp(x))`` and
``exp(x) / (exp(x) + 1)`` overflow to ``inf`` and ``inf / inf``. They are sympy functions of
their own (:mod:`explorer.passes.lanesum`) that each consumer computes without overflow."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import sympy

import explorer as ex
from explorer.passes.lanesum import Sigmoid, Softplus
from explorer.passes.numeric import evaluate

needs_mlir = pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                                reason="compiling needs the MLIR Python bindings")
GATED = "h[t] = sigmoid(z[t]) * h[t-1] + softplus(x[t])"
FAR = np.array([-300.0, -120.0, -89.0, -20.0, 0.0, 20.0, 89.0, 120.0, 300.0])


def test_the_functions_stay_functions_and_differentiate_into_each_other():
    x = sympy.Symbol("x", real=True)
    assert sympy.diff(Softplus(x), x) == Sigmoid(x)
    assert sympy.diff(Sigmoid(x), x) == Sigmoid(x) * (1 - Sigmoid(x))
    assert abs(float(Softplus(sympy.Integer(2))) - np.logaddexp(0, 2)) < 1e-12
    assert float(Softplus(sympy.Float(1000.0))) == 1000.0      # numbers fold without overflow
    assert float(Sigmoid(sympy.Integer(-1000))) == 0.0 and float(Sigmoid(sympy.Integer(0))) == 0.5
    assert str(Softplus(x)) == "softplus(x)" and str(Sigmoid(x)) == "sigmoid(x)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no overflow warning from NumPy
        sp = evaluate(Softplus(x), {"x": FAR})
        sg = evaluate(Sigmoid(x), {"x": FAR})
    assert np.all(np.isfinite(sp)) and np.all(np.isfinite(sg))
    assert np.allclose(sp, np.where(FAR > 30, FAR, np.log1p(np.exp(np.minimum(FAR, 30)))))
    assert sg[0] == 0.0 and sg[-1] == 1.0 and abs(sg[4] - 0.5) < 1e-15


def test_the_adjoint_spells_them_as_the_language_does():
    bw = ex.grad(ex.PRESETS["Mamba selective scan"])
    assert "softplus(dt_bias + dt_next[t])" in bw.text and "sigmoid(z[t])" in bw.text
    assert "exp(dt" not in bw.text and "+ 1)" not in bw.text


@needs_mlir
def test_the_forward_kernels_are_finite_far_out():
    rng = np.random.default_rng(0)
    L = len(FAR) * 4
    x = np.tile(FAR, 4)[None, :].astype(np.float32)
    z = rng.permutation(np.tile(FAR, 4))[None, :].astype(np.float32)
    want = ex.reference(GATED, x=x.astype(np.float64), z=z.astype(np.float64))
    assert np.all(np.isfinite(want))
    for strategy in ("sequential", "blelloch"):
        got = ex.compile(GATED, target="cpu", strategy=strategy)(device="cpu", x=x, z=z)
        got = np.asarray(got, dtype=np.float64)
        assert got.shape == (1, L) and np.all(np.isfinite(got)), strategy
        assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)) < 1e-5, strategy


@needs_mlir
def test_the_mamba_gradients_are_finite_and_right_far_out():
    torch = pytest.importorskip("torch")
    op = ex.compile(ex.PRESETS["Mamba selective scan"], target="cpu").torch()
    gen = torch.Generator().manual_seed(0)
    b, d, n, L = 1, 2, 3, 12
    base = {"dt": torch.randn(b, d, L, generator=gen), "A": -torch.rand(d, n, generator=gen) - 0.5,
            "B": torch.randn(b, 1, n, L, generator=gen), "x": torch.randn(b, d, L, generator=gen),
            "C": torch.randn(b, 1, n, L, generator=gen), "D": torch.randn(d, generator=gen),
            "z": torch.randn(b, d, L, generator=gen), "dt_bias": torch.randn(d, generator=gen)}
    for dt_shift, z_shift in ((95.0, 0.0), (200.0, -120.0), (-150.0, 120.0), (0.0, -95.0)):
        arrays = {k: v.clone() for k, v in base.items()}
        arrays["dt"] += dt_shift
        arrays["z"] += z_shift
        grads = {}
        for dtype in (torch.float32, torch.float64):   # float64: the float64 reference
            leaves = {k: v.detach().to(dtype).clone().requires_grad_() for k, v in arrays.items()}
            y = op(**leaves)["y"]
            assert torch.isfinite(y).all(), (dt_shift, z_shift, dtype)
            y.backward(torch.ones_like(y))
            grads[dtype] = {k: v.grad.double() for k, v in leaves.items()}
        for k, g in grads[torch.float32].items():
            ref = grads[torch.float64][k]
            assert torch.isfinite(g).all(), (k, dt_shift, z_shift)
            err = float((g - ref).abs().max() / ref.abs().max().clamp_min(1e-20))
            assert err < 1e-4 or float((g - ref).abs().max()) < 1e-20, (k, dt_shift, err)
