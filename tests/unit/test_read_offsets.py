"""Inputs read in place at another time (option ``read_offsets``, the plan's ``scan.read``): the
array passed as ``x`` is read at ``t + k`` for step t, zero outside the sequence. Every strategy
and grid, forwards and backwards in time, scalar and vector states, against the float64
reference of the shifted inputs; the option, the plan and the records refuse what the lowering
does not implement; the backward reads the forward's arrays this way."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from explorer.codegen.options import READ_OFFSET_MAX, validate
from explorer.errors import OptionError
from explorer.groundtruth import at_offsets

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402
from explorer.compiler import load_compiled  # noqa: E402
from explorer.groundtruth import named_outputs  # noqa: E402
from explorer.passes.plan import plan_from_dict  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402
from explorer.widget.data import sample_inputs  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
SMALL = {"block_size": 32, "elements_per_thread": 4}


def _expected(rec: Any, arrays: dict[str, Any], offsets: dict[str, int], reverse: bool
              ) -> dict[str, np.ndarray]:
    """The float64 outputs of a compile reading ``offsets`` in place: the reference of the
    inputs moved in time (flipped for a reverse scan, and the outputs back)."""
    moved = at_offsets(arrays, offsets)

    def flip(x: Any) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(x, dtype=np.float64)[..., ::-1])
    given = {k: flip(v) if reverse and k in rec.inputs else v for k, v in moved.items()}
    out = named_outputs(rec, ex.reference(rec, **given))
    return {k: flip(v) if reverse else np.asarray(v) for k, v in out.items()}


def _check(text: str, offsets: dict[str, int], reverse: bool, channels: int, length: int,
           **options: Any) -> None:
    c = ex.compile(text, target="cpu", outputs="all", read_offsets=offsets, reverse=reverse,
                   **options)
    rec = c.recurrence
    arrays = sample_inputs(rec, channels, length, 4, 7, -1.0)
    got = c(**arrays)
    got = got if isinstance(got, dict) else {c.outputs[0]: got}
    want = _expected(rec, arrays, offsets, reverse)
    for name in c.outputs:
        ref = want[name]
        err = np.abs(np.asarray(got[name], dtype=np.float64) - ref).max()
        assert err <= 1e-4 * max(1.0, np.abs(ref).max()), (name, err)
    # the moved inputs made a difference: the same call without the offsets differs
    plain = _expected(rec, arrays, {}, reverse)
    assert any(np.abs(plain[n] - want[n]).max() > 1e-3 for n in c.outputs)


@pytest.mark.parametrize("strategy", ["blelloch", "kogge_stone", "warp_shuffle", "sequential"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("offsets", [{"a": 1}, {"b": -1}, {"a": -2, "b": 3}])
def test_a_scalar_scan_reads_its_inputs_at_their_offsets(strategy: str, reverse: bool,
                                                        offsets: dict[str, int]) -> None:
    _check(AFFINE, offsets, reverse, 3, 300, strategy=strategy, **SMALL)


@pytest.mark.parametrize("grid", ["chunked", "lookback"])
@pytest.mark.parametrize("reverse", [False, True])
def test_few_long_sequences_read_across_their_tiles(grid: str, reverse: bool) -> None:
    """Tile and chunk edges: a moved read crosses into the tile before or after its own."""
    _check(AFFINE, {"a": 1, "b": -1}, reverse, 1, 2000, grid=grid, **SMALL)


@pytest.mark.parametrize("strategy", ["blelloch", "sequential"])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_vector_state_reads_lane_and_channel_inputs_at_offsets(strategy: str,
                                                                 reverse: bool) -> None:
    """The selective scan's lane loop (and the sequential plan's lanes in a block): ``dt`` (a
    channel input, staged per tile) and ``B`` (a lane input, streamed per lane) moved; on few
    long sequences too (chunks)."""
    _check(PRESETS["selective scan"], {"dt": 1, "B": -1}, reverse, 2, 150, strategy=strategy,
           **SMALL)
    _check(PRESETS["selective scan"], {"dt": -2, "B": 1}, reverse, 1, 3000, strategy=strategy,
           **SMALL)


def test_the_plan_shows_the_reads_and_a_record_keeps_them(tmp_path: Any) -> None:
    c = ex.compile(AFFINE, target="cpu", read_offsets={"a": 1}, **SMALL)
    assert '"scan.read"() {input = "a", offset = 1' in c.stages["scan-plan"].text
    assert c.options["read_offsets"] == (("a", 1),)
    path = tmp_path / "c.json"
    c.dump(path)
    back = load_compiled(path)
    assert back.options["read_offsets"] == [["a", 1]] or back.options["read_offsets"] == (
        ("a", 1),)
    arrays = sample_inputs(c.recurrence, 2, 50, 4, 1, -1.0)
    np.testing.assert_allclose(back(**arrays), c(**arrays))


@pytest.mark.parametrize("bad", [{"a": 0}, {"a": READ_OFFSET_MAX + 1}, {"a": True},
                                 {"a": 1.0}, {"1a": 1}, [("a", 1), ("a", 2)], "a", [("a",)]])
def test_offsets_the_lowering_lacks_are_refused(bad: Any) -> None:
    with pytest.raises(OptionError, match="read_offsets|offset"):
        validate(read_offsets=bad)


def test_an_offset_of_a_name_that_is_no_input_is_refused() -> None:
    with pytest.raises(OptionError, match="not a timed input"):
        ex.compile(AFFINE, target="cpu", read_offsets={"h": 1})


@pytest.mark.parametrize("reads", [[["a", 0]], [["a", 1], ["a", 1]], [["b", 1], ["a", 1]],
                                   [["a", 99]], "a", [["a"]], [[1, 1]], [["a", True]]])
def test_a_record_with_reads_the_lowering_lacks_is_refused(reads: Any) -> None:
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose
    from explorer.passes.plan import choose_plan

    # the plan of a compile with offsets (its look-back tile staged: a packed one reads none)
    raw = asdict(choose_plan(decompose(Recurrence.parse(AFFINE)),
                             validate(**SMALL, read_offsets={"a": 1})))
    assert plan_from_dict({**raw, "reads": [["a", 1], ["b", -1]]}).reads == (("a", 1),
                                                                            ("b", -1))
    with pytest.raises((ValueError, TypeError)):
        plan_from_dict({**raw, "reads": reads})


def test_at_offsets_moves_along_time_with_zeros_outside() -> None:
    x = np.arange(1.0, 6.0)[None, :]
    moved = at_offsets({"x": x, "y": x}, {"x": 2})
    np.testing.assert_array_equal(moved["x"], [[3, 4, 5, 0, 0]])
    assert moved["y"] is x
    np.testing.assert_array_equal(at_offsets({"x": x}, {"x": -1})["x"], [[0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(at_offsets({"x": x}, {"x": 7})["x"], np.zeros((1, 5)))


def test_the_backward_reads_the_forward_arrays_in_place() -> None:
    """The adjoint of the affine scan: ``a_next`` is ``a`` at t + 1 and ``fwd_h_prev`` the
    saved ``h`` at t - 1, both read in place; its kernel writes the gradient of ``a``."""
    bw = ex.grad(AFFINE)
    assert bw.names.read_offsets == {"a_next": 1, "fwd_h_prev": -1}
    assert "grad_sum_a[t] = lam_h[t] * fwd_h_prev[t]" in bw.text
    c = bw.compile(target="cpu", **SMALL)
    assert dict(c.options["read_offsets"]) == {"a_next": 1, "fwd_h_prev": -1}
    # a vector recurrence passes shifted copies (see BackwardNames.read_offsets)
    assert ex.grad(PRESETS["selective scan"]).names.read_offsets == {}


def test_the_operator_refuses_what_it_cannot_differentiate() -> None:
    pytest.importorskip("torch")
    from explorer.torch_op import torch_op

    with pytest.raises(OptionError, match="read_offsets"):
        ex.compile(AFFINE, target="cpu", read_offsets={"a": 1}).torch()
    fwd = ex.compile(AFFINE, target="cpu", outputs="all", **SMALL)
    plain = ex.compile(ex.grad(AFFINE).text, target="cpu", reverse=True, outputs="all",
                       **SMALL)
    with pytest.raises(ValueError, match="in place|older version"):
        torch_op(fwd, adjoint=plain)
    with pytest.raises(ValueError, match="read_offsets"):
        ex.grad(AFFINE).vjp({"h": np.ones((2, 5))}, options={"read_offsets": {"a": 1}},
                            a=np.ones((2, 5)), b=np.ones((2, 5)))


@pytest.mark.parametrize("length", [2, 3, 5, 129])
@pytest.mark.parametrize("reverse", [False, True])
def test_sequences_shorter_than_the_offsets_and_the_tile(length: int, reverse: bool) -> None:
    """Offsets of 1 to 3 steps on sequences of 2 to 5 steps (and one past a tile): the moved
    reads past either end are zero, in a tile that the sequence does not fill."""
    _check(AFFINE, {"a": 3, "b": -1}, reverse, 3, length, **SMALL)
