"""The float64 reference: shape rules, initial state, chunked long scans and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import explorer as ex
from explorer.groundtruth import interpret

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


def loop(a, b, h0=0.0):
    h = np.zeros(np.broadcast_shapes(a.shape, b.shape))
    prev = np.broadcast_to(np.asarray(h0, float), h.shape[:-1]).copy()
    for t in range(h.shape[-1]):
        prev = a[..., t] * prev + b[..., t]
        h[..., t] = prev
    return h


def test_affine_scan_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 1, (3, 4, 50)), rng.normal(size=(3, 4, 50))
    np.testing.assert_allclose(ex.reference(AFFINE, a=a, b=b), loop(a, b), rtol=1e-12)


def test_initial_state_and_broadcasting():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0.5, 1, (50,)), rng.normal(size=(4, 50))
    h0 = rng.normal(size=(4,))
    got = ex.reference(AFFINE, a=a, b=b, h0=h0)
    assert got.shape == (4, 50)
    np.testing.assert_allclose(got, loop(np.broadcast_to(a, (4, 50)), b, h0), rtol=1e-12)


def test_parameters_broadcast_over_time_and_batch():
    x = np.random.default_rng(2).normal(size=(2, 3, 20))
    gamma = np.array([0.5, 0.9, 0.99])
    got = ex.reference("h[t] = gamma * h[t-1] + (1 - gamma) * x[t]", x=x, gamma=gamma)
    want = loop(np.broadcast_to(gamma[:, None], x.shape), (1 - gamma[:, None]) * x)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_selective_scan_shapes():
    Bt, D, N, L = 2, 3, 4, 16
    rng = np.random.default_rng(3)
    out = ex.reference(ex.PRESETS["selective scan"], dt=rng.uniform(0, .1, (Bt, D, L)),
                       A=-rng.uniform(0, 1, (D, N)), B=rng.normal(size=(Bt, 1, N, L)),
                       C=rng.normal(size=(Bt, 1, N, L)), x=rng.normal(size=(Bt, D, L)),
                       D=rng.normal(size=(D,)))
    assert set(out) == {"h", "y"}
    assert out["h"].shape == (Bt, D, N, L) and out["y"].shape == (Bt, D, L)


def test_selective_scan_readout_by_hand():
    rng = np.random.default_rng(4)
    N, L = 3, 10
    dt, x = rng.uniform(0, .1, L), rng.normal(size=L)
    A, B, C, D = -rng.uniform(0, 1, N), rng.normal(size=(N, L)), rng.normal(size=(N, L)), 0.7
    out = ex.reference(ex.PRESETS["selective scan"], dt=dt, A=A, B=B, C=C, x=x, D=np.array(D))
    h = np.zeros(N)
    for t in range(L):
        h = np.exp(dt[t] * A) * h + dt[t] * B[:, t] * x[t]
        np.testing.assert_allclose(out["h"][:, t], h, rtol=1e-12)
        np.testing.assert_allclose(out["y"][t], C[:, t] @ h + D * x[t], rtol=1e-12)


@pytest.mark.parametrize("channels, L", [(1, 100_003), (3, 20_000)])
def test_chunked_long_scan_equals_loop(channels, L):
    rng = np.random.default_rng(5)
    a, b = rng.uniform(0.99, 1.0, (channels, L)), rng.normal(size=(channels, L))
    np.testing.assert_allclose(ex.reference(AFFINE, a=a, b=b, h0=np.ones(channels)),
                               loop(a, b, 1.0), rtol=1e-9, atol=1e-9)


def test_dense_long_scan_equals_interpreter():
    x = np.random.default_rng(6).normal(size=(2, 5000))
    text = "h[t] = 1.6 * h[t-1] - 0.64 * h[t-2] + x[t]"
    np.testing.assert_allclose(ex.reference(text, x=x), interpret(text, x=x), rtol=1e-9,
                               atol=1e-9)


@pytest.mark.parametrize("arrays, words", [
    (dict(a=np.ones((2, 5)), b=np.ones((3, 5))), "do not broadcast"),
    (dict(a=np.ones((2, 5)), b=np.ones((2, 6))), "time axes"),
    (dict(a=np.ones((2, 5))), "missing array: b"),
    (dict(a=np.ones(5), b=np.ones(5), c=np.ones(5)), "unexpected array: c"),
    (dict(a=np.array(["x"] * 5), b=np.ones(5)), "dtype"),
    (dict(a=np.ones(5, dtype=complex), b=np.ones(5)), "dtype"),
    (dict(a=[1.0, 2.0], b=np.ones(2)), "must be an array"),
    (dict(a=np.ones(5), b=np.ones(5), h0=np.ones(3)), "does not broadcast"),
])
def test_bad_arrays_raise_clear_errors(arrays, words):
    with pytest.raises(ex.RecurrenceError, match=words):
        ex.reference(AFFINE, **arrays)


def test_vector_state_needs_lane_axis():
    with pytest.raises(ex.RecurrenceError, match=r"B must have shape \(\.\.\., N, L\), got \(4,\)"):
        ex.reference("h[t, n] = A[n] * h[t-1, n] + B[t, n]", A=np.ones(3), B=np.ones(4))


def test_a_number_for_a_lane_parameter_broadcasts_over_the_lanes():
    B = np.random.default_rng(7).normal(size=(2, 3, 6))
    text = "h[t, n] = A[n] * h[t-1, n] + B[t, n]"
    got = ex.reference(text, A=0.5, B=B)
    np.testing.assert_allclose(got, ex.reference(text, A=np.full(3, 0.5), B=B), rtol=1e-12)
    assert got.shape == (2, 3, 6)
