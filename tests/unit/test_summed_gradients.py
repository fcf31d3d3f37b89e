"""Gradients summed over n in the adjoint's kernel (:func:`explorer.autodiff._summed_readouts`):
the gradient of an input without the axis n of a vector recurrence is a lane-summed readout of
the adjoint recurrence, reading the forward's past state as an input. They must be there where
they can be spelled, absent where they cannot, named apart from the user's names, reduced in
the adjoint's lane loop, and give the gradients of torch autograd."""

from __future__ import annotations

import importlib.util

import numpy as np
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
#: the saved-state input (fwd_h) must move aside
COLLIDING = ("h[t, n] = exp(grad_sum_dt[t] * A[n]) * h[t-1, n] + grad_sum_dt[t] * fwd_h[t] "
             "* B[t, n]\ny[t] = sum(C[t, n] * h[t, n]) + grad_sum_fwd_h[t]")


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
    assert "fwd_h" in bw.recurrence.inputs and not bw.names.previous
    # z and the parameters keep their elementwise formulas
    assert "z" not in bw.names.summed and "A" not in bw.names.summed


def test_lane_gradients_are_lane_readouts_of_the_adjoint():
    """With ``lane_gradients``, B and C (inputs with the axis n) have their whole gradients
    as lane readouts of the adjoint, in its lane loop; the default keeps their formulas."""
    assert grad(ex.PRESETS["Mamba selective scan"]).names.lane == {}
    bw = grad(ex.PRESETS["Mamba selective scan"], lane_gradients=True)
    assert bw.names.lane == {"B": "grad_lane_B", "C": "grad_lane_C"}
    assert set(bw.names.summed) == {"dt", "x"}
    assert set(bw.recurrence.readouts) == {*bw.names.summed.values(), *bw.names.lane.values()}
    assert bw.recurrence.lane_readouts == ("grad_lane_B", "grad_lane_C")
    assert "dL/dB = grad_lane_B  (the adjoint's lane readout" in bw.summary()
    c = grad(ex.PRESETS["selective scan"], lane_gradients=True).compile(
        target="cuda", strategy="warp_shuffle", block_size=32)
    plan = c.stages["plan"].text
    assert ("scan.store {outputs = [lam_h, grad_sum_dt, grad_lane_B, grad_sum_x, "
            "grad_lane_C]}") in plan and "lane-loop" in plan
    added = [a for a in c.kernels[0]["args"] if a["name"] in ("grad_lane_B", "grad_lane_C")]
    assert {(a["role"], a.get("reset", False)) for a in added} == {("output", True),
                                                                   ("rowmap", False)}


@pytest.mark.parametrize("text", [
    ex.PRESETS["selective scan"], ex.PRESETS["Mamba selective scan"],
    "h[t, n] = a[t] * h[t-1, n] + B[t, n]\ny[t] = sum(C[t, n] * h[t, n])",
    "h[t, n] = f[t, n] * h[t-1, n] + x[t] * B[t, n] * B[t, n]\n"
    "y[t] = sum(C[t, n] * h[t, n]) + sum(C[t, n]) * x[t]\ng[t, n] = C[t, n] * h[t, n]"])
@pytest.mark.parametrize("options", [BLELLOCH, SEQUENTIAL], ids=["blelloch", "sequential"])
def test_lane_gradients_match_torch_autograd(text: str, options: dict):
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    cot, ref = _reference_grads(rec, arrays, h0)
    ours = _torch_grads(_compile(text, options).torch(lane_gradients=True), rec, arrays, h0,
                        cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors


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
    assert bw.names.trajectory == {"h": "fwd_h_2"}
    # the past-state input of a gate that keeps h[t-1] moves aside too
    assert grad("h[t] = a[t] * h[t-1] + fwd_h_prev[t]").names.previous == {"h": "fwd_h_prev_2"}
    assert bw.names.summed["grad_sum_dt"] == "grad_sum_grad_sum_dt"
    assert not set(bw.names.summed.values()) & user
    for options in (BLELLOCH, SEQUENTIAL):
        _grads_match(COLLIDING, options)


# ----------------------------------------------------------------------------------------------
# The past state through the step's own (through_state)
# ----------------------------------------------------------------------------------------------
#: gates exp(u) whose input enters the step too, as u does (the rounding of h[t] - b_t stays
#: small against db_t/dx): the scan terms read h[t], scalar and vector, with initial states
THROUGH = ["h[t] = exp(a[t]) * h[t-1] + a[t] * x[t]",
           "h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
           "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]",
           "h[t, n] = exp(softplus(dt[t] + q) * A[n]) * h[t-1, n] + softplus(dt[t] + q) * "
           "B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n])"]
#: gates that keep h[t-1]: through h[t] the term would divide by a[t], or be all cancellation
#: where the gate forgets (no db_t/dx beside it, or one that vanishes with the gate)
KEEP = ["h[t] = a[t] * h[t-1] + b[t]",
        "h[t, n] = a[t] * h[t-1, n] + B[t, n]\ny[t] = sum(C[t, n] * h[t, n])",
        "h[t] = sigmoid(g[t]) * h[t-1] + x[t]",
        "h[t] = exp(-softplus(g[t])) * h[t-1] + (1 - exp(-softplus(g[t]))) * x[t]"]


@pytest.mark.parametrize("text", THROUGH)
def test_gates_read_the_saved_state_at_its_own_step(text: str):
    bw = grad(text)
    assert not bw.names.previous and set(bw.names.trajectory) == {"h"}
    assert bw.names.trajectory["h"] in bw.recurrence.inputs
    for name in bw.names.summed:
        for _, e in bw.scan_terms[name]:
            assert "h[t-1]" not in {s.name for s in e.free_symbols}
    for options in (BLELLOCH, SEQUENTIAL):
        _grads_match(text, options)


@pytest.mark.parametrize("text", KEEP)
def test_gates_that_may_vanish_keep_the_past_state(text: str):
    bw = grad(text)
    assert bw.names.previous == {"h": "fwd_h_prev"} and not bw.names.trajectory
    _grads_match(text, SEQUENTIAL)


def test_the_identity_holds_where_the_state_forgets_almost_everything():
    """exp(A dt) h[t-1] is h[t] - dt B x computed in float32: where the gate is near zero the
    difference is small against both; the gradients must still match float64."""
    text = THROUGH[1]
    rec = Recurrence.parse(text)
    arrays, h0 = _inputs(text)
    arrays["A"] = (arrays["A"] * 0 - 30.0).astype(np.float32)    # exp(-30 dt): near zero
    arrays["dt"] = np.abs(arrays["dt"]).astype(np.float32) + 0.5
    cot, ref = _reference_grads(rec, arrays, h0)
    ours = _torch_grads(_compile(text, BLELLOCH).torch(), rec, arrays, h0, cot)
    errors = {k: _rel(ours[k], ref[k]) for k in ref}
    assert max(errors.values()) < KERNEL_TOL, errors
