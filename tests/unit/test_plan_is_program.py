"""The plan the explorer draws is the plan the kernels run: both are read from the scan-plan
pass's IR, every tree compiles and runs (checked against float64), and changing the tree
changes the IR, the picture and the kernel together."""

from __future__ import annotations

import numpy as np
import pytest

import explorer as ex
from explorer.passes.plans import make_plan, run_plan

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
TREES = ("blelloch", "kogge_stone", "warp_shuffle")


def _inputs(text: str, C: int, L: int, N: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rec = ex.Recurrence.parse(text)
    rng = np.random.default_rng(seed)
    out = {}
    for n in rec.inputs:
        shape = (C, N, L) if n in rec.lane_names else (C, L)
        out[n] = rng.uniform(0.5, 0.99, shape).astype(np.float32)
    for n in rec.params:
        shape = (C, N) if n in rec.lane_names else (C,)
        out[n] = (-rng.uniform(0.1, 1.0, shape) if n in rec.lane_names
                  else rng.uniform(0.1, 1.0, shape)).astype(np.float32)
    return out


@pytest.mark.parametrize("grid", ["lookback", "chunked"])
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("preset", sorted(ex.PRESETS))
def test_every_tree_runs_every_preset_cut_into_tiles_on_the_cpu(tree, preset, grid):
    """11 tiles a sequence; the look-back examines 4 tiles per round trip (on the host, one
    lane), so it walks several windows and finds the prefix inside one."""
    from explorer.runtime.contract import choose_time_chunk
    from explorer.runtime.cpu import CPU_MACHINE

    text = ex.PRESETS[preset]
    # two sequences of 700 steps, 32 x 2 tiles: one tile a block (look-back) or chunks of one
    # tile (reduce, carry, rescan)
    c = ex.compile(text, target="cpu", strategy=tree, block_size=32, elements_per_thread=2,
                   chunk_tiles=1, grid=grid, lookback_tiles=4, lookback_elements=2)
    assert c.scan_plan.grid.scheme == grid
    rule = c.contract[0].args[-1].chunk_rule
    assert rule is not None and choose_time_chunk(rule, 2, 4, 700, CPU_MACHINE) == 64
    arrays = _inputs(text, 2, 700)
    out, ref = c(**arrays), ex.reference(text, **arrays)
    # the outputs the compile stores (the readouts alone when there are some)
    outs = out if isinstance(out, dict) else {c.outputs[0]: out}
    refs = ref if isinstance(ref, dict) else {c.outputs[0]: ref}
    assert tuple(outs) == c.outputs
    for name, value in outs.items():
        scale = np.abs(refs[name]).max() + 1e-6
        assert np.abs(value - refs[name]).max() / scale < 1e-5, (preset, tree, name)


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("threads", [32, 128])
def test_the_picture_is_drawn_from_the_ir(tree, threads):
    c = ex.compile(AFFINE, target="cuda", strategy=tree, block_size=threads)
    plan = c.scan_plan
    # the sweeps were read back from the scan-plan pass's ops
    ir = c.stages["scan-plan"].text
    assert ir.count('"scan.sweep"') == len(plan.sweeps)
    for sw in plan.sweeps:
        assert f'phase = "{sw.phase}", stride = {sw.stride} : i64' in ir
    # the block tree over all the threads is the tree of that algorithm, and it scans
    full = c.plan
    assert full.n == threads and full.levels == make_plan(tree, threads).levels
    rng = np.random.default_rng(1)
    A = rng.uniform(0.5, 1.0, (threads, 1, 1))
    b = rng.standard_normal((threads, 1))
    expect = np.zeros((threads, 1))
    h = np.zeros(1)
    for t in range(threads):
        h = A[t, 0, 0] * h + b[t]
        expect[t] = h
    np.testing.assert_allclose(run_plan(full, A, b), expect, rtol=1e-12)
    assert "digraph" in (c.stages["plan"].dot or "")


def test_changing_the_tree_changes_ir_picture_and_kernel():
    ble = ex.compile(AFFINE, target="cuda", strategy="blelloch", block_size=64)
    ks = ex.compile(AFFINE, target="cuda", strategy="kogge_stone", block_size=64)
    assert '"up_root"' in ble.stages["scan-plan"].text
    assert '"up_root"' not in ks.stages["scan-plan"].text
    assert ble.stages["plan"].dot != ks.stages["plan"].dot
    # one barrier per sweep in the scan kernel: Blelloch 2 log2 B - 1 sweeps, Kogge-Stone
    # log2 B (each with a barrier between its reads and writes)
    assert ble.scan_plan.sweeps != ks.scan_plan.sweeps
    assert ble.ptx != ks.ptx
    assert "scanweaver_kogge_stone" in (ks.ptx or "")


def test_a_record_keeps_the_plan_it_ran(tmp_path):
    from explorer.compiler import load_compiled

    c = ex.compile(AFFINE, target="cuda", strategy="kogge_stone", block_size=64)
    back = load_compiled(c.dump(tmp_path / "ks.json.gz"))
    assert back.scan_plan == c.scan_plan and back.plan.levels == c.plan.levels


@pytest.mark.parametrize("grid", ["chunked", "lookback"])
@pytest.mark.parametrize("block_size", [64, 128])
def test_warp_shuffle_tree_joins_its_warps_on_the_cpu(grid, block_size):
    """Blocks of two and four warps: the shuffle levels inside each warp, then the join of the
    warps (scan.sweep {phase = "warps"}), over odd lengths, tails and many tiles."""
    c = ex.compile(AFFINE, target="cpu", strategy="warp_shuffle", block_size=block_size,
                   elements_per_thread=2, chunk_tiles=1, grid=grid)
    phases = [sw.phase for sw in c.scan_plan.sweeps]
    assert phases == ["shuffle"] * 5 + ["warps"]
    assert c.scan_plan.sweeps[-1].active == block_size // 32
    if grid == "lookback":   # "auto": twice the plain kernel's elements for a scalar state
        assert c.scan_plan.lookback.elements == 4
        assert c.scan_plan.grid.tile == block_size * 4
    for C, L in ((3, 1000), (1, 5000), (2, 37)):
        arrays = _inputs(AFFINE, C, L, seed=L)
        out, ref = c(**arrays), ex.reference(AFFINE, **arrays)
        assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5, (C, L)


def test_the_warp_shuffle_tree_trades_values_by_shuffles():
    """Its shuffle levels become ``shfl.sync.up`` in the PTX and leave the tree's shared-memory
    barriers out: the scan kernel has fewer barriers than the Blelloch tree's."""
    ws = ex.compile(AFFINE, target="cuda", strategy="warp_shuffle", block_size=128)
    ble = ex.compile(AFFINE, target="cuda", strategy="blelloch", block_size=128,
                     warp_sweeps="shared")
    assert "shfl.sync.up" in (ws.ptx or "") and "shfl.sync.up" not in (ble.ptx or "")
    assert (ws.ptx or "").count("bar.sync") < (ble.ptx or "").count("bar.sync")
    assert ws.plan.levels == make_plan("warp_shuffle", 128).levels
