"""The look-back kernel's packed stage (``scan.lookback {layout = "packed"}``): its inputs staged
as they are in memory and read back in 16-byte vectors, on the host against the staged tile
and the float64 reference; the option and the plan's checks."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import explorer as ex
from explorer.bench.affine import affine_scan_f64, max_rel_error, tolerance
from explorer.codegen.options import LOOKBACK_LAYOUTS
from explorer.codegen.residency import LOOKBACK_THREADS_PER_SM_COPIED
from explorer.errors import CompileError, OptionError
from explorer.passes.plan import plan_from_dict
from explorer.passes.plan_options import COPIED_LOOKBACK_TILE, PACKED_LOOKBACK_TILE
from explorer.runtime.dtypes import from_storage, to_storage

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
#: lengths: a tile (128 x 16 = 2048 steps), ragged tails, several tiles
LENGTHS = (2048, 2049, 4113, 3 * 2048, 1 << 14)


def _inputs(rng: np.random.Generator, C: int, L: int) -> dict[str, np.ndarray]:
    return {"a": rng.uniform(0.9, 1.0, (C, L)).astype(np.float32),
            "b": rng.uniform(-0.5, 0.5, (C, L)).astype(np.float32)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_host_runs_a_packed_lookback_tile_as_the_staged_one(dtype: str):
    """The same kernels but for the stage: equal outputs bit for bit, and near the float64
    reference (of the inputs as the dtype holds them)."""
    packed = ex.compile(AFFINE, target="cpu", dtype=dtype, grid="lookback",
                        lookback_layout="packed")
    staged = ex.compile(AFFINE, target="cpu", dtype=dtype, grid="lookback",
                        lookback_layout="staged")
    assert packed.scan_plan.lookback.layout == "packed"
    assert staged.scan_plan.lookback.layout == "staged"
    assert "vector.bitcast" in packed.stages["scan-lower"].text or dtype == "float32"
    rng = np.random.default_rng(7)
    for L in LENGTHS:
        x = _inputs(rng, 3, L)
        got = np.asarray(packed(**x), dtype=np.float64)
        np.testing.assert_array_equal(got, np.asarray(staged(**x), dtype=np.float64))
        held = {k: from_storage(to_storage(k, v, dtype), dtype) for k, v in x.items()}
        assert max_rel_error(got, affine_scan_f64(held["a"], held["b"])) <= tolerance(dtype)


def test_float32_outputs_of_16_bit_inputs_keep_a_float32_output_stage():
    """``out_dtype="float32"``: the outputs are not the inputs' dtype, so they leave through
    float32 scalars (not rounded to 16 bits on the way), the inputs still packed."""
    kw = dict(target="cpu", dtype="bfloat16", out_dtype="float32", grid="lookback")
    packed = ex.compile(AFFINE, lookback_layout="packed", **kw)
    staged = ex.compile(AFFINE, lookback_layout="staged", **kw)
    x = _inputs(np.random.default_rng(5), 3, 4113)
    got = np.asarray(packed(**x))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.asarray(staged(**x)))
    held = {k: from_storage(to_storage(k, v, "bfloat16"), "bfloat16") for k, v in x.items()}
    assert max_rel_error(got, affine_scan_f64(held["a"], held["b"])) <= 1e-5


def test_a_packed_tile_backwards_in_time():
    """A reverse scan reads its rows from the end: the packed stage holds them as loaded."""
    kw = dict(target="cpu", grid="lookback", reverse=True)
    packed = ex.compile(AFFINE, lookback_layout="packed", **kw)
    staged = ex.compile(AFFINE, lookback_layout="staged", **kw)
    x = _inputs(np.random.default_rng(3), 2, 5000)
    np.testing.assert_array_equal(np.asarray(packed(**x)), np.asarray(staged(**x)))


def test_16_bit_gpu_plans_pack_the_lookback_stage_and_the_option_overrides():
    for dtype in ("bfloat16", "float16"):
        look = ex.compile(AFFINE, target="cuda", dtype=dtype).scan_plan.lookback
        assert (look.layout, look.threads, look.elements) == ("packed", *PACKED_LOOKBACK_TILE)
        given = ex.compile(AFFINE, target="cuda", dtype=dtype, lookback_layout="staged")
        # staged, the tile is the one measured for the stage before (same steps a tile)
        assert (given.scan_plan.lookback.layout, given.scan_plan.lookback.threads,
                given.scan_plan.lookback.elements) == ("staged", 256, 16)
        assert given.scan_plan.grid.tile == look.threads * look.elements
        assert given.scan_plan.layout == "direct"   # the plain kernel's own choice stays
        # a tile given is kept
        mine = ex.compile(AFFINE, target="cuda", dtype=dtype, lookback_threads=256)
        assert (mine.scan_plan.lookback.threads, mine.scan_plan.lookback.elements) == (256, 16)
    # float32 too: packed, reached by asynchronous copies; staged when asked, or backwards
    f32 = ex.compile(AFFINE, target="cuda").scan_plan
    assert (f32.lookback.layout, f32.lookback.threads, f32.lookback.elements) == (
        "packed", *COPIED_LOOKBACK_TILE)
    assert f32.grid.tile == COPIED_LOOKBACK_TILE[0] * COPIED_LOOKBACK_TILE[1]
    staged = ex.compile(AFFINE, target="cuda", lookback_layout="staged").scan_plan.lookback
    assert (staged.layout, staged.threads, staged.elements) == ("staged", 256, 16)
    assert ex.compile(AFFINE, target="cuda", reverse=True).scan_plan.lookback.layout == "staged"
    assert ex.compile(AFFINE, target="cuda", tile_layout="staged").scan_plan.lookback.layout \
        == "staged"
    # the packed kernel's PTX reads its stage in 16-byte vectors
    ptx = ex.compile(AFFINE, target="cuda", dtype="bfloat16").ptx
    look = ptx[ptx.index(".entry scanweaver_blelloch_lookback"):]
    assert "ld.shared.v4" in look


def _lookback_ptx(c) -> str:
    ptx = c.ptx
    return ptx[ptx.index(".entry scanweaver_blelloch_lookback"):]


def test_a_float32_packed_tile_reaches_its_stage_by_asynchronous_copies():
    """16 bytes a copy, ``cp.async.cg`` (no register, no L1 on the way), every copy waited for
    before the barrier; the kernel asks for LOOKBACK_THREADS_PER_SM_COPIED resident threads.
    The staged tile and the 16-bit packed one (a stage of 32-bit words) load through
    registers."""
    look = _lookback_ptx(ex.compile(AFFINE, target="cuda"))
    B, E = COPIED_LOOKBACK_TILE
    # two inputs, E / 4 vectors of each a thread
    assert look.count("cp.async.cg.shared.global") == 2 * E // 4
    assert look.index("cp.async.wait_group") < look.index("bar.sync")
    assert f".minnctapersm {LOOKBACK_THREADS_PER_SM_COPIED // B}" in look
    for kw in ({"lookback_layout": "staged"}, {"dtype": "bfloat16"}, {"reverse": True}):
        assert "cp.async" not in _lookback_ptx(ex.compile(AFFINE, target="cuda", **kw)), kw
    # cp.async came with sm_80: an older chip keeps the staged tile, or loads a packed one
    # through registers when it is asked for
    old = ex.compile(AFFINE, target="cuda", chip="sm_75")
    assert old.scan_plan.lookback.layout == "staged" and "cp.async" not in old.ptx
    asked = ex.compile(AFFINE, target="cuda", chip="sm_75", lookback_layout="packed")
    assert asked.scan_plan.lookback.layout == "packed" and "cp.async" not in asked.ptx
    assert "cp.async.cg" in ex.compile(AFFINE, target="cuda", chip="sm_80").ptx


def test_packed_outputs_share_the_inputs_stage_when_they_fit():
    """float32 outputs of float32 inputs, no more of them than inputs: through the inputs'
    buffers (the float32 look-back kernel's stage is its inputs' alone); more outputs, or
    16-bit ones: buffers of their own. On the host, bit for bit the staged tile's."""
    def counts(text: str, **kw) -> int:
        """The look-back kernel's stage buffers (its workgroup arrays of a whole tile)."""
        c = ex.compile(text, target="cuda", **kw)
        tile = c.scan_plan.grid.tile
        sizes = re.findall(r"__wg_scanweaver_blelloch_lookback_\d+\[(\d+)\]", c.ptx)
        return sum(int(n) >= 2 * tile for n in sizes)
    assert counts(AFFINE) == 2
    assert counts(AFFINE, dtype="bfloat16") == 3
    assert counts(AFFINE, dtype="bfloat16", out_dtype="float32") == 3
    rng = np.random.default_rng(11)
    x = _inputs(rng, 2, 4113)
    for text, n in ((AFFINE + "\ny[t] = 2 * h[t]", 2),
                    (AFFINE + "\ny[t] = 2 * h[t]\nz[t] = 3 * h[t]", 5)):
        kw = dict(target="cpu", grid="lookback", outputs="all")
        packed = ex.compile(text, lookback_layout="packed", **kw)
        staged = ex.compile(text, lookback_layout="staged", **kw)
        assert counts(text, lookback_layout="packed", outputs="all") == n
        got, want = packed(**x), staged(**x)
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))


def test_the_option_is_checked():
    assert LOOKBACK_LAYOUTS == ("auto", "staged", "direct", "packed")
    with pytest.raises(OptionError, match="unknown lookback_layout"):
        ex.compile(AFFINE, target="cpu", lookback_layout="vectors")
    with pytest.raises(OptionError, match="GPU's threads"):
        ex.compile(AFFINE, target="cpu", lookback_layout="direct")
    with pytest.raises(OptionError, match="sequential plan has none"):
        ex.compile(AFFINE, target="cpu", strategy="sequential", lookback_layout="packed")
    with pytest.raises(OptionError, match="leave vector_width 'auto'"):
        ex.compile(AFFINE, target="cpu", lookback_layout="packed", vector_width=2)
    # a packed tile moves 16-byte vectors: loads of 4 bfloat16 elements are 8 bytes
    with pytest.raises(CompileError, match="16-byte vectors"):
        ex.compile(AFFINE, target="cpu", dtype="bfloat16", grid="lookback",
                   lookback_layout="packed", block_size=128, elements_per_thread=4)
    # where packing cannot be, the automatic layout stages (16-bit inputs on the GPU)
    for kw in (dict(vector_width=1), dict(block_size=128, elements_per_thread=4),
               dict(read_offsets={"a": 1})):
        look = ex.compile(AFFINE, target="cuda", dtype="float16", **kw).scan_plan.lookback
        assert look.layout == "staged", kw


def test_recorded_packed_lookbacks_are_checked():
    plan = ex.compile(AFFINE, target="cuda", dtype="bfloat16").scan_plan
    assert plan_from_dict(dataclasses.asdict(plan)) == plan
    # a packed tile moves no input read at an offset
    bad = dataclasses.asdict(plan)
    bad["reads"] = [["a", 1]]
    with pytest.raises(ValueError, match="packed look-back tile"):
        plan_from_dict(bad)
    # packed is the look-back kernel's alone
    short = dataclasses.asdict(plan)
    short["short"]["layout"] = "packed"
    with pytest.raises(ValueError, match="short kernel's tiles"):
        plan_from_dict(short)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_packed_tile_that_streams_no_output(dtype: str):
    """``outputs=["h_last"]``: the tile stores no output stream (the last state only), so a
    packed stage has no output buffers; it compiles for the GPU and runs on the host as the
    staged tile does."""
    look = ex.compile(AFFINE, target="cuda", dtype=dtype, outputs=["h_last"]).scan_plan.lookback
    assert look.layout == "packed"
    kw = dict(target="cpu", dtype=dtype, grid="lookback", outputs=["h_last"])
    packed = ex.compile(AFFINE, lookback_layout="packed", **kw)
    staged = ex.compile(AFFINE, lookback_layout="staged", **kw)
    x = _inputs(np.random.default_rng(13), 3, 4113)
    np.testing.assert_array_equal(np.asarray(packed(**x)), np.asarray(staged(**x)))
