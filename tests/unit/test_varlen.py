"""Last states (``outputs=(..., "h_last")``) and packed variable-length batches
(``varlen=True``, a call's ``cu_seqlens=``), on the host (ExecutionEngine), for every strategy
and grid, against the float64 reference run on each sequence alone.

Tolerance as in ``test_cpu_runtime``/``test_lane_sum``: ``1e-4`` of the largest reference value
(float32 scans of decays); a state carried across a sequence boundary, a wrong sequence's
initial state or a last state taken at the wrong step is off by the size of the values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import explorer as ex  # noqa: E402
from explorer.errors import OptionError, RecurrenceError  # noqa: E402
from explorer.runtime.segments import check_cu_seqlens, segment_marks  # noqa: E402

AFFINE = ex.PRESETS["affine scan"]
SECOND = ex.PRESETS["second order"]
SELECTIVE = ex.PRESETS["selective scan"]
RTOL = 1e-4
#: tiles of 32 x 2 steps, chunks of one tile: a few hundred steps cross many tiles and chunks
SMALL: dict[str, Any] = {"block_size": 32, "elements_per_thread": 2, "chunk_tiles": 1}
#: every strategy and grid: (strategy, options)
PLANS = [("sequential", {}), ("blelloch", SMALL), ("kogge_stone", SMALL),
         ("blelloch", {**SMALL, "grid": "lookback"}),
         ("warp_shuffle", {**SMALL, "block_size": 64, "grid": "lookback"})]
PLAN_IDS = ["sequential", "blelloch", "kogge_stone", "lookback", "warp_shuffle-lookback"]
#: an empty sequence, sequences of one step, one crossing several tiles and chunks
CU = np.array([0, 5, 5, 6, 190, 191, 400], dtype=np.int32)


def _compile(text: str, strategy: str, options: dict[str, Any], **more: Any) -> Any:
    return ex.compile(text, target="cpu", strategy=strategy, **options, **more)


def _close(got: np.ndarray, want: np.ndarray, scale: float | None = None) -> None:
    scale = scale if scale is not None else max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=RTOL * scale)


def _affine_inputs(C: int, L: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.uniform(0.8, 1.0, (C, L)).astype(np.float32),
            "b": rng.standard_normal((C, L)).astype(np.float32)}


def _flip(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v[..., ::-1] for k, v in arrays.items()}


@pytest.mark.parametrize(("strategy", "options"), PLANS, ids=PLAN_IDS)
def test_packed_affine_scan_matches_each_sequence_alone(strategy: str, options: dict) -> None:
    c = _compile(AFFINE, strategy, options, outputs=("h", "h_last"), varlen=True)
    arrays = _affine_inputs(3, int(CU[-1]))
    h0 = np.random.default_rng(1).standard_normal((len(CU) - 1, 3)).astype(np.float32)
    out = c(**arrays, cu_seqlens=CU, h0=h0)
    assert out["h"].shape == (3, CU[-1]) and out["h_last"].shape == (len(CU) - 1, 3)
    for j in range(len(CU) - 1):
        s, e = CU[j], CU[j + 1]
        if s == e:   # an empty sequence: its last state is its initial state
            np.testing.assert_array_equal(out["h_last"][j], h0[j])
            continue
        ref = ex.reference(AFFINE, **{k: v[:, s:e] for k, v in arrays.items()}, h0=h0[j])
        _close(out["h"][:, s:e], ref)
        _close(out["h_last"][j], ref[:, -1])


@pytest.mark.parametrize(("strategy", "options"), [PLANS[0], PLANS[1], PLANS[3]],
                         ids=[PLAN_IDS[0], PLAN_IDS[1], PLAN_IDS[3]])
def test_packed_selective_scan_readout_and_last_state(strategy: str, options: dict) -> None:
    """A vector state whose readout sums the lanes (in the block, in the lane loop, or in the
    readout kernel of the look-back grid): y and the last state per sequence, lane and channel;
    the history of h is never returned."""
    c = _compile(SELECTIVE, strategy, options, outputs=("y", "h_last"), varlen=True)
    rng = np.random.default_rng(2)
    C, N = 3, 4
    cu = np.array([0, 70, 71, 71, 300], dtype=np.int64)
    L, S = int(cu[-1]), len(cu) - 1
    arrays = {"x": rng.standard_normal((C, L)), "dt": rng.uniform(0.01, 0.1, (C, L)),
              "A": -rng.uniform(0.5, 2.0, (C, N)), "B": rng.standard_normal((C, N, L)),
              "C": rng.standard_normal((C, N, L)), "D": rng.standard_normal(C)}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    h0 = rng.standard_normal((S, C, N)).astype(np.float32)
    out = c(**arrays, cu_seqlens=cu, h0=h0)
    assert set(out) == {"y", "h_last"} and out["h_last"].shape == (S, C, N)
    for j in range(S):
        s, e = cu[j], cu[j + 1]
        if s == e:
            np.testing.assert_array_equal(out["h_last"][j], h0[j])
            continue
        part = {k: (v[..., s:e] if k in ("x", "dt", "B", "C") else v) for k, v in arrays.items()}
        ref = ex.reference(SELECTIVE, **part, h0=h0[j])
        _close(out["y"][:, s:e], ref["y"])
        _close(out["h_last"][j], ref["h"][..., -1])


@pytest.mark.parametrize(("strategy", "options"), PLANS, ids=PLAN_IDS)
def test_last_state_alone_without_packing(strategy: str, options: dict) -> None:
    """``outputs="h_last"`` of a whole-sequence compile: the state after step L - 1, nothing
    else written; of a two-state system (h[t-2]) too."""
    arrays = _affine_inputs(5, 333, seed=3)
    h0 = np.random.default_rng(4).standard_normal(5).astype(np.float32)
    c = _compile(AFFINE, strategy, options, outputs="h_last")
    got = c(**arrays, h0=h0)
    assert got.shape == (5,)
    _close(got, ex.reference(AFFINE, **arrays, h0=h0)[:, -1])
    c2 = _compile(SECOND, strategy, options, outputs=("h", "h_last"))
    x = np.random.default_rng(5).standard_normal((2, 257)).astype(np.float32) * 0.1
    out = c2(x=x)
    ref = ex.reference(SECOND, x=x)
    _close(out["h"], ref)
    _close(out["h_last"], ref[:, -1], float(np.abs(ref).max()))


@pytest.mark.parametrize(("strategy", "options"), [PLANS[0], PLANS[1]], ids=PLAN_IDS[:2])
def test_packed_second_order_restarts_its_older_lags(strategy: str, options: dict) -> None:
    """h[t-2] is a component of the state: at a sequence start it restarts at zero too."""
    c = _compile(SECOND, strategy, options, outputs=("h", "h_last"), varlen=True)
    cu = np.array([0, 40, 41, 200])
    x = np.random.default_rng(6).standard_normal((2, 200)).astype(np.float32) * 0.1
    out = c(x=x, cu_seqlens=cu)
    for j in range(3):
        s, e = cu[j], cu[j + 1]
        ref = ex.reference(SECOND, x=x[:, s:e])
        _close(out["h"][:, s:e], ref, float(np.abs(ref).max()))
        _close(out["h_last"][j], ref[:, -1], float(np.abs(ref).max()))


@pytest.mark.parametrize(("strategy", "options"), [PLANS[0], PLANS[1], PLANS[3]],
                         ids=[PLAN_IDS[0], PLAN_IDS[1], PLAN_IDS[3]])
def test_packed_reverse_scan_restarts_at_each_sequence_end(strategy: str, options: dict) -> None:
    """Backwards in time a sequence starts at its last step: each is the forward scan of the
    flipped sequence, flipped back; its last state is the state at its first step."""
    c = _compile(AFFINE, strategy, options, outputs=("h", "h_last"), varlen=True, reverse=True)
    arrays = _affine_inputs(2, int(CU[-1]), seed=7)
    out = c(**arrays, cu_seqlens=CU)
    for j in range(len(CU) - 1):
        s, e = CU[j], CU[j + 1]
        if s == e:
            continue
        ref = ex.reference(AFFINE, **_flip({k: v[:, s:e] for k, v in arrays.items()}))
        _close(out["h"][:, s:e], ref[:, ::-1])
        _close(out["h_last"][j], ref[:, -1])


def test_without_cu_seqlens_a_varlen_compile_is_one_sequence() -> None:
    c = _compile(AFFINE, "blelloch", SMALL, outputs=("h", "h_last"), varlen=True)
    arrays = _affine_inputs(2, 300, seed=8)
    out = c(**arrays, h0=np.float32(0.5))
    ref = ex.reference(AFFINE, **arrays, h0=0.5)
    _close(out["h"], ref)
    assert out["h_last"].shape == (2,)
    _close(out["h_last"], ref[:, -1])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 90), min_size=1, max_size=6), seed=st.integers(0, 99))
def test_any_packing_matches_each_sequence_alone(lengths: list[int], seed: int) -> None:
    L = sum(lengths)
    if L == 0:
        lengths, L = [*lengths, 1], L + 1
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    c = _compile(AFFINE, "blelloch", SMALL, outputs=("h", "h_last"), varlen=True)
    arrays = _affine_inputs(2, L, seed)
    out = c(**arrays, cu_seqlens=cu)
    for j in range(len(lengths)):
        s, e = cu[j], cu[j + 1]
        if s == e:
            np.testing.assert_array_equal(out["h_last"][j], 0.0)
            continue
        ref = ex.reference(AFFINE, **{k: v[:, s:e] for k, v in arrays.items()})
        _close(out["h"][:, s:e], ref)
        _close(out["h_last"][j], ref[:, -1])


def test_segment_marks_say_sequence_start_and_end() -> None:
    marks = segment_marks(check_cu_seqlens([0, 2, 2, 3], 3), 3)
    assert marks.dtype == np.float32
    # step 0 starts sequence 0, step 1 ends it; sequence 1 is empty; step 2 is sequence 2 alone
    assert marks.tolist() == [1.0, 2.0, 4 * 2 + 3.0]


@pytest.mark.parametrize(("cu", "message"), [
    (np.array([0.0, 3.0]), "integer array"),
    (np.array([1, 3]), r"cu_seqlens\[0\] must be 0"),
    (np.array([0, 2, 1, 3]), "non-decreasing"),
    (np.array([0, 2]), "must end at the total length L=3"),
    (np.array([[0, 3]]), "1-d"),
    (np.array([0]), "1-d with B \\+ 1 >= 2"),
    ([0, True, 3], "integers"),
    ("0,3", "integer array of B \\+ 1 offsets"),
])
def test_bad_cu_seqlens_are_refused(cu: Any, message: str) -> None:
    with pytest.raises(RecurrenceError, match=message):
        check_cu_seqlens(cu, 3)


def test_packing_errors_are_clear() -> None:
    arrays = _affine_inputs(2, 3)
    whole = _compile(AFFINE, "sequential", {})
    with pytest.raises(RecurrenceError, match="compile with varlen=True"):
        whole(**arrays, cu_seqlens=[0, 3])
    c = _compile(AFFINE, "sequential", {}, outputs=("h", "h_last"), varlen=True)
    with pytest.raises(RecurrenceError, match="non-decreasing"):
        c(**arrays, cu_seqlens=np.array([0, 2, 1, 3]))
    with pytest.raises(RecurrenceError, match="one per sequence"):
        c(**arrays, cu_seqlens=[0, 1, 2, 3], h0=np.zeros(2, np.float32))
    with pytest.raises(OptionError, match="g_last"):
        _compile(AFFINE, "sequential", {}, outputs=("h", "g_last"))
    with pytest.raises(OptionError, match="varlen must be True or False"):
        _compile(AFFINE, "sequential", {}, varlen="yes")


def test_the_plan_stage_says_what_is_stored_and_where_sequences_restart() -> None:
    c = _compile(SELECTIVE, "sequential", {}, outputs=("y", "h_last"), varlen=True)
    text = c.stages["plan"].text
    assert "scan.segments" in text and "h_last" in text
    assert c.outputs == ("y", "h_last")
    args = {a["name"]: a for a in c.kernels[0]["args"]}
    assert args["segment_marks"]["role"] == "segments"
    assert args["h_last"]["role"] == "output" and not args["h_last"]["timed"]


def test_a_compiled_record_keeps_the_segments_and_the_last_state(tmp_path: Any) -> None:
    from explorer.compiler import load_compiled

    c = ex.compile(AFFINE, target="cuda", varlen=True, outputs=("h", "h_last"))
    c.dump(tmp_path / "rec.json.gz")
    r = load_compiled(tmp_path / "rec.json.gz")
    assert r.scan_plan.segments and r.scan_plan.stored == ("h", "h_last")
    assert r.outputs == ("h", "h_last")
