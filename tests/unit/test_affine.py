"""Affine decomposition: A_t and b_t, the associative combine, and the renderings."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import explorer as ex
from explorer.groundtruth import interpret, reference
from explorer.passes.affine import AffineForm, symbol
from tests.corpus import CASES


def form(text: str) -> AffineForm:
    return ex.decompose(ex.Recurrence.parse(text))


def test_scalar_affine():
    f = form("h[t] = a[t] * h[t-1] + b[t]")
    assert f.kind == "scalar" and f.size == 1
    assert f.A[0, 0] == symbol("a") and f.b[0] == symbol("b")


def test_coefficients_are_collected_across_terms():
    f = form("h[t] = h[t-1] - alpha * (h[t-1] - x[t])")
    alpha, x = symbol("alpha"), symbol("x")
    assert sympy.simplify(f.A[0, 0] - (1 - alpha)) == 0
    assert sympy.simplify(f.b[0] - alpha * x) == 0


def test_selective_scan_is_diagonal_with_readout():
    f = form(ex.PRESETS["selective scan"])
    assert f.kind == "diagonal" and f.vector
    assert f.A[0, 0] == sympy.exp(symbol("dt") * symbol("A"))
    assert sympy.simplify(f.b[0] - symbol("dt") * symbol("B") * symbol("x")) == 0
    assert "y" in f.readouts and "sum" in sympy.sstr(f.readouts["y"])
    assert f.outputs == ("h", "y") and f.output_is_lane("h") and not f.output_is_lane("y")


def test_second_order_becomes_companion_form():
    f = form("h[t] = 1.6 * h[t-1] - 0.64 * h[t-2] + x[t]")
    assert f.kind == "dense" and f.components == (("h", 0), ("h", 1))
    assert f.A == sympy.Matrix([[sympy.Float(1.6), sympy.Float(-0.64)], [1, 0]])
    assert f.b == sympy.Matrix([symbol("x"), 0])


def test_coupled_states_make_a_dense_matrix():
    f = form("h[t] = a * h[t-1] + c * g[t-1] + x[t]\ng[t] = h[t-1] - g[t-1]")
    assert f.A == sympy.Matrix([[symbol("a"), symbol("c")], [1, -1]])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_decomposition_matches_the_statements(case):
    """The affine form, scanned, equals the statements evaluated step by step."""
    arrs = case.inputs((3,), 40)
    got, want = reference(case.text, **arrs), interpret(case.text, **arrs)
    if isinstance(want, dict):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


_elem = st.integers(1, 3).flatmap(lambda S: st.tuples(
    *[st.tuples(arrays(np.float64, (S, S), elements=st.floats(-2, 2)),
                arrays(np.float64, (S,), elements=st.floats(-2, 2))) for _ in range(3)]))


@settings(max_examples=200, deadline=None)
@given(_elem)
def test_combine_is_associative_with_identity(elems):
    (A3, b3), (A2, b2), (A1, b1) = elems
    c = AffineForm.combine
    left = c(*c(A3, b3, A2, b2), A1, b1)
    right = c(A3, b3, *c(A2, b2, A1, b1))
    np.testing.assert_allclose(left[0], right[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(left[1], right[1], rtol=1e-9, atol=1e-9)
    f = form("h[t] = 1.6 * h[t-1] - 0.64 * h[t-2] + x[t]") if len(b1) == 2 else None
    eye, zero = np.eye(len(b1)), np.zeros(len(b1))
    if f is not None:
        eye, zero = f.identity()
    for got in (c(A1, b1, eye, zero), c(eye, zero, A1, b1)):
        np.testing.assert_allclose(got[0], A1)
        np.testing.assert_allclose(got[1], b1)


def test_combine_applies_earlier_element_first():
    # h = 2 h + 1 then h = 3 h + 5:  3 (2 h + 1) + 5 = 6 h + 8
    A, b = AffineForm.combine(np.array([[3.0]]), np.array([5.0]),
                              np.array([[2.0]]), np.array([1.0]))
    assert A[0, 0] == 6 and b[0] == 8


def test_text_and_latex_renderings():
    f = form(ex.PRESETS["selective scan"])
    text = f.as_text()
    assert "A_t" in text and "b_t" in text and "combine" in text and "diagonal" in text
    tex = f.to_latex()
    assert tex["A"].startswith("A_t = ") and "e^{A dt}" in tex["A"]
    assert r"\circ" in tex["combine"] and r"\sum_{n}" in tex["readout y"]
    assert tex["readout y"].startswith("{y}_t = ")


def test_readout_names_with_underscores_are_no_double_subscripts():
    """``grad_sum_dt_t`` is a double subscript to MathJax, which shows the source in red
    instead (the browser test of the Mamba backward looks for MathJax errors): the name is
    braced. Its first underscore starts the subscript and the others are shown (sympy's
    ``grad_{sum dt}`` read as "sumdt"), in the readout's name and in the expressions."""
    f = form(ex.grad(ex.PRESETS["Mamba selective scan"]).text)
    tex = f.to_latex()
    assert tex["readout grad_sum_dt"].startswith(r"{grad_{sum\_dt}}_t = ")
    assert tex["readout grad_sum_x"].startswith(r"{grad_{sum\_x}}_t = ")
    assert "dt_{bias}" in tex["A"] and "sum dt" not in "".join(tex.values())
    assert r"\sigma\left(z\right)" in tex["A"] + tex["b"]


def test_the_largest_state_the_language_takes_decomposes_quickly():
    """Two coupled states read at t-8: S = 16, the limit of the language; a dense companion
    system whose decomposition (sympy) stays well under a second or two."""
    import time

    from explorer.frontend.recurrence import MAX_STATE_SIZE

    h = " + ".join(f"a{i} * h[t-{i}]" for i in range(1, 9))
    g = " + ".join(f"c{i} * g[t-{i}]" for i in range(1, 9))
    t0 = time.perf_counter()
    f = form(f"h[t] = {h} + g[t-1] + x[t]\ng[t] = {g} + h[t-1]")
    assert time.perf_counter() - t0 < 5
    assert f.size == MAX_STATE_SIZE == 16 and f.kind == "dense"
    assert f.A[0, :8] == sympy.Matrix([[symbol(f"a{i}") for i in range(1, 9)]])
    assert f.A[8, 0] == 1 and f.A[1, 0] == 1    # g reads h[t-1]; h's companion row
