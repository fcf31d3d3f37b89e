"""The look-back grid's part of the kernel contract: its flags are a workspace the launcher
zeroes before every launch, and its chunks are one tile or the whole sequence (a forced chunk
in between is refused, never run wrong). Manifest fields of it from elsewhere are checked."""

from __future__ import annotations

import copy

import pytest

from explorer.runtime.contract import ArtifactError, ChunkRule, Machine, parse_kernels

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


@pytest.fixture(autouse=True)
def _own_cache(private_cache: None) -> None:
    """Compiles of these tests' own: nothing they tamper with reaches another test."""


def _kernels(grid: str) -> list[dict]:
    # a copy: the tests below tamper with it (the plain and look-back kernels alone: the short
    # kernel's part is tests/unit/test_short_tile.py's)
    return copy.deepcopy(ex.compile(AFFINE, target="cuda", strategy="blelloch", grid=grid,
                                    short_tile="none").kernels)


def test_one_kernel_runs_a_call_and_the_lookback_flags_are_reset_before_each_launch():
    whole, tiles = parse_kernels([dict(k, ptx="kernel.ptx") for k in _kernels("lookback")])
    assert tiles.name.endswith("_lookback")
    reset = [a.name for a in tiles.args if a.reset]
    assert reset == ["tile_flags"]
    # the plain kernel takes the flags too (one signature) but never reads them: a call that
    # runs only whole sequences clears nothing
    assert "tile_flags" in [a.name for a in whole.args]
    assert not any(a.reset for a in whole.args)
    rule = next(a.chunk_rule for a in tiles.args if a.chunk_rule is not None)
    assert rule.max_tiles == 1 and rule.min_tiles == 1
    # whole sequences (L <= time_chunk): the plain scan kernel; cut into tiles: the look-back
    for L, chunk in ((1000, 1024), (4096, 4096), (4097, 1024)):
        sizes = {"time_chunk": chunk}
        assert [whole.launched(L, sizes), tiles.launched(L, sizes)] == [L <= chunk, L > chunk]
    chunked = parse_kernels([dict(k, ptx="kernel.ptx") for k in _kernels("chunked")])
    assert [k.name.rsplit("_", 1)[-1] for k in chunked] == ["reduce", "carry", "blelloch"]
    assert not any(a.reset for k in chunked for a in k.args)


def test_lookback_chunks_are_one_tile_or_the_whole_sequence():
    rule = ChunkRule(tile=1024, min_tiles=1, fill=2.0, unchunked_from=1.0, max_tiles=1)
    machine = Machine(132, 16)
    assert rule.choose(1, 1, 2**26, machine) == 1024
    assert rule.choose(1, 1, 1000, machine) == 1024
    assert rule.choose(4096, 1, 2**20, machine) == 2**20        # enough sequences: whole
    rule.check(1024, 2**20)
    rule.check(512, 2**20)
    rule.check(2**20, 2**20)
    with pytest.raises(ValueError, match="at most 1024 steps"):
        rule.check(3 * 1024, 2**20)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("launch_unless_longer_than", "L", "must be a non-negative integer or 'time_chunk'"),
    ("launch_unless_longer_than", -3, "must be a non-negative integer or 'time_chunk'"),
    ("reset", "yes", "reset must be true or false"),
    ("max_tiles", -1, "max_tiles must be a positive integer"),
    ("max_tiles", 1.5, "max_tiles must be a positive integer"),
    ("max_tiles", True, "max_tiles must be a positive integer"),
])
def test_tampered_lookback_fields_are_refused(field, value, match):
    kernels = [dict(k, ptx="kernel.ptx") for k in _kernels("lookback")]
    args = kernels[1]["args"]
    if field == "launch_unless_longer_than":
        kernels[0][field] = value
    elif field == "reset":
        next(a for a in args if a.get("reset"))["reset"] = value
    else:
        next(a for a in args if "chunk_rule" in a)["chunk_rule"]["max_tiles"] = value
    with pytest.raises(ArtifactError, match=match):
        parse_kernels(kernels)


def test_reset_is_for_workspaces_and_outputs_added_into_only():
    import copy

    base = [dict(k, ptx="kernel.ptx") for k in _kernels("lookback")]
    kernels = copy.deepcopy(base)
    next(a for a in kernels[1]["args"] if a["role"] == "input")["reset"] = True
    with pytest.raises(ArtifactError, match="is reset but is neither a workspace nor an output"):
        parse_kernels(kernels)
    # an output added into (a lane readout; untimed, a fused backward's parameter gradient) is
    # zeroed: float32 only
    kernels = copy.deepcopy(base)
    out = next(a for a in kernels[1]["args"] if a["role"] == "output")
    out["reset"] = True
    parsed = parse_kernels(kernels)
    assert next(a for a in parsed[1].args if a.name == out["name"]).reset
    out["timed"] = False
    parsed = parse_kernels(kernels)
    assert next(a for a in parsed[1].args if a.name == out["name"]).reset
    out["dtype"] = "bfloat16"
    with pytest.raises(ArtifactError, match="is reset .added into. but is not a float32"):
        parse_kernels(kernels)


@pytest.mark.parametrize("bad", [0, 3, 64, True, "many", 2.0, None])
def test_bad_lookback_elements_are_refused(bad: object) -> None:
    from explorer.codegen.options import validate
    from explorer.errors import OptionError

    with pytest.raises(OptionError, match="lookback_elements"):
        validate(lookback_elements=bad)
    with pytest.raises(OptionError, match="lookback_elements 2 is less than vector_width 4"):
        validate(lookback_elements=2, vector_width=4)


def test_the_lookback_kernel_has_a_tile_of_its_own():
    """Whole sequences run the plain kernel's 128 threads by 8 elements, tiles the look-back
    kernel's 256 threads by 16 (``lookback_threads="auto"`` on the GPU): the contract's chunk
    rule, the kernels' launch geometry and their shared memory follow each."""
    # the tile left open: 64 x 16 whole, the same look-back tile
    auto = ex.compile(AFFINE, target="cuda", strategy="blelloch", grid="lookback").scan_plan
    assert (auto.threads, auto.elements, auto.lookback.threads, auto.lookback.elements) == \
        (64, 16, 256, 16)
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch", grid="lookback", block_size=128)
    assert c.scan_plan.elements == 8 and c.scan_plan.lookback.elements == 16
    assert c.scan_plan.threads == 128 and c.scan_plan.lookback.threads == 256
    whole, tiles = parse_kernels([dict(k, ptx="kernel.ptx") for k in c.kernels])
    rule = next(a.chunk_rule for a in tiles.args if a.chunk_rule is not None)
    assert rule.tile == 256 * 16
    assert tuple(whole.block) == (128, 1, 1) and tuple(tiles.block) == (256, 1, 1)
    # the look-back kernel's stage holds 4096 floats a buffer (packed: unpadded; staged:
    # padded), the plain one's 1024 (padded); its tree's aggregates 256 (padded, two slots)
    module = c.stages["scan-lower"].text
    assert c.scan_plan.lookback.layout == "packed"
    assert "memref<4096xf32, #gpu.address_space<workgroup>>" in module
    assert "memref<266xf32, #gpu.address_space<workgroup>>" in module
    assert "memref<1056xf32, #gpu.address_space<workgroup>>" in module
    staged = ex.compile(AFFINE, target="cuda", strategy="blelloch", grid="lookback",
                        block_size=128, lookback_layout="staged").stages["scan-lower"].text
    assert "memref<4224xf32, #gpu.address_space<workgroup>>" in staged


def test_lookback_threads_are_the_lookback_blocks_own():
    """``lookback_threads`` sizes the look-back block alone (its tree, tile and launch); the
    plain kernel keeps ``block_size``. "auto" keeps ``block_size`` on the CPU and for tiles of
    other than 16 elements a thread; an option out of range is refused."""
    import numpy as np

    from explorer.errors import OptionError

    small = {"block_size": 32, "elements_per_thread": 2, "lookback_elements": 4}
    for target in ("cpu", "cuda"):
        c = ex.compile(AFFINE, target=target, grid="lookback", **small)
        assert c.scan_plan.lookback.threads == 32 and c.scan_plan.grid.tile == 128
    c = ex.compile(AFFINE, target="cpu", grid="lookback", lookback_threads=64, **small)
    plan = c.scan_plan
    assert (plan.threads, plan.lookback.threads, plan.grid.tile) == (32, 64, 256)
    assert plan.lookback.sweeps(plan.tree)[-1].active == 32   # the last down-sweep level
    # a sequence of several look-back tiles and a part of one, against the float64 reference
    rng = np.random.default_rng(3)
    a = rng.uniform(0.8, 1.0, (2, 1000)).astype(np.float32)
    b = rng.standard_normal((2, 1000)).astype(np.float32)
    got = c(a=a, b=b)
    ref = ex.reference(AFFINE, a=a, b=b)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()))
    cuda = ex.compile(AFFINE, target="cuda", grid="lookback", lookback_threads=64, **small)
    assert [tuple(k["block"]) for k in cuda.kernels] == [(32, 1, 1), (64, 1, 1)]
    for bad in (16, 48, 2048, "many", True):
        with pytest.raises(OptionError, match="lookback_threads"):
            ex.compile(AFFINE, target="cuda", grid="lookback", lookback_threads=bad)


def test_a_recorded_plan_without_lookback_threads_takes_the_blocks():
    """A plan recorded before the look-back block had threads of its own says none: its
    look-back block is the plain block, as its kernels were built; a tampered count is
    refused."""
    import dataclasses

    from explorer.passes.plan import plan_from_dict

    c = ex.compile(AFFINE, target="cuda", grid="lookback", lookback_threads=128, block_size=128)
    raw = dataclasses.asdict(c.scan_plan)     # what a compiled record keeps
    del raw["lookback"]["threads"]
    assert plan_from_dict(raw).lookback.threads == 128
    raw["lookback"]["threads"] = 48
    with pytest.raises(ValueError, match="look-back block of 48 threads"):
        plan_from_dict(raw)
