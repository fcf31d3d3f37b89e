"""Parameters read where they are: a parameter given for the trailing batch axes alone (Mamba's
``A (D, N)``, ``D (D,)``, ``delta_bias (D,)`` beside ``x (batch, D, L)``) keeps its rows, and the
kernels read channel c's at row ``c % rows`` (the ``rowmod`` argument), no copy per channel.
CPU target; the CUDA runtime's launch plans take the same layout (tests/gpu)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import explorer as ex
from explorer.runtime.contract import ArtifactError, parse_kernels
from explorer.runtime.shapes import ArgSpec, marshal, trailing_rows

MAMBA = ex.PRESETS["Mamba selective scan"]


def test_trailing_rows() -> None:
    assert trailing_rows((1, 1536), (8, 1536)) == 1536
    assert trailing_rows((1, 1), (8, 1536)) == 1
    assert trailing_rows((8, 1536), (8, 1536)) == 8 * 1536
    assert trailing_rows((8, 1), (8, 1536)) is None        # per batch row: laid out per channel
    assert trailing_rows((1, 3, 1), (2, 3, 4)) is None
    assert trailing_rows((1, 3, 4), (2, 3, 4)) == 12


def test_marshal_keeps_a_parameter_per_trailing_channel() -> None:
    specs = [ArgSpec("x", True, False), ArgSpec("A", False, True), ArgSpec("D", False, False),
             ArgSpec("g", False, False)]
    x = np.zeros((2, 3, 7), np.float32)
    A = np.arange(12, dtype=np.float32).reshape(3, 4)
    D = np.arange(3, dtype=np.float32)
    g = np.arange(2, dtype=np.float32).reshape(2, 1)      # per batch row
    m = marshal(specs, {"x": x, "A": A, "D": D, "g": g}, vector=True, modded=["A", "D", "g"])
    assert (m.C, m.N) == (6, 4) and m.row_mod == {"A": 3, "D": 3}
    assert np.array_equal(m.arrays["A"], A) and np.array_equal(m.arrays["D"], D)
    assert m.arrays["g"].shape == (6,) and list(m.arrays["g"]) == [0, 0, 0, 1, 1, 1]
    plain = marshal(specs, {"x": x, "A": A, "D": D, "g": g}, vector=True)
    assert plain.row_mod == {} and plain.arrays["A"].shape == (6, 4)


def _mamba_inputs(b: int, D: int, N: int, L: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    f = np.float32
    return {"x": rng.standard_normal((b, D, L)).astype(f),
            "dt": (rng.standard_normal((b, D, L)) * 0.5 - 1).astype(f),
            "z": rng.standard_normal((b, D, L)).astype(f),
            "B": rng.standard_normal((b, 1, N, L)).astype(f),
            "C": rng.standard_normal((b, 1, N, L)).astype(f),
            "A": (-rng.random((D, N)) * 2 - 0.1).astype(f),
            "D": rng.standard_normal(D).astype(f),
            "dt_bias": (rng.standard_normal(D) * 0.1).astype(f)}


def _reference(a: dict[str, np.ndarray]) -> np.ndarray:
    b, D, _ = a["x"].shape

    def one(i: int, d: int) -> Any:
        return ex.reference(MAMBA, x=a["x"][i, d], dt=a["dt"][i, d], z=a["z"][i, d],
                            B=a["B"][i, 0], C=a["C"][i, 0], A=a["A"][d], D=float(a["D"][d]),
                            dt_bias=float(a["dt_bias"][d]))["y"]
    return np.stack([np.stack([one(i, d) for d in range(D)]) for i in range(b)])


@pytest.mark.parametrize("strategy", ["sequential", "blelloch", "warp_shuffle"])
def test_mamba_parameters_per_channel_of_a_batch_row(strategy: str) -> None:
    """The kernels take a row modulus per parameter and read A, D and delta_bias (D, ...) where
    they are for every batch row: the same y as the float64 reference, and bit for bit the
    same as with the parameters copied out per channel."""
    c = ex.compile(MAMBA, target="cpu", strategy=strategy, cache=False)
    mods = [a.name for a in c.contract[0].args if a.role == "rowmod"]
    assert sorted(mods) == ["A", "D", "dt_bias"]
    a = _mamba_inputs(3, 5, 4, 37)
    y = np.asarray(c(**a))
    ref = _reference(a)
    assert np.max(np.abs(y - ref)) <= 2e-6 * np.max(np.abs(ref))
    full = dict(a, A=np.broadcast_to(a["A"], (3, 5, 4)).copy(),
                D=np.broadcast_to(a["D"], (3, 5)).copy(),
                dt_bias=np.broadcast_to(a["dt_bias"], (3, 5)).copy())
    assert np.array_equal(np.asarray(c(**full)), y)
    # a number broadcasts to every channel: one row
    one = dict(a, D=0.5)
    want = _reference(dict(a, D=np.full(5, 0.5, np.float32)))
    assert np.max(np.abs(np.asarray(c(**one)) - want)) <= 2e-6 * np.max(np.abs(want))


def test_a_row_modulus_must_name_a_parameter() -> None:
    base = {"name": "k", "block": [32, 1, 1], "args": [
        {"name": "x", "role": "input", "timed": True, "lane": False},
        {"name": "g", "role": "param", "timed": False, "lane": False},
        {"name": "C", "role": "size"}, {"name": "N", "role": "size"},
        {"name": "L", "role": "size"}]}
    ok = dict(base, args=[*base["args"], {"name": "g", "role": "rowmod"}])
    assert [a.role for a in parse_kernels([ok])[0].args][-1] == "rowmod"
    for bad, says in (({"name": "x", "role": "rowmod"}, "names no parameter"),
                      ({"name": "g", "role": "rowmod", "dtype": "float32"}, "must be int64")):
        with pytest.raises(ArtifactError, match=says):
            parse_kernels([dict(base, args=[*base["args"], bad])])


def test_parameters_per_channel_when_asked() -> None:
    """``param_rows="channel"``: no row modulus argument; the runtime lays the parameters out
    per channel and the kernels read row c: the same y bit for bit."""
    kept = ex.compile(MAMBA, target="cpu", strategy="blelloch", cache=False)
    copied = ex.compile(MAMBA, target="cpu", strategy="blelloch", cache=False,
                        param_rows="channel")
    assert not [a for a in copied.contract[0].args if a.role == "rowmod"]
    a = _mamba_inputs(2, 3, 4, 29)
    assert np.array_equal(np.asarray(copied(**a)), np.asarray(kept(**a)))
    with pytest.raises(ex.OptionError, match="param_rows"):
        ex.compile(MAMBA, target="cpu", param_rows="rows")


def test_the_gpu_adjoint_takes_its_parameters_per_channel() -> None:
    """The GPU Blelloch adjoint of a vector recurrence reads its parameters a row per channel
    (the row modulus doubled its spills), unless asked otherwise; its forward keeps them."""
    pytest.importorskip("mlir")
    bw = ex.grad(ex.PRESETS["selective scan"])
    adj = bw.compile(target="cuda", strategy="blelloch")
    assert adj.options["param_rows"] == "channel"
    assert not [a for c in adj.contract for a in c.args if a.role == "rowmod"]
    asked = bw.compile(target="cuda", strategy="blelloch", param_rows="modulus")
    assert [a.name for c in asked.contract[:1] for a in c.args if a.role == "rowmod"]
    fwd = ex.compile(ex.PRESETS["selective scan"], target="cuda", strategy="blelloch")
    assert fwd.options["param_rows"] == "auto"
    assert [a for a in fwd.contract[0].args if a.role == "rowmod"]


def test_one_rule_for_the_adjoints_defaults() -> None:
    """``adjoint_options.adjoint_defaults``, the rule ``Backward.compile`` and the widget's
    backward toggle share: on the GPU the Blelloch adjoint of a vector recurrence takes
    direct tiles of its own size and parameters per channel where nothing was chosen; what
    was chosen stays; other targets, strategies and scalar recurrences take nothing."""
    from explorer.adjoint_options import ADJOINT_TILE, adjoint_defaults

    full = {"tile_layout": "direct", **ADJOINT_TILE, "param_rows": "channel"}
    assert adjoint_defaults("cuda", "blelloch", True, {}) == full
    assert adjoint_defaults("cuda", "blelloch", True, {"tile_layout": "auto",
                                                       "param_rows": "auto"}) == full
    assert adjoint_defaults("cuda", "blelloch", True, {"block_size": 256}) == {
        "tile_layout": "direct", "elements_per_thread": ADJOINT_TILE["elements_per_thread"],
        "param_rows": "channel"}
    assert adjoint_defaults("cuda", "blelloch", True, {"tile_layout": "staged",
                                                       "param_rows": "modulus"}) == {}
    assert adjoint_defaults("cuda", "blelloch", True, {"tile_layout": "staged"}) == {
        "param_rows": "channel"}
    for target, strategy, vector in [("cpu", "blelloch", True), ("cuda", "warp_shuffle", True),
                                     ("cuda", "blelloch", False)]:
        assert adjoint_defaults(target, strategy, vector, {}) == {}
