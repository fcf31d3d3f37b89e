"""Gradients summed over n in the adjoint's kernel (:func:`explorer.autodiff._summed_readouts`):
the gradient of an input without the axis n of a vector recurrence is a lane-summed readout of
the adjoint recurrence, reading the forward's past state as an input. They must be there where
they can be spelled, absent where they cannot, named apart from the user's names, reduced in
the adjoint's lane loop, and give the gradients of torch autograd."""

from __future__ import annotations

import importlib.util

import pytest

import explorer as ex

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                                reason="compiling needs the MLIR Python bindings")

from explorer.autodiff import grad  # noqa: E402
from explorer.frontend.recurrence import Recurrence  # noqa: E402
from tests.unit.test_autodiff import (  # noqa: E402
    BLELLOCH,
    KERNEL_TOL,
    SEQUENTIAL,
    _compile,
    _inputs,
    _reference_grads,
    _rel,
    _torch_grads,
)

#: user names that take the backward's first choices: the summed readout of grad_sum_dt and
#: the past-state input (fwd_h_prev) must move aside
COLLIDING = ("h[t, n] = exp(grad_sum_dt[t] * A[n]) * h[t-1, n] + fwd_h_prev[t] * B[t, n]\n"
             "y[t] = sum(C[t, n] * h[t, n]) + grad_sum_fwd_h_prev[t]")


def _grads_match(text: str, options: dict) -> None:
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, ref = _reference_grads(rec, arrays, h0)
    ours = _torch_grads(_compile(text, options).torch(), rec, arrays, h0, cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors


def test_the_mamba_preset_sums_dt_and_x_in_the_adjoint():
    bw = grad(ex.PRESETS["Mamba selective scan"])
    assert set(bw.names.summed) == {"dt", "x"}
    assert bw.recurrence.readouts == tuple(bw.names.summed[k] for k in ("dt", "x"))
    assert "fwd_h_prev" in bw.recurrence.inputs
    # z and the parameters keep their elementwise formulas
    assert "z" not in bw.names.summed and "A" not in bw.names.summed


def test_the_summed_readouts_are_reduced_in_the_adjoints_lane_loop():
    bw = grad(ex.PRESETS["selective scan"])
    c = bw.compile(target="cuda", strategy="warp_shuffle", block_size=32)
    plan = c.stages["plan"].text
    assert "scan.store {outputs = [lam_h, grad_sum_dt, grad_sum_x]}" in plan
    assert "lane-loop" in plan
    # one kernel writes the adjoint and both gradients: no separate readout kernel
    assert not any("readout" in k["name"] for k in c.kernels)


def test_lane_inputs_keep_their_formulas_and_a_scalar_gradient_that_is_lam_too():
    # a scalar state: the term of a is a readout of the adjoint, that of b is lam itself
    assert grad(ex.PRESETS["affine scan"]).names.summed == {"a": "grad_sum_a"}
    bw = grad(ex.PRESETS["selective scan"])
    assert not {"A", "B", "C", "D"} & set(bw.names.summed)


@pytest.mark.parametrize("lag", [2, 5])
def test_a_term_two_steps_back_stays_elementwise(lag: int):
    text = (f"h[t, n] = a[t] * h[t-1, n] + x[t] * h[t-{lag}, n] + B[t, n]\n"
            "y[t] = sum(C[t, n] * h[t, n])")
    bw = grad(text)
    assert "x" not in bw.names.summed     # its term reads h[t-lag]
    assert bw.names.summed == {"a": "grad_sum_a"}
    _grads_match(text, SEQUENTIAL)


def test_colliding_names_move_aside_and_the_gradients_hold():
    bw = grad(COLLIDING)
    user = set(Recurrence.parse(COLLIDING).inputs)
    assert bw.names.previous == {"h": "fwd_h_prev_2"}
    assert bw.names.summed["grad_sum_dt"] == "grad_sum_grad_sum_dt"
    assert not set(bw.names.summed.values()) & user
    for options in (BLELLOCH, SEQUENTIAL):
        _grads_match(COLLIDING, options)
