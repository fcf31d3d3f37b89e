"""Short sequences run whole in a kernel of their own (``scan.short``, option ``short_tile``):
which plans have it, how a call picks it, what the host runs, and recorded plans from
elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import numpy as np  # noqa: E402

import explorer as ex  # noqa: E402
from explorer.errors import OptionError  # noqa: E402
from explorer.passes.plan import Short, plan_from_dict  # noqa: E402
from explorer.runtime.contract import parse_kernels  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


@pytest.fixture(autouse=True)
def _own_cache(private_cache: None) -> None:
    """Compiles of these tests' own: nothing they tamper with reaches another test."""


def _launched(c: ex.Compiled, L: int, time_chunk: int) -> list[str]:
    kernels = parse_kernels([dict(k, ptx="kernel.ptx") for k in c.kernels])
    sizes = {"C": 1, "N": 1, "L": L, "time_chunk": time_chunk}
    return [k.name for k in kernels if k.launched(L, sizes)]


def test_the_open_scalar_tile_takes_a_short_kernel_and_a_call_launches_one_kernel():
    c = ex.compile(AFFINE, target="cuda")
    plan = c.scan_plan
    assert (plan.threads, plan.elements) == (64, 16)
    assert plan.short == Short(32, 16, 4096, "staged")
    # the plan says so as an op of its own, the widget's text and the compile's plan text too
    assert ('"scan.short"() {elements = 16 : i64, layout = "staged", longest = 4096 : i64, '
            'threads = 32 : i64}') in c.stages["scan-plan"].text
    assert "sequences of at most 4096 steps run whole in a kernel of their own" in \
        c.stages["plan"].text
    # its kernel: a block of 32 threads and a stage of 512 steps (padded), in the PTX
    assert "scanweaver_blelloch_short" in c.ptx
    short = next(k for k in c.kernels if k["name"].endswith("_short"))
    assert short["block"] == [32, 1, 1] and short["launch_unless_longer_than"] == 4096
    # a call launches the short kernel up to 4096 steps, the plain kernel past it (whole
    # sequences), the look-back kernel past the chunk
    assert _launched(c, 512, 4096) == ["scanweaver_blelloch_short"]
    assert _launched(c, 4096, 4096) == ["scanweaver_blelloch_short"]
    assert _launched(c, 4097, 8192) == ["scanweaver_blelloch"]
    assert _launched(c, 4097, 4096) == ["scanweaver_blelloch_lookback"]
    # the chunked grid: never beside its reduce and carry kernels
    chunked = ex.compile(AFFINE, target="cuda", grid="chunked")
    longest = chunked.scan_plan.short.longest
    assert longest <= chunked.scan_plan.grid.tile * chunked.scan_plan.grid.min_tiles
    assert _launched(chunked, longest, longest) == ["scanweaver_blelloch_short"]
    assert "scanweaver_blelloch_short" not in _launched(chunked, longest + 1, longest)


def test_other_plans_have_none_and_the_option_is_checked():
    assert ex.compile(AFFINE, target="cuda", short_tile="none").scan_plan.short is None
    # a tile given is the tile for every length; the host and vector states keep theirs
    assert ex.compile(AFFINE, target="cuda", block_size=64).scan_plan.short is None
    assert ex.compile(AFFINE, target="cpu").scan_plan.short is None
    assert ex.compile(ex.PRESETS["selective scan"], target="cuda").scan_plan.short is None
    # given, beside a given tile
    c = ex.compile(AFFINE, target="cuda", block_size=128, short_tile="64x8")
    assert c.scan_plan.short == Short(64, 8, 4096, "staged")
    for bad in ("32x32", "16x16", "48x16", "32x", "x16", "32x16x2", " 32x16", 32, None, True,
                "9" * 30 + "x16"):
        with pytest.raises(OptionError, match="short_tile"):
            ex.compile(AFFINE, short_tile=bad)
    with pytest.raises(OptionError, match="short_tile"):
        ex.compile(AFFINE, strategy="sequential", short_tile="32x16")
    # a plan that sums the lanes of a readout in its own kernels (the selective scan's y)
    with pytest.raises(OptionError, match="sums the lanes of y"):
        ex.compile(ex.PRESETS["selective scan"], target="cuda", short_tile="32x16")


def test_the_host_runs_a_short_kernel_of_a_vector_state():
    """A diagonal state of 3 lanes whose states are stored (no sum over the lanes): sequences
    up to the short kernel's longest and past it, against the reference."""
    rec = "h[t, n] = a[t, n] * h[t-1, n] + b[t, n]"
    c = ex.compile(rec, target="cpu", block_size=64, elements_per_thread=2, chunk_tiles=1,
                   grid="chunked", short_tile="32x2")
    assert c.scan_plan.short is not None and c.scan_plan.short.longest == 128
    rng = np.random.default_rng(3)
    for L in (5, 128, 129, 300):
        a = rng.uniform(0.8, 1.0, (2, 3, L)).astype(np.float32)
        b = rng.standard_normal((2, 3, L)).astype(np.float32)
        ref = ex.reference(rec, a=a, b=b)
        np.testing.assert_allclose(c(a=a, b=b), ref, rtol=0,
                                   atol=1e-4 * float(np.abs(ref).max()), err_msg=f"L={L}")


@pytest.mark.parametrize("grid", ["chunked", "lookback"])
def test_the_host_runs_the_short_kernel_and_the_others_against_the_reference(grid: str):
    """On the CPU target, a plan with a short kernel of 32 threads x 4 (its longest the grid's
    chunk of 256 steps): sequences up to it run there, longer ones in the grid's kernels."""
    rng = np.random.default_rng(11)
    c = ex.compile(AFFINE, target="cpu", block_size=64, elements_per_thread=4, chunk_tiles=1,
                   grid=grid, lookback_threads=64, lookback_elements=4, short_tile="32x4")
    short = c.scan_plan.short
    assert short is not None and short.longest == 256
    for L in (1, 127, 256, 257, 700):
        a = rng.uniform(0.8, 1.0, (3, L)).astype(np.float32)
        b = rng.standard_normal((3, L)).astype(np.float32)
        ref = ex.reference(AFFINE, a=a, b=b)
        np.testing.assert_allclose(c(a=a, b=b), ref, rtol=0,
                                   atol=1e-4 * float(np.abs(ref).max()), err_msg=f"L={L}")


def _kernel(lowered: str, name: str) -> str:
    """The text of one gpu.func of a lowered module."""
    start = lowered.index(f"gpu.func @{name}(")
    end = lowered.find("gpu.func @", start + 1)
    return lowered[start:end if end > 0 else len(lowered)]


def test_16_bit_inputs_take_direct_plain_and_short_tiles_and_a_packed_lookback():
    """bfloat16 and float16 tiles meet the plain and short kernels' threads direct and the
    look-back kernel's through a packed stage (each measured faster on an H200); float32
    stages the plain and short kernels' and packs the look-back kernel's (copied in
    asynchronously); a layout given is every kernel's."""
    for dtype in ("bfloat16", "float16"):
        c = ex.compile(AFFINE, target="cuda", dtype=dtype)
        plan = c.scan_plan
        assert (plan.layout, plan.short, plan.lookback.layout) == (
            "direct", Short(32, 16, 4096, "direct"), "packed")
        text = c.stages["plan"].text
        assert "its tiles direct" in text and "its tiles packed (its stage holds" in text
        lowered = c.stages["scan-lower"].text
        short, plain, look = (_kernel(lowered, f"scanweaver_blelloch{k}")
                              for k in ("_short", "", "_lookback"))
        # a direct tile never goes through the stage, so its block has fewer barriers
        assert short.count("gpu.barrier") < look.count("gpu.barrier")
        assert plain.count("gpu.barrier") < look.count("gpu.barrier")
    f32 = ex.compile(AFFINE, target="cuda").scan_plan
    assert (f32.layout, f32.short.layout, f32.lookback.layout) == ("staged", "staged", "packed")
    for layout in ("staged", "direct"):
        given = ex.compile(AFFINE, target="cuda", dtype="bfloat16", tile_layout=layout).scan_plan
        assert (given.layout, given.short.layout, given.lookback.layout) == (layout,) * 3
    # the rule is the affine scan's (a scalar first-order state): a state of two components
    # keeps its staged tiles in 16 bits
    pair = ex.compile("h[t] = a[t] * h[t-1] + b[t] * h[t-2] + x[t]", target="cuda",
                      dtype="bfloat16").scan_plan
    assert pair.layout == "staged"


def test_recorded_lookback_layouts_are_checked():
    plan = ex.compile(AFFINE, target="cuda", dtype="bfloat16").scan_plan
    assert plan_from_dict(dataclasses.asdict(plan)) == plan
    # a look-back recorded before it had a layout of its own: the plan's (as it was built)
    old = dataclasses.asdict(plan)
    del old["lookback"]["layout"]
    assert plan_from_dict(old).lookback.layout == plan.layout == "direct"
    for layout in ("diagonal", "", "staged " * 20):
        bad = dataclasses.asdict(plan)
        bad["lookback"]["layout"] = layout
        with pytest.raises(ValueError, match="look-back kernel's tiles"):
            plan_from_dict(bad)


def test_recorded_short_kernels_are_checked():
    plan = ex.compile(AFFINE, target="cuda").scan_plan
    raw = dataclasses.asdict(plan)
    assert plan_from_dict(raw) == plan
    # a plan recorded before the short kernel has none (as its kernels were built)
    old = dataclasses.asdict(plan)
    del old["short"]
    assert plan_from_dict(old).short is None
    # one recorded before its layout: the plan's
    old = dataclasses.asdict(plan)
    del old["short"]["layout"]
    assert plan_from_dict(old).short.layout == plan.layout
    tampered = [
        ({"threads": 48, "elements": 16, "longest": 4096}, "short kernel"),
        ({"threads": 32, "elements": 32, "longest": 4096}, "short kernel"),
        ({"threads": 32, "elements": 16, "longest": 4097}, "shortest chunk"),
        ({"threads": 32, "elements": 16, "longest": 0}, "shortest chunk"),
        ({"threads": 32, "elements": 16}, "lacks longest"),
        ({"threads": 32, "elements": 16, "longest": 64, "layout": "diagonal"}, "layout"),
        ("32x16", "JSON object"),
    ]
    for short, message in tampered:
        bad = dataclasses.asdict(plan)
        bad["short"] = short
        with pytest.raises((ValueError, TypeError), match=message):
            plan_from_dict(bad)
    seq = dataclasses.asdict(ex.compile(AFFINE, target="cuda", strategy="sequential").scan_plan)
    seq["short"] = {"threads": 32, "elements": 16, "longest": 64}
    with pytest.raises(ValueError, match="tree plan"):
        plan_from_dict(seq)
    summed = dataclasses.asdict(ex.compile(ex.PRESETS["selective scan"], target="cuda").scan_plan)
    summed["short"] = {"threads": 32, "elements": 16, "longest": 64}
    with pytest.raises(ValueError, match="sums no lanes"):
        plan_from_dict(summed)


@pytest.mark.parametrize("case", ["reverse", "varlen"])
def test_the_host_runs_the_short_kernel_backwards_in_time_and_over_packed_sequences(case: str):
    """The short kernel is the plain kernel's code: backwards in time (``reverse``) and over
    packed sequences (``varlen``, the state restarted at each start) it agrees with the
    reference, up to its longest and past it."""
    rng = np.random.default_rng(7)
    c = ex.compile(AFFINE, target="cpu", block_size=64, elements_per_thread=4, chunk_tiles=1,
                   grid="chunked", short_tile="32x4", **{case: True})
    assert c.scan_plan.short is not None and c.scan_plan.short.longest == 256
    for lens in ([3], [200, 56], [5, 100, 60, 200]):
        L = sum(lens)
        a = rng.uniform(0.8, 1.0, (2, L)).astype(np.float32)
        b = rng.standard_normal((2, L)).astype(np.float32)
        if case == "reverse":
            got = c(a=a, b=b)
            ref = ex.reference(AFFINE, a=a[:, ::-1].copy(), b=b[:, ::-1].copy())[:, ::-1]
        else:
            cu = np.cumsum([0, *lens]).astype(np.int64)
            got = c(a=a, b=b, cu_seqlens=cu)
            ref = np.concatenate([ex.reference(AFFINE, a=a[:, s:e].copy(), b=b[:, s:e].copy())
                                  for s, e in zip(cu[:-1], cu[1:], strict=True)], axis=1)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()),
                                   err_msg=f"{case} {lens}")


def test_the_benchmark_names_the_kernels_a_length_launches(tmp_path):
    """``scanweaver bench`` notes which kernels ran a shape: the short kernel up to its
    longest, the plain one for whole longer sequences, the look-back one for cut sequences."""
    from types import SimpleNamespace

    from explorer.bench.generated import kernels_run
    from explorer.runtime.artifact import load_artifact
    from explorer.runtime.cuda_modules import call_sizes

    art = load_artifact(ex.compile(AFFINE, target="cuda").save(tmp_path / "affine"))

    def ran(L: int, time_chunk: int) -> tuple[str, ...]:
        sizes = call_sizes(art, 4, 1, L, time_chunk=time_chunk)
        return kernels_run(art, SimpleNamespace(L=L, sizes=sizes))

    assert ran(4096, 1 << 20) == ("blelloch_short",)
    assert ran(4097, 1 << 20) == ("blelloch",)
    assert ran(8192, 4096) == ("blelloch_lookback",)
    chunked = load_artifact(ex.compile(AFFINE, target="cuda", grid="chunked",
                                       short_tile="none").save(tmp_path / "chunked"))
    sizes = call_sizes(chunked, 4, 1, 8192, time_chunk=4096)
    assert kernels_run(chunked, SimpleNamespace(L=8192, sizes=sizes)) == (
        "blelloch_reduce", "blelloch_carry", "blelloch")
    # the table says so beside the repetitions
    from explorer.bench.results import Record, format_table
    rec = Record("scanweaver-blelloch", "generated", 4, 4096, "ok", time_ms=0.01, gbps=1.0,
                 reps=10, timer="cuda-events", extra={"kernels": list(ran(4096, 1 << 20))})
    assert "10 reps, cuda-events; ran blelloch_short" in format_table([rec])
