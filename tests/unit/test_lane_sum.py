"""Readouts summed over the lanes of a vector state, inside the scan kernels (the plan's
``scan.lane_sum``), and the outputs a compile stores (``scan.store``, the ``outputs`` option):
run on the host (ExecutionEngine) against the float64 reference, kernel by kernel through the
manifest as the GPU runtime launches them.

Tolerance: the readouts sum N lanes in float32, each a scan of decays in (0, 1): the error of
a lane's state is near 1e-6 of its scale, the sum's a few times that; a wrong lane, step,
channel or carry is off by the size of the values. ``1e-4`` of the largest reference value of
the row separates the two (as in ``test_cpu_runtime``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402
from explorer.codegen import build_module, lower, validate  # noqa: E402
from explorer.errors import OptionError  # noqa: E402
from explorer.frontend import Recurrence  # noqa: E402
from explorer.passes.affine import decompose  # noqa: E402
from explorer.passes.plan import choose_plan  # noqa: E402
from explorer.runtime.contract import KernelInfo, Machine, parse_kernels  # noqa: E402
from explorer.runtime.cpu import launch_cpu_kernels, run_cpu  # noqa: E402

SELECTIVE = ex.PRESETS["selective scan"]
MAMBA = ex.PRESETS["Mamba selective scan"]
#: no skip term: the readout is the sum alone
PLAIN_SUM = ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + B[t, n] * x[t]\n"
             "y[t] = sum(C[t, n] * h[t, n])")
#: two readouts, two sums in one of them, a lane parameter and a channel parameter inside sums
TWO_READOUTS = ("h[t, n] = a[t, n] * h[t-1, n] + x[t]\n"
                "y[t] = sum(C[t, n] * h[t, n]) * z[t] + 0.5 * sum(w * h[t, n])\n"
                "u[t] = sum(E[n] * h[t, n]) + x[t]")
#: functions of a channel's inputs alone inside the element: computed once per channel
CHANNEL_FUNCTIONS = ("h[t, n] = exp(exp(g[t]) * A[n]) * h[t-1, n] + tanh(u[t]) * B[t, n]\n"
                     "y[t] = sum(C[t, n] * h[t, n]) / (1 + exp(u[t]))")
RTOL = 1e-4
#: tiles of 32 x 2 steps, chunks as short as one tile
SMALL: dict[str, Any] = {"block_size": 32, "elements_per_thread": 2, "chunk_tiles": 1}
#: a machine of 256 block slots: a few channels are cut into chunks of one tile
BIG = Machine(sms=64, blocks_per_sm=4)


@cache
def built(text: str, strategy: str, outputs: str = "readouts", grid: str = "chunked",
          block_size: int = 32, reverse: bool = False
          ) -> tuple[str, tuple[KernelInfo, ...], Any]:
    o = validate(strategy, "cpu", **{**SMALL, "block_size": block_size}, outputs=outputs,
                 grid=grid, reverse=reverse)
    form = decompose(Recurrence.parse(text))
    b = build_module(form, o)
    kernels = parse_kernels([dict(k.manifest(), args=b.args) for k in b.kernels])
    return lower(b, o).final_module, kernels, choose_plan(form, o)


def inputs(text: str, C: int, N: int, L: int, seed: int) -> dict[str, np.ndarray]:
    """Random float32 arrays for every input and parameter of ``text``: decays in (0, 1)."""
    rec = Recurrence.parse(text)
    rng = np.random.default_rng(seed)
    out = {}
    for name in (*rec.inputs, *rec.params):
        shape = ((C, N) if name in rec.lane_names else (C,)) + (
            (L,) if name in rec.inputs else ())
        if name in ("dt", "g"):
            v = rng.uniform(0.01, 0.2, shape) if name == "dt" else rng.uniform(-3, 0, shape)
        elif name == "A":
            v = -rng.uniform(0.1, 2.0, shape)
        elif name == "a":
            v = rng.uniform(0.5, 1.0, shape)
        else:
            v = rng.uniform(-1.0, 1.0, shape)
        out[name] = v.astype(np.float32)
    out |= {f"{s}0": rng.uniform(-1, 1, (C, N)).astype(np.float32) for s in rec.states}
    return out


def close(out: np.ndarray, ref: np.ndarray) -> None:
    scale = np.max(np.abs(ref), axis=-1, keepdims=True)
    err = np.abs(out.astype(np.float64) - ref)
    bad = err > RTOL * (np.abs(ref) + scale)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst error {err.max():.3g}"


def check(text: str, strategy: str, C: int, N: int, L: int, outputs: str = "readouts",
          grid: str = "chunked", machine: Machine = BIG, time_chunk: int | None = None,
          block_size: int = 32, reverse: bool = False) -> dict[str, np.ndarray]:
    module, kernels, _ = built(text, strategy, outputs, grid, block_size, reverse)
    arrays = inputs(text, C, N, L, seed=C * 1000 + N * 10 + L)
    out = launch_cpu_kernels(module, kernels, arrays, C, N, L, machine=machine,
                             time_chunk=time_chunk)
    rec = Recurrence.parse(text)
    given = {k: (np.ascontiguousarray(v[..., ::-1]) if reverse and k in rec.inputs else v)
             for k, v in arrays.items()}
    want = ex.reference(text, **given)
    want = want if isinstance(want, dict) else {(rec.states + rec.readouts)[0]: want}
    if reverse:
        want = {k: v[..., ::-1] for k, v in want.items()}
    expected = {"readouts": rec.readouts or rec.states, "all": rec.states + rec.readouts,
                "states": rec.states}[outputs]
    assert set(out) == set(expected), (set(out), expected)
    for name in expected:
        close(out[name], want[name])
    return out


# -- the selective scan: every plan, y alone or with h -----------------------------------------
PLANS = [("sequential", "chunked"), ("blelloch", "chunked"), ("kogge_stone", "chunked"),
         ("blelloch", "lookback"), ("warp_shuffle", "chunked")]


@pytest.mark.parametrize("outputs", ["readouts", "all"])
@pytest.mark.parametrize(("strategy", "grid"), PLANS)
@pytest.mark.parametrize(("C", "N", "L"), [(3, 16, 200), (5, 3, 301), (2, 32, 65), (7, 1, 9)])
def test_selective_scan(strategy: str, grid: str, C: int, N: int, L: int,
                        outputs: str) -> None:
    """N a power of two up to a warp, N = 3 (channels cross warps), one lane; chunks of one
    tile on the tree plans (BIG cuts a few channels into chunks)."""
    check(SELECTIVE, strategy, C, N, L, outputs, grid)


@pytest.mark.parametrize(("strategy", "grid"), PLANS)
@pytest.mark.parametrize("time_chunk", [64, 128, None])
def test_chunk_boundaries(strategy: str, grid: str, time_chunk: int | None) -> None:
    """Forced chunk lengths: the lane loop's carries across chunks and tiles, the look-back's
    tiles (at most one tile a block on that grid)."""
    if grid == "lookback" and time_chunk == 128:
        pytest.skip("the look-back kernel takes one tile a block")
    if strategy == "sequential" and time_chunk is not None:
        pytest.skip("the sequential kernel takes no chunk length")
    check(SELECTIVE, strategy, 2, 5, 1000, "readouts", grid, time_chunk=time_chunk)


@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
def test_mamba_preset_gate_and_skip(strategy: str) -> None:
    """softplus(dt + dt_bias), the D skip and the z gate outside the sum."""
    check(MAMBA, strategy, 4, 16, 150)
    check(MAMBA, strategy, 3, 6, 77, outputs="all")


@pytest.mark.parametrize("strategy", ["sequential", "blelloch", "kogge_stone"])
@pytest.mark.parametrize("text", [PLAIN_SUM, TWO_READOUTS], ids=["plain", "two"])
@pytest.mark.parametrize(("N", "L"), [(8, 130), (5, 67), (12, 40)])
def test_other_lane_sums(text: str, strategy: str, N: int, L: int) -> None:
    """A sum with no term outside it; two readouts, one with two sums (a lane parameter and a
    channel parameter inside them, a timed input outside): every readout stored, no state."""
    out = check(text, strategy, 3, N, L)
    assert "h" not in out


@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
@pytest.mark.parametrize("outputs", ["readouts", "all", "states"])
def test_channel_values(strategy: str, outputs: str) -> None:
    """What a channel's lanes share (exp(g), tanh(u): functions of its inputs alone) is
    computed once per (channel, step) and read by every lane; with or without a readout."""
    check(CHANNEL_FUNCTIONS, strategy, 4, 6, 150, outputs)
    check(MAMBA, strategy, 3, 16, 100, outputs)


def test_the_channel_values_of_the_presets() -> None:
    from explorer.codegen.hoist import split_channel

    mamba = split_channel(decompose(Recurrence.parse(MAMBA)), ())
    # softplus, and the channel's part of b = softplus(...) * B * x: a lane multiplies once
    assert [str(e) for _, e in mamba.values] == ["softplus(dt + dt_bias)",
                                                  "x*softplus(dt + dt_bias)"]
    assert [str(e) for e in mamba.element] == ["exp(#0*A)", "#1*B"]
    assert mamba.lane_inputs == ("B",) and mamba.channel_inputs == ()
    assert mamba.channel_raw == ("dt", "x")
    # a product's channel factors are one value even when nothing in them is costly; a
    # channel input a lane reads alone (dt in exp(A*dt)) is staged as it is
    plain = split_channel(decompose(Recurrence.parse(SELECTIVE)), ())
    assert [(n, str(e)) for n, e in plain.values] == [("#0", "dt*x")]
    assert [str(e) for e in plain.element] == ["exp(A*dt)", "#0*B"]
    assert plain.channel_inputs == ("dt",)
    own = split_channel(decompose(Recurrence.parse(CHANNEL_FUNCTIONS)), ())
    assert sorted(str(e) for _, e in own.values) == ["exp(g)", "tanh(u)"]


def test_the_lane_loop_stages_the_timed_inputs_of_its_readouts() -> None:
    """The readout's timed inputs outside its sum (x and z of the Mamba preset's y) are staged
    per channel with the lanes' values, so the tile's readouts read them from the stage; the
    kernels give the same y (the Mamba checks of this file)."""
    from explorer.codegen.shared_layout import lane_loop_split, shared_arrays

    form = decompose(Recurrence.parse(MAMBA))
    o = validate("warp_shuffle", "cuda", block_size=32, elements_per_thread=16)
    plan = choose_plan(form, o)
    split = lane_loop_split(form, plan)
    assert split is not None and split.channel_inputs == ("x", "z")
    assert split.channel_raw == ("dt", "x", "z")
    # a row of the tile each (the stage's size), beside the two channel values and the term
    rows = shared_arrays(form, o, "scan", plan)
    assert len(split.channel_staged) + len(split.terms) == 5
    assert rows[-5:] == [rows[0]] * 5 and rows[0] >= o.tile


@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
def test_reverse_scan_with_a_lane_sum(strategy: str) -> None:
    check(SELECTIVE, strategy, 3, 4, 150, reverse=True)
    check(SELECTIVE, strategy, 3, 4, 150, outputs="all", reverse=True)


def test_block_of_lanes_wider_than_a_warp() -> None:
    """Sequential, 64 threads a block: N = 40 lanes fill one channel a block (across two
    warps), N = 20 three channels; the tree plans loop over any number of lanes."""
    check(SELECTIVE, "sequential", 3, 40, 70, block_size=64)
    check(SELECTIVE, "sequential", 5, 20, 70, "all", block_size=64)
    check(SELECTIVE, "blelloch", 2, 40, 70)


def test_too_many_lanes_for_a_block_is_refused() -> None:
    """The sequential plan holds a channel's lanes in one block: more lanes than threads is
    an error that says what fits, never a wrong answer."""
    module, kernels, _ = built(SELECTIVE, "sequential")
    arrays = inputs(SELECTIVE, 2, 40, 10, seed=1)
    for run in (run_cpu, launch_cpu_kernels):
        with pytest.raises(ValueError, match=r"N=40 lanes do not fit.*block_size >= 40"):
            run(module, kernels, arrays, 2, 40, 10)


# -- what is stored ----------------------------------------------------------------------------
def test_outputs_choose_what_is_written() -> None:
    """Default: y alone, h is no argument; 'all': both; 'states': h and no readout computed;
    a list of names; a name that is not an output is refused."""
    def written(**options: Any) -> list[str]:
        o = validate("sequential", "cpu", **options)
        b = build_module(decompose(Recurrence.parse(SELECTIVE)), o)
        return [a["name"] for a in b.args if a["role"] == "output"]
    assert written() == ["y"]
    assert written(outputs="all") == ["h", "y"]
    assert written(outputs="states") == ["h"]
    assert written(outputs=["y", "h"]) == ["h", "y"]
    assert written(outputs="h") == ["h"]
    with pytest.raises(OptionError, match="not an output"):
        written(outputs=["z"])
    with pytest.raises(OptionError, match="outputs must be"):
        validate("sequential", "cpu", outputs=3)
    # a recurrence without readouts stores its states
    o = validate("blelloch", "cpu")
    b = build_module(decompose(Recurrence.parse("h[t] = a[t] * h[t-1] + b[t]")), o)
    assert [a["name"] for a in b.args if a["role"] == "output"] == ["h"]


@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
def test_scalar_readout_without_its_state(strategy: str) -> None:
    """A readout of a scalar state is computed beside it: the state is not written."""
    text = ("h[t] = sigmoid(z[t]) * h[t-1] + softplus(x[t])\n"
            "y[t] = w * tanh(h[t] / 8) + sqrt(abs(x[t]))")
    module, kernels, plan = built(text, strategy)
    assert plan.stored == ("y",) and plan.lane_sum is None
    rng = np.random.default_rng(5)
    C, L = 3, 200
    arrays = {"z": rng.uniform(-3, 3, (C, L)), "x": rng.uniform(-3, 3, (C, L)),
              "w": rng.uniform(-1, 1, (C,))}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    out = run_cpu(module, kernels, arrays, C, 1, L)
    assert set(out) == {"y"}
    close(out["y"], ex.reference(text, **arrays)["y"])


def test_plan_records_the_choice() -> None:
    """scan.store and scan.lane_sum in the plan, read back as the plan."""
    for (strategy, grid), scheme in zip(PLANS, ["lanes-in-block", "lane-loop", "lane-loop",
                                                "readout-kernel", "lane-loop"], strict=True):
        _, kernels, plan = built(SELECTIVE, strategy, "readouts", grid)
        assert plan.stored == ("y",)
        assert plan.lane_sum is not None and plan.lane_sum.scheme == scheme
        assert plan.lane_sum.readouts == ("y",)
        channels = {"lanes-in-block": "threads", "lane-loop": "block",
                    "readout-kernel": None}[scheme]
        scan = next(k for k in kernels if k.name == f"scanweaver_{strategy}")
        assert scan.channels == channels
    _, _, plan = built(SELECTIVE, "sequential", "states")
    assert plan.stored == ("h",) and plan.lane_sum is None


# -- inputs shared by blocks of channels ---------------------------------------------------------
def _per_batch_row(text: str, batch: int, D: int, N: int, L: int, seed: int
                   ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Mamba's layout: B and C a row per batch row, the rest per channel (float32); and the
    reference of the recurrence on B and C repeated per channel."""
    C = batch * D
    rng = np.random.default_rng(seed)
    arrays = {"dt": rng.uniform(0.01, 0.2, (C, L)), "x": rng.uniform(-1, 1, (C, L)),
              "A": -rng.uniform(0.1, 2.0, (C, N)), "D": rng.uniform(-1, 1, (C,)),
              "B": rng.uniform(-1, 1, (batch, N, L)), "C": rng.uniform(-1, 1, (batch, N, L))}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    per_channel = {k: (np.repeat(v, D, axis=0) if k in ("B", "C") else v)
                   for k, v in arrays.items()}
    return arrays, ex.reference(text, **per_channel)


@pytest.mark.parametrize(("strategy", "grid"), PLANS)
@pytest.mark.parametrize("outputs", ["readouts", "all"])
def test_inputs_read_with_a_row_per_batch_row(strategy: str, grid: str, outputs: str) -> None:
    """Mamba's layout: B and C per batch row, (batch, N, L), beside x and dt per channel,
    (batch, D, L): the kernels read B and C where they are (row c // D), no copy per channel."""
    batch, D, N, L = 3, 5, 6, 90
    C = batch * D
    module, kernels, _ = built(SELECTIVE, strategy, outputs, grid)
    assert {a.name for a in kernels[0].args if a.role == "rowmap"} == {"B", "C"}
    arrays, want = _per_batch_row(SELECTIVE, batch, D, N, L, seed=9)
    for run in (launch_cpu_kernels, run_cpu):
        out = run(module, kernels, arrays, C, N, L, row_div={"B": D, "C": D})
        for name, value in out.items():
            close(value, want[name])
    with pytest.raises(ValueError, match="do not divide"):
        run_cpu(module, kernels, arrays, C, N, L, row_div={"B": 4, "C": 4})


#: a lane readout beside the sum (the gradient of B of the selective scan's adjoint, in form)
LANE_READOUT = SELECTIVE + "\ng[t, n] = C[t, n] * h[t, n] * x[t] + B[t, n]"


@pytest.mark.parametrize(("strategy", "grid"), PLANS)
def test_lane_readouts_add_into_rows_shared_by_channels(strategy: str, grid: str) -> None:
    """A lane readout given a row divisor: the channels that share a row add their values
    there (the kernels' adds, a permutation of the blocks over the rows on the lane loop)."""
    batch, D, N, L = 3, 5, 6, 90
    C = batch * D
    module, kernels, _ = built(LANE_READOUT, strategy, "all", grid)
    assert {a.name for a in kernels[0].args if a.role == "rowmap"} == {"B", "C", "g"}
    assert next(a for a in kernels[0].args if a.name == "g" and a.role == "output").reset
    arrays, want = _per_batch_row(LANE_READOUT, batch, D, N, L, seed=11)
    for run in (launch_cpu_kernels, run_cpu):
        out = run(module, kernels, arrays, C, N, L, row_div={"B": D, "C": D, "g": D})
        assert out["g"].shape == (batch, N, L)
        close(out["g"], want["g"].reshape(batch, D, N, L).sum(axis=1))
        close(out["y"], want["y"])
        whole = run(module, kernels, arrays, C, N, L, row_div={"B": D, "C": D})
        close(whole["g"], want["g"])   # a row per channel: the values themselves


def test_a_manifest_that_stops_zeroing_a_lane_readout_is_refused() -> None:
    """The kernels add a lane readout into its output: a manifest that drops ``reset`` (the
    launcher would add into memory it never cleared) is refused, not run."""
    import copy

    from explorer.runtime.contract import ArtifactError

    o = validate("blelloch", "cpu", **SMALL, outputs="all")
    b = build_module(decompose(Recurrence.parse(LANE_READOUT)), o)
    manifest = copy.deepcopy([dict(k.manifest(), args=b.args) for k in b.kernels])
    parse_kernels(copy.deepcopy(manifest))
    for k in manifest:
        for a in k["args"]:
            if a["name"] == "g" and a["role"] == "output":
                a.pop("reset", None)
    with pytest.raises(ArtifactError, match="no output added into"):
        parse_kernels(manifest)


def test_marshal_keeps_a_row_per_block_of_channels() -> None:
    """An input broadcast over trailing batch axes keeps its rows (no copy per channel); any
    other broadcast is laid out per channel, as before."""
    from explorer.runtime.shapes import ArgSpec, marshal, shared_rows

    assert shared_rows((8, 1), (8, 1536)) == 1536
    assert shared_rows((1, 1), (8, 1536)) == 8 * 1536
    assert shared_rows((8, 1536), (8, 1536)) == 1
    assert shared_rows((1, 1536), (8, 1536)) is None
    specs = [ArgSpec("x", True, False), ArgSpec("B", True, True), ArgSpec("A", False, True)]
    x = np.zeros((2, 3, 7), np.float32)
    B = np.arange(2 * 4 * 7, dtype=np.float32).reshape(2, 1, 4, 7)
    A = np.zeros((3, 4), np.float32)
    m = marshal(specs, {"x": x, "B": B, "A": A}, vector=True, shared=["B"])
    assert (m.C, m.N, m.L) == (6, 4, 7) and m.row_div == {"B": 3}
    assert m.arrays["B"].shape == (2, 4, 7) and np.array_equal(m.arrays["B"], B[:, 0])
    assert m.arrays["A"].shape == (6, 4)      # a parameter: per channel
    again = marshal(specs, {"x": x, "B": B, "A": A}, vector=True)
    assert again.row_div == {} and again.arrays["B"].shape == (6, 4, 7)


def test_the_explorer_shows_the_choice() -> None:
    """The plan stage's text and the Scan tree tab say what is stored and where the lanes
    are summed, read from the compile's records."""
    import html

    pytest.importorskip("ipywidgets")
    from explorer.widget import Explorer

    c = ex.compile(SELECTIVE, target="cpu", strategy="sequential")
    text = c.stages["plan"].text
    assert "scan.store: the kernels write y; the states h are never written" in text
    assert '"scan.lane_sum"() {readouts = ["y"], scheme = "lanes-in-block"}' in text
    w = Explorer(ex.compile(SELECTIVE, target="cpu", strategy="blelloch", outputs="all"))
    w.show_tab("Scan tree")
    info = html.unescape(w.tree_view.info.value)
    assert "scan.store: the kernels write h, y" in info and "lane-loop" in info
