"""Wide tile accesses of tree plans (``vector_width``, ``scan.thread {vector_width = V}``): the
option, the plan that records it, and the kernels on the host (``target="cpu"`` runs the same
lowering, threads as loops) against the float64 reference, where the wide path runs and where
it must not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from explorer.bench.affine import affine_scan_f64, max_rel_error, tolerance
from explorer.codegen.options import validate
from explorer.errors import OptionError
from explorer.passes.plan import plan_from_dict

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402
from explorer.codegen import tiles  # noqa: E402
from explorer.passes.plan import plan_ir  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
#: small tiles (32 threads x 8 elements = 256 steps) so that a few hundred steps span tiles
SMALL = {"block_size": 32, "elements_per_thread": 8}


@pytest.mark.parametrize("options,want", [
    ({}, 4), ({"dtype": "bfloat16"}, 8), ({"dtype": "float16", "elements_per_thread": 4}, 4),
    ({"elements_per_thread": 2}, 2), ({"vector_width": 1}, 1), ({"vector_width": 2}, 2),
    ({"vector_width": 8, "elements_per_thread": 8}, 8),
])
def test_vector_width_resolves(options: dict[str, Any], want: int) -> None:
    assert validate(**options).vector_elements == want


@pytest.mark.parametrize("bad", [0, 3, 16, True, "wide", 2.0, None])
def test_bad_vector_width_is_refused(bad: object) -> None:
    with pytest.raises(OptionError, match="vector_width"):
        validate(vector_width=bad)


def test_vector_wider_than_a_threads_elements_is_refused() -> None:
    with pytest.raises(OptionError, match="elements_per_thread"):
        validate(vector_width=8, elements_per_thread=4)


def _plan_dict(**changes: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose
    from explorer.passes.plan import choose_plan

    form = decompose(Recurrence.parse(AFFINE))
    raw = asdict(choose_plan(form, validate(**SMALL)))
    raw.update(changes)
    return raw


def test_plan_records_the_width_and_reads_it_back() -> None:
    c = ex.compile(AFFINE, target="cpu", **SMALL)
    assert plan_ir(c.stages["scan-plan"].text).vector_width == 4
    c1 = ex.compile(AFFINE, target="cpu", vector_width=1, **SMALL)
    assert plan_ir(c1.stages["scan-plan"].text).vector_width == 1
    assert "vector.load" in c.stages["scan-lower"].text
    assert "vector.load" not in c1.stages["scan-lower"].text
    assert plan_from_dict(_plan_dict()).vector_width == 4


def test_a_record_without_the_width_reads_as_scalar() -> None:
    """A record from before the field (its look-back tile staged: packed tiles came later,
    and a packed one without 16-byte accesses is refused)."""
    raw = _plan_dict()
    raw["lookback"] = {**raw["lookback"], "layout": "staged"}
    del raw["vector_width"]
    assert plan_from_dict(raw).vector_width == 1
    del raw["lookback"]["layout"]
    raw["lookback"]["layout"] = "packed"
    with pytest.raises(ValueError, match="16-byte vectors"):
        plan_from_dict(raw)


@pytest.mark.parametrize("width", [3, 16, 0, -4])
def test_a_plan_with_a_width_the_lowering_lacks_is_refused(width: object) -> None:
    with pytest.raises(ValueError, match="wide access"):
        plan_from_dict(_plan_dict(vector_width=width))


def test_a_sequential_plan_has_no_wide_accesses() -> None:
    c = ex.compile(AFFINE, target="cpu", strategy="sequential", block_size=32)
    plan = plan_ir(c.stages["scan-plan"].text)
    from dataclasses import asdict

    assert plan.vector_width == 1
    with pytest.raises(ValueError, match="wide access"):
        plan_from_dict({**asdict(plan), "vector_width": 4})


def _problem(C: int, L: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.5, 1.0, (C, L)).astype(np.float32),
            rng.standard_normal((C, L)).astype(np.float32))


def _reference(a: np.ndarray, b: np.ndarray, reverse: bool) -> np.ndarray:
    if reverse:
        return np.asarray(affine_scan_f64(a[:, ::-1], b[:, ::-1]))[:, ::-1]
    return np.asarray(affine_scan_f64(a, b))


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    from explorer.runtime.dtypes import from_storage, to_storage

    return np.asarray(from_storage(to_storage("x", x, dtype, np), dtype, np), np.float32)


#: lengths around the vector (4) and the tile (256): odd rows start off a vector boundary,
#: tails shorter than a vector or a tile, sequences of several tiles
LENGTHS = [1, 3, 5, 255, 256, 258, 1027, 2053]


@pytest.mark.parametrize("variant", [
    {}, {"reverse": True}, {"grid": "chunked"}, {"grid": "lookback"},
    {"strategy": "kogge_stone"}, {"strategy": "warp_shuffle", "grid": "lookback"},
    {"dtype": "bfloat16"}, {"dtype": "float16", "reverse": True},
    {"dtype": "bfloat16", "out_dtype": "float32", "grid": "chunked"},
])
def test_wide_kernels_on_the_host_match_the_reference(variant: dict[str, Any]) -> None:
    opts = dict(variant)
    strategy = str(opts.pop("strategy", "blelloch"))
    c = ex.compile(AFFINE, target="cpu", strategy=strategy, **SMALL, **opts)
    assert plan_ir(c.stages["scan-plan"].text).vector_width > 1
    dtype = opts.get("dtype", "float32")
    out_dtype = opts.get("out_dtype", dtype)
    for i, L in enumerate(LENGTHS):
        C = 3 if L < 1000 else 2
        a, b = _problem(C, L, seed=i)
        h = np.asarray(c(a=a, b=b), dtype=np.float32)
        ref = _reference(_rounded(a, dtype), _rounded(b, dtype), bool(opts.get("reverse")))
        err = max_rel_error(h.astype(np.float64), ref)
        assert err <= tolerance(out_dtype), f"{variant} C={C} L={L}: {err:.2e}"


def _broken_wide_load(s: Any, p: Any, V: int) -> Any:
    """A wide load whose elements come in the wrong order: wrong results wherever it runs."""
    from mlir.dialects import vector

    good = _WIDE_LOAD(s, p, V)
    return vector.shuffle(good, good, list(range(V))[::-1])


_WIDE_LOAD = tiles.wide_load


def test_the_wide_path_runs_only_where_it_may(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a broken wide load compiled in, the rows it reads come out wrong, and only those:
    a row starting on a vector boundary with whole tiles takes the wide path; a row starting
    off one, or a range shorter than a tile, takes the scalar loads."""
    monkeypatch.setattr(tiles, "wide_load", _broken_wide_load)
    c = ex.compile(AFFINE, target="cpu", cache=False, grid="chunked", **SMALL)
    L = 2 * 256 + 1            # row 0 starts at 0 (aligned), row 1 at 513 (not)
    a, b = _problem(2, L, seed=7)
    h = np.asarray(c(a=a, b=b), dtype=np.float64)
    ref = _reference(a, b, False)
    assert max_rel_error(h[1:], ref[1:]) <= tolerance("float32")   # scalar: right
    assert max_rel_error(h[:1], ref[:1]) > 1e-3                     # wide: the broken load
    short = _problem(2, 200, seed=8)   # shorter than a tile: never wide
    h2 = np.asarray(c(a=short[0], b=short[1]), dtype=np.float64)
    assert max_rel_error(h2, _reference(*short, False)) <= tolerance("float32")
    off = ex.compile(AFFINE, target="cpu", cache=False, grid="chunked", vector_width=1,
                     **SMALL)
    h3 = np.asarray(off(a=a, b=b), dtype=np.float64)
    assert max_rel_error(h3, ref) <= tolerance("float32")
