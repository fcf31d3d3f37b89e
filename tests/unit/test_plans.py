"""Scan plans as data: work, depth, the NumPy interpreter and the graphviz picture."""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest

import explorer as ex
from explorer.groundtruth import scan
from explorer.passes.plans import make_plan, run_plan
from tests.corpus import CASES


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 1024])
def test_blelloch_work_and_depth(n):
    p = make_plan("blelloch", n)
    assert p.work == 2 * (n - 1)
    assert p.depth == 2 * int(math.log2(n))
    assert [lv.phase for lv in p.levels] == ["up"] * (p.depth // 2) + ["down"] * (p.depth // 2)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_kogge_stone_and_sequential_work_and_depth(n):
    k = make_plan("kogge_stone", n)
    assert k.depth == int(math.log2(n)) and k.work == n * int(math.log2(n)) - (n - 1)
    s = make_plan("sequential", n)
    assert s.work == n - 1 and s.depth == n - 1


@pytest.mark.parametrize("n", [1, 5, 32, 33, 64, 100])
def test_warp_shuffle_levels(n):
    """Five shuffle levels inside each group of 32 (fewer below 32 positions), then one join
    per later group; no step crosses a group in a shuffle level."""
    p = make_plan("warp_shuffle", n)
    shuffles = [lv for lv in p.levels if lv.phase == "shuffle"]
    joins = [lv for lv in p.levels if lv.phase == "warps"]
    assert len(shuffles) == min(5, (n - 1).bit_length()) and len(joins) == (n - 1) // 32
    assert all(st.left // 32 == st.right // 32 for lv in shuffles for st in lv.steps)
    assert all(st.left % 32 == 31 and st.right // 32 == st.left // 32 + 1
               for lv in joins for st in lv.steps)
    assert p.n == p.size == n


def test_non_power_of_two_is_padded():
    p = make_plan("blelloch", 5)
    assert p.n == 5 and p.size == 8


@pytest.mark.parametrize("strategy", ["sequential", "blelloch", "kogge_stone", "warp_shuffle"])
@pytest.mark.parametrize("S", [1, 2, 3])
def test_interpreter_equals_sequential_scan_for_every_n(strategy, S):
    rng = np.random.default_rng(S)
    for n in list(range(1, 34)) + [100, 255, 256, 257]:
        A = rng.uniform(-1, 1, (2, n, S, S))
        b = rng.normal(size=(2, n, S))
        init = rng.normal(size=(2, S))
        np.testing.assert_allclose(run_plan(make_plan(strategy, n), A, b, init),
                                   scan(A, b, init), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("strategy", ["blelloch", "kogge_stone", "warp_shuffle"])
def test_plans_over_an_affine_form_equal_reference(case, strategy):
    rec = ex.Recurrence.parse(case.text)
    f = ex.decompose(rec)
    for L in (1, 7, 16, 45):
        arrs = case.inputs((2,), L, N=3)
        from explorer.groundtruth import arg_specs
        from explorer.runtime.shapes import canonical_views

        views, batch, N, _ = canonical_views(arg_specs(rec), arrs)
        N = N if rec.vector else 1
        A, b = f.coefficients(views, (*batch, N, L))
        A = np.moveaxis(A, -1, -3)  # (..., L, S, S)
        b = np.moveaxis(b, -1, -2)
        states = run_plan(make_plan(strategy, L), A, b)
        want = ex.reference(rec, **arrs)
        h = states[..., f.component_index(rec.states[0])]
        h = h if rec.vector else h[..., 0, :]
        ref = want[rec.states[0]] if isinstance(want, dict) else want
        np.testing.assert_allclose(h, ref, rtol=1e-9, atol=1e-9)


def test_dot_picture_shows_levels_and_phases():
    p = make_plan("blelloch", 8)
    dot = p.to_dot()
    assert "work=14" in dot and "depth=6" in dot
    assert "#1a73e8" in dot and "#e8710a" in dot  # up-sweep and down-sweep colours
    assert dot.count("rank=same") == p.depth + 1
    hot = p.to_dot(highlight_level=2)
    assert hot != dot and "penwidth=2.4" in hot
    with pytest.raises(ValueError):
        make_plan("blelloch", 128).to_dot()


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot binary is not installed")
def test_dot_renders_to_svg():
    svg = subprocess.run(["dot", "-Tsvg"], input=make_plan("blelloch", 16).to_dot(),
                         capture_output=True, text=True, check=True).stdout
    assert "<svg" in svg and svg.count("<g id=\"node") > 16


def test_unknown_strategy():
    with pytest.raises(ValueError, match="unknown scan strategy"):
        make_plan("bogus", 8)
