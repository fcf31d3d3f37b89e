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
    # a copy: the tests below tamper with it
    return copy.deepcopy(ex.compile(AFFINE, target="cuda", strategy="blelloch",
                                    grid=grid).kernels)


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
    # an output added into (a lane readout) is zeroed: float32 and timed only
    kernels = copy.deepcopy(base)
    out = next(a for a in kernels[1]["args"] if a["role"] == "output")
    out["reset"] = True
    parsed = parse_kernels(kernels)
    assert next(a for a in parsed[1].args if a.name == out["name"]).reset
    out["dtype"] = "bfloat16"
    with pytest.raises(ArtifactError, match="is reset .added into. but is not a timed float32"):
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
    """Whole sequences run the plain kernel's 8 elements a thread, tiles the look-back kernel's
    16: the contract's chunk rule and the kernels' shared memory follow each."""
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch", grid="lookback")
    assert c.scan_plan.elements == 8 and c.scan_plan.lookback.elements == 16
    whole, tiles = parse_kernels([dict(k, ptx="kernel.ptx") for k in c.kernels])
    rule = next(a.chunk_rule for a in tiles.args if a.chunk_rule is not None)
    assert rule.tile == 128 * 16
    # the look-back kernel's stage holds 2048 floats (padded) a buffer, the plain one's 1024
    module = c.stages["scan-lower"].text
    assert "memref<2112xf32, #gpu.address_space<workgroup>>" in module
    assert "memref<1056xf32, #gpu.address_space<workgroup>>" in module
