"""A Blelloch tree's levels inside a warp trade their values by shuffles on the GPU
(``scan.sweep {via = "shuffle"}``, option ``warp_sweeps``): which levels the plan marks, what
the look-back block keeps, what the host runs, and recorded plans from elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402
from explorer.errors import OptionError  # noqa: E402
from explorer.passes.plan import plan_from_dict  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


@pytest.fixture(autouse=True)
def _own_cache(private_cache: None) -> None:
    """Compiles of these tests' own: nothing they tamper with reaches another test."""


def _vias(sweeps: tuple) -> list[tuple[str, int, str]]:
    return [(sw.phase, sw.stride, sw.via) for sw in sweeps]


def test_the_gpu_plan_shuffles_the_levels_inside_a_warp_and_nothing_else():
    c = ex.compile(AFFINE, target="cuda", block_size=128, elements_per_thread=8,
                   grid="lookback")
    plan = c.scan_plan
    for phase, stride, via in _vias(plan.sweeps):
        # a level's pairs lie inside one warp exactly when 2 * stride <= 32
        assert via == ("shuffle" if 2 * stride <= 32 else "shared"), (phase, stride, via)
    assert plan.shuffled and [sw.stride for sw in plan.sweeps if sw.via == "shared"] == \
        [32, 64, 32]
    # the IR of the plan says so, one scan.sweep a level
    text = c.stages["scan-plan"].text
    assert text.count('via = "shuffle"') == 10 and text.count('via = "shared"') == 3
    # the look-back block keeps its levels in shared memory (measured faster so)
    assert {sw.via for sw in plan.lookback.sweeps(plan.tree)} == {"shared"}
    # the plain kernel shuffles; the PTX has the shuffles up and down
    assert "gpu.shuffle  up" in c.stages["scan-lower"].text
    assert "shfl.sync.up" in c.ptx and "shfl.sync.down" in c.ptx
    # switched off, no kernel trades a tree level by shuffles (the look-back walk's own
    # butterfly reduction stays)
    off = ex.compile(AFFINE, target="cuda", grid="lookback", warp_sweeps="shared").ptx
    assert "shfl.sync.up" not in off and "shfl.sync.down" not in off


def test_the_option_switches_it_off_and_other_trees_and_the_host_never_shuffle():
    off = ex.compile(AFFINE, target="cuda", warp_sweeps="shared").scan_plan
    assert not off.shuffled
    assert not ex.compile(AFFINE, target="cpu").scan_plan.shuffled
    for strategy in ("kogge_stone", "warp_shuffle"):
        plan = ex.compile(AFFINE, target="cuda", strategy=strategy).scan_plan
        assert {sw.via for sw in plan.sweeps} == {"shared"}
    with pytest.raises(OptionError, match="warp_sweeps 'shuffle'"):
        ex.compile(AFFINE, strategy="kogge_stone", warp_sweeps="shuffle")
    for bad in ("registers", 1, None):
        with pytest.raises(OptionError, match="warp_sweeps"):
            ex.compile(AFFINE, warp_sweeps=bad)


def test_the_host_runs_a_shuffled_plan_against_the_reference():
    """On the CPU target the levels marked ``shuffle`` run as the same levels in shared memory:
    a one-warp block (its root inside the warp) and a block of several warps, a look-back
    grid and a chunked one (whose reduce kernel stops after the up-sweep)."""
    import numpy as np

    rng = np.random.default_rng(5)
    a = rng.uniform(0.8, 1.0, (3, 700)).astype(np.float32)
    b = rng.standard_normal((3, 700)).astype(np.float32)
    ref = ex.reference(AFFINE, a=a, b=b)
    for block, grid in ((32, "chunked"), (64, "lookback"), (128, "chunked")):
        c = ex.compile(AFFINE, target="cpu", warp_sweeps="shuffle", block_size=block,
                       elements_per_thread=2, chunk_tiles=1, grid=grid)
        assert c.scan_plan.shuffled
        got = c(a=a, b=b)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()))


def test_recorded_sweeps_are_checked():
    """A plan recorded before ``via`` keeps its levels in shared memory (as its kernels were
    built); a ``via`` the lowering does not implement, or shuffles where the tree has none, is
    refused."""
    plan = ex.compile(AFFINE, target="cuda", block_size=64).scan_plan
    raw = dataclasses.asdict(plan)
    old = dataclasses.asdict(plan)
    for sw in old["sweeps"]:
        del sw["via"]
    assert not plan_from_dict(old).shuffled
    assert plan_from_dict(raw) == plan
    for tamper in ("sideways", "shared"):
        bad = dataclasses.asdict(plan)
        bad["sweeps"][0]["via"] = tamper     # one level alone changed
        with pytest.raises(ValueError, match="sweeps"):
            plan_from_dict(bad)
    ks = dataclasses.asdict(ex.compile(AFFINE, target="cuda", strategy="kogge_stone").scan_plan)
    ks["sweeps"][0]["via"] = "shuffle"
    with pytest.raises(ValueError, match="sweeps|shuffles"):
        plan_from_dict(ks)
