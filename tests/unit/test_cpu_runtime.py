"""Generated code run on the host (ExecutionEngine) against float64 NumPy loops.

Tolerance: float32 results are compared with ``|out - ref| <= 1e-4 * (|ref| + max|ref|)``
per channel. Each step rounds a handful of float32 operations (relative 6e-8 each); the
coefficients here have |a| <= 1, so old errors decay instead of growing, and the Blelloch
reassociation adds about log2(tile) roundings to a prefix product. exp/log/tanh are within a
few ulp. That puts real errors near 1e-6 of the scale of the sequence, while an indexing,
masking or carry bug gives errors of the order of the values themselves: 1e-4 separates the
two with margin on either side.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from explorer.codegen import build_module, lower, validate
from explorer.frontend import Recurrence
from explorer.passes.affine import decompose
from explorer.runtime.artifact import Machine
from explorer.runtime.contract import ArgInfo, KernelInfo, parse_kernels, size_values
from explorer.runtime.cpu import CPU_MACHINE, launch_cpu_kernels, run_cpu

SCALAR = "h[t] = a[t] * h[t-1] + b[t]"
MAMBA = ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
         "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]")
COMPANION = "h[t] = a[t] * h[t-1] + c[t] * h[t-2] + x[t]"
COUPLED = "h[t] = a[t] * h[t-1] + g[t] * s[t-1] + x[t]\ns[t] = 0.5 * h[t-1] + d[t] * s[t-1]"
GATED = ("h[t] = sigmoid(z[t]) * h[t-1] + softplus(x[t])\n"
         "y[t] = w * tanh(h[t] / 8) + sqrt(abs(x[t]))")

STRATEGIES = ["sequential", "blelloch"]
LENGTHS = [1, 2, 3, 7, 1000, 2**20]
RTOL = 1e-4
#: tiles of 64 (32 threads x 2 elements), chunks as short as one tile
SMALL_TILES: dict[str, int] = {"block_size": 32, "ept": 2, "chunk_tiles": 1}


@cache
def built_for(text: str, strategy: str, block_size: int = 64, ept: int = 4,
              chunk_tiles: int = 16, outputs: str = "all", grid: str = "chunked"
              ) -> tuple[str, tuple[ArgInfo, ...], tuple[KernelInfo, ...]]:
    """The host module and contract of a compile; every output stored unless ``outputs``
    says otherwise (the tests here check the states)."""
    o = validate(strategy, "cpu", block_size=block_size, elements_per_thread=ept,
                 chunk_tiles=chunk_tiles, outputs=outputs, grid=grid)
    built = build_module(decompose(Recurrence.parse(text)), o)
    kernels = parse_kernels([dict(k.manifest(), args=built.args) for k in built.kernels])
    return lower(built, o).final_module, kernels[0].args, kernels


def compiled(text: str, strategy: str, block_size: int = 64, ept: int = 4,
             chunk_tiles: int = 16, outputs: str = "all", grid: str = "chunked"
             ) -> tuple[str, tuple[KernelInfo, ...]]:
    module, _, kernels = built_for(text, strategy, block_size, ept, chunk_tiles, outputs, grid)
    return module, kernels


def run(text: str, strategy: str, arrays: dict[str, np.ndarray], C: int, N: int, L: int,
        **kw: Any) -> dict[str, np.ndarray]:
    module, kernels = compiled(text, strategy, **kw)
    return run_cpu(module, kernels, arrays, C, N, L)


def launched(text: str, strategy: str, arrays: dict[str, np.ndarray], C: int, N: int, L: int,
             *, machine: Machine = CPU_MACHINE, **kw: Any) -> dict[str, np.ndarray]:
    """The kernels launched one by one from the manifest (the reference launcher)."""
    module, _, kernels = built_for(text, strategy, **kw)
    return launch_cpu_kernels(module, kernels, arrays, C, N, L, machine=machine)


def close(out: np.ndarray, ref: np.ndarray) -> None:
    scale = np.max(np.abs(ref), axis=-1, keepdims=True)
    err = np.abs(out.astype(np.float64) - ref)
    bad = err > RTOL * (np.abs(ref) + scale)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst error {err.max():.3g}"


def channels(L: int) -> int:
    return 2 if L >= 2**20 else 5


# -- references: plain float64 loops over time ---------------------------------------------------
def ref_scalar(a: np.ndarray, b: np.ndarray, h0: np.ndarray) -> np.ndarray:
    h = np.empty(a.shape)
    prev = h0.astype(np.float64)
    for t in range(a.shape[-1]):
        prev = a[..., t] * prev + b[..., t]
        h[..., t] = prev
    return h


def f32(rng: np.random.Generator, shape: tuple[int, ...], lo: float = -1.0, hi: float = 1.0
        ) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("L", LENGTHS)
def test_scalar(strategy: str, L: int) -> None:
    rng = np.random.default_rng(L)
    C = channels(L)
    a, b, h0 = f32(rng, (C, L), 0.5, 1.0), f32(rng, (C, L)), f32(rng, (C,))
    out = run(SCALAR, strategy, {"a": a, "b": b, "h0": h0}, C, 1, L)
    assert set(out) == {"h"} and out["h"].shape == (C, L)
    close(out["h"], ref_scalar(a.astype(np.float64), b.astype(np.float64), h0))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("L", LENGTHS)
def test_selective_scan(strategy: str, L: int) -> None:
    rng = np.random.default_rng(L + 1)
    C, N = channels(L), 3
    dt, x = f32(rng, (C, L), 0.01, 0.2), f32(rng, (C, L))
    B, Cm = f32(rng, (C, N, L)), f32(rng, (C, N, L))
    A, D, h0 = f32(rng, (C, N), -2.0, -0.1), f32(rng, (C,)), f32(rng, (C, N))
    out = run(MAMBA, strategy, {"dt": dt, "x": x, "B": B, "C": Cm, "A": A, "D": D, "h0": h0},
              C, N, L)
    d, xx = dt.astype(np.float64)[:, None, :], x.astype(np.float64)[:, None, :]
    a = np.exp(d * A.astype(np.float64)[..., None])
    h = ref_scalar(a, d * B * xx, h0)
    y = (Cm * h).sum(axis=1) + D[:, None].astype(np.float64) * x
    assert out["h"].shape == (C, N, L) and out["y"].shape == (C, L)
    close(out["h"], h)
    close(out["y"], y)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("L", LENGTHS)
def test_companion(strategy: str, L: int) -> None:
    rng = np.random.default_rng(L + 2)
    C = channels(L)
    a, c, x, h0 = f32(rng, (C, L), 0.2, 0.6), f32(rng, (C, L), -0.3, 0.3), f32(rng, (C, L)), \
        f32(rng, (C,))
    out = run(COMPANION, strategy, {"a": a, "c": c, "x": x, "h0": h0}, C, 1, L)
    h = np.empty((C, L))
    h1, h2 = h0.astype(np.float64), np.zeros(C)     # h[-1] = h0, h[-2] = 0
    for t in range(L):
        h1, h2 = a[:, t] * h1 + c[:, t] * h2 + x[:, t], h1
        h[:, t] = h1
    close(out["h"], h)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("L", [1, 7, 1000])
def test_coupled_states(strategy: str, L: int) -> None:
    rng = np.random.default_rng(L + 3)
    C = 4
    arrays = {k: f32(rng, (C, L), -0.5, 0.5) for k in ("a", "g", "x", "d")}
    arrays |= {"h0": f32(rng, (C,)), "s0": f32(rng, (C,))}
    out = run(COUPLED, strategy, arrays, C, 1, L)
    w = {k: v.astype(np.float64) for k, v in arrays.items()}
    hh, ss = np.empty((C, L)), np.empty((C, L))
    h, s = w["h0"], w["s0"]
    for t in range(L):
        h, s = w["a"][:, t] * h + w["g"][:, t] * s + w["x"][:, t], 0.5 * h + w["d"][:, t] * s
        hh[:, t], ss[:, t] = h, s
    close(out["h"], hh)
    close(out["s"], ss)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_math_functions_and_scalar_readout(strategy: str) -> None:
    rng = np.random.default_rng(7)
    C, L = 3, 333
    z, x, w = f32(rng, (C, L), -3, 3), f32(rng, (C, L), -3, 3), f32(rng, (C,))
    out = run(GATED, strategy, {"z": z, "x": x, "w": w}, C, 1, L)
    zz, xx = z.astype(np.float64), x.astype(np.float64)
    h = ref_scalar(1 / (1 + np.exp(-zz)), np.log1p(np.exp(xx)), np.zeros(C))
    y = w[:, None] * np.tanh(h / 8) + np.sqrt(np.abs(xx))
    close(out["h"], h)
    close(out["y"], y)


@pytest.mark.parametrize(("block_size", "ept"), [(32, 1), (32, 16), (128, 2)])
def test_blelloch_tile_shapes(block_size: int, ept: int) -> None:
    rng = np.random.default_rng(block_size + ept)
    C, L = 3, 3 * block_size * ept + 5      # several tiles and a ragged tail
    a, b = f32(rng, (C, L), 0.5, 1.0), f32(rng, (C, L))
    out = run(SCALAR, "blelloch", {"a": a, "b": b}, C, 1, L, block_size=block_size, ept=ept)
    close(out["h"], ref_scalar(a.astype(np.float64), b.astype(np.float64), np.zeros(C)))


def test_broadcast_parameters_and_missing_h0() -> None:
    rng = np.random.default_rng(11)
    C, N, L = 2, 4, 50
    arrays = {"dt": f32(rng, (C, L), 0.01, 0.1), "x": f32(rng, (C, L)),
              "B": f32(rng, (C, N, L)), "C": f32(rng, (C, N, L)), "A": f32(rng, (C, N), -1, 0),
              "D": f32(rng, (C,))}
    out = run(MAMBA, "sequential", arrays, C, N, L)
    again = run(MAMBA, "blelloch", arrays, C, N, L)
    np.testing.assert_allclose(out["h"], again["h"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["y"], again["y"], rtol=1e-5, atol=1e-6)


def test_wrong_array_size_is_refused() -> None:
    module, kernels = compiled(SCALAR, "sequential")
    with pytest.raises(ValueError, match="expected shape"):
        run_cpu(module, kernels, {"a": np.zeros((2, 5), np.float32),
                               "b": np.zeros((2, 4), np.float32)}, 2, 1, 5)


# -- the manifest's launch rules, run kernel by kernel on the host --------------------------------
def mamba_inputs(rng: np.random.Generator, C: int, N: int, L: int) -> dict[str, np.ndarray]:
    return {"dt": f32(rng, (C, L), 0.01, 0.2), "x": f32(rng, (C, L)), "B": f32(rng, (C, N, L)),
            "C": f32(rng, (C, N, L)), "A": f32(rng, (C, N), -2.0, -0.1), "D": f32(rng, (C,)),
            "h0": f32(rng, (C, N))}


def mamba_ref(v: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    d, xx = v["dt"].astype(np.float64)[:, None, :], v["x"].astype(np.float64)[:, None, :]
    a = np.exp(d * v["A"].astype(np.float64)[..., None])
    h = ref_scalar(a, d * v["B"] * xx, v["h0"])
    y = (v["C"] * h).sum(axis=1) + v["D"][:, None].astype(np.float64) * v["x"]
    return h, y


def check_mamba(rng: np.random.Generator, C: int, L: int, **launch: Any) -> None:
    """The selective scan (N = 3 lanes) with its readout, launched kernel by kernel."""
    N = 3
    v = mamba_inputs(rng, C, N, L)
    out = launched(MAMBA, "blelloch", v, C, N, L, **launch)
    h, y = mamba_ref(v)
    close(out["h"], h)
    close(out["y"], y)


@pytest.mark.parametrize("L", LENGTHS)
def test_chunked_blelloch_through_the_manifest(L: int) -> None:
    # tiles of 32 x 2 and, on a machine of 256 block slots, chunks of one tile up to L = 1000:
    # every L > 64 crosses chunk boundaries, ragged
    kw = SMALL_TILES
    rng = np.random.default_rng(L + 5)
    C = channels(L)
    a, b, h0 = f32(rng, (C, L), 0.5, 1.0), f32(rng, (C, L)), f32(rng, (C,))
    ref = ref_scalar(a.astype(np.float64), b.astype(np.float64), h0)
    close(launched(SCALAR, "blelloch", {"a": a, "b": b, "h0": h0}, C, 1, L, machine=BIG,
                   **kw)["h"], ref)
    close(run(SCALAR, "blelloch", {"a": a, "b": b, "h0": h0}, C, 1, L, **kw)["h"], ref)
    if L <= 1000:
        check_mamba(rng, C, L, machine=BIG, **kw)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("C", "N", "L"), [(13, 5, 77), (3, 40, 40), (70, 1, 33)])
def test_lane_tiles_across_channels(strategy: str, C: int, N: int, L: int) -> None:
    # sequences of one warp tile span several channels (and a channel spans warps)
    rng = np.random.default_rng(C * N + L)
    v = mamba_inputs(rng, C, N, L)
    out = launched(MAMBA, strategy, v, C, N, L, block_size=64, ept=1, chunk_tiles=1)
    h, y = mamba_ref(v)
    close(out["h"], h)
    close(out["y"], y)


def test_companion_chunk_carries_every_lag() -> None:
    rng = np.random.default_rng(3)
    C, L = 3, 700
    a, c, x, h0 = f32(rng, (C, L), 0.2, 0.6), f32(rng, (C, L), -0.3, 0.3), f32(rng, (C, L)), \
        f32(rng, (C,))
    out = launched(COMPANION, "blelloch", {"a": a, "c": c, "x": x, "h0": h0}, C, 1, L,
                   block_size=32, ept=1, chunk_tiles=2)
    h = np.empty((C, L))
    h1, h2 = h0.astype(np.float64), np.zeros(C)
    for t in range(L):
        h1, h2 = a[:, t] * h1 + c[:, t] * h2 + x[:, t], h1
        h[:, t] = h1
    close(out["h"], h)


def test_workspace_sizes_and_launch_rule() -> None:
    _, args, kernels = built_for(SCALAR, "blelloch", 32, 2, 1)
    ws = [a for a in args if a.role == "workspace"]
    assert [a.name for a in ws] == ["chunk_aggregates", "chunk_carries"]
    assert args[-4].name == "L"                     # workspaces come after C, N, L
    assert args[-1].name == "time_chunk" and args[-1].role == "size"   # then the chunk
    chunk = {"time_chunk": 64}
    assert [a.workspace_size(3, 2, 65, chunk) for a in ws] == [3 * 2 * 2 * 2, 3 * 2 * 2 * 1]
    assert [grid_x(k, 3, 2, 64, chunk) for k in kernels] == [0, 0, 6]
    assert [grid_x(k, 3, 2, 65, chunk) for k in kernels] == [12, 6, 12]
    with pytest.raises(ValueError, match="per call"):
        kernels[0].launched(65)


def grid_x(k: KernelInfo, C: int, N: int, L: int, sizes: dict[str, int]) -> int:
    """Blocks the runtimes launch ``k`` with (0: not launched for this L)."""
    return k.grid(C, N, L, sizes)[0] if k.launched(L, sizes) else 0


def call_sizes(args: tuple[ArgInfo, ...], C: int, N: int, L: int,
               machine: Machine = CPU_MACHINE, time_chunk: int | None = None) -> dict[str, int]:
    return size_values(args, C, N, L, machine, time_chunk)


# -- the chunk length chosen per call ------------------------------------------------------------
# tiles of 64 (32 threads x 2); CPU_MACHINE has 32 x 4 = 128 block slots, BIG has 256
BIG = Machine(sms=64, blocks_per_sm=4)


def test_chunk_rule_of_the_host_machine() -> None:
    _, args, _ = built_for(SCALAR, "blelloch", **SMALL_TILES)
    assert CPU_MACHINE.slots == 128
    # 13 or more sequences (0.1 of the 128 slots): one chunk, the whole sequence in whole tiles
    assert call_sizes(args, 13, 1, 1000)["time_chunk"] == 1024
    assert call_sizes(args, 4, 4, 100)["time_chunk"] == 128
    # fewer: the fewest chunks that give 256 blocks: ceil(256 / 3) = 86 chunks of 157 tiles
    assert call_sizes(args, 3, 1, 10_000)["time_chunk"] == 2 * 64
    assert call_sizes(args, 12, 1, 10_000)["time_chunk"] == 8 * 64       # 22 chunks
    assert call_sizes(args, 1, 1, 10_000)["time_chunk"] == 64            # 256 chunks
    # a short sequence is not cut below one tile; chunk_tiles is the shortest chunk
    assert call_sizes(args, 1, 1, 7)["time_chunk"] == 64
    _, args16, _ = built_for(SCALAR, "blelloch", 32, 2, 16)
    assert call_sizes(args16, 1, 1, 2000)["time_chunk"] == 16 * 64     # not 1 tile
    assert call_sizes(args, 1, 1, 1000, time_chunk=320)["time_chunk"] == 320
    # on a machine with 256 slots 13 sequences are cut again (one tile each here)
    assert call_sizes(args, 13, 1, 1000, BIG)["time_chunk"] == 64


def companion_ref(a: np.ndarray, c: np.ndarray, x: np.ndarray, h0: np.ndarray) -> np.ndarray:
    h = np.empty(a.shape)
    h1, h2 = h0.astype(np.float64), np.zeros(a.shape[0])
    for t in range(a.shape[-1]):
        h1, h2 = a[:, t] * h1 + c[:, t] * h2 + x[:, t], h1
        h[:, t] = h1
    return h


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("path", ["chunked", "unchunked"])
def test_chunked_and_unchunked_paths(L: int, path: str) -> None:
    """The same artifacts and inputs, on a machine the sequences fill (one block each, the
    chunk kernels skipped) and on one they do not (chunks, carries): both match float64."""
    machine = Machine(1, 1) if path == "unchunked" else BIG
    rng = np.random.default_rng(L + 17)
    C = channels(L)
    _, args, kernels = built_for(SCALAR, "blelloch", **SMALL_TILES)
    T = call_sizes(args, C, 1, L, machine)["time_chunk"]
    launched_kernels = [k.name for k in kernels
                        if grid_x(k, C, 1, L, {"time_chunk": T}) > 0]
    if path == "unchunked" or L <= 64:
        assert T >= L and launched_kernels == ["scanweaver_blelloch"]
    else:
        assert T < L and len(launched_kernels) == 3
    a, b, h0 = f32(rng, (C, L), 0.5, 1.0), f32(rng, (C, L)), f32(rng, (C,))
    ref = ref_scalar(a.astype(np.float64), b.astype(np.float64), h0)
    close(launched(SCALAR, "blelloch", {"a": a, "b": b, "h0": h0}, C, 1, L,
                   machine=machine, **SMALL_TILES)["h"], ref)
    # the entry function of the host module takes the same choice
    module, kernels = compiled(SCALAR, "blelloch", **SMALL_TILES)
    close(run_cpu(module, kernels, {"a": a, "b": b, "h0": h0}, C, 1, L, machine=machine)["h"],
          ref)
    # dense 2 x 2 (companion) state
    a, c, x = f32(rng, (C, L), 0.2, 0.6), f32(rng, (C, L), -0.3, 0.3), f32(rng, (C, L))
    out = launched(COMPANION, "blelloch", {"a": a, "c": c, "x": x, "h0": h0}, C, 1, L,
                   machine=machine, **SMALL_TILES)
    close(out["h"], companion_ref(a, c, x, h0))
    # diagonal state with a readout over the lanes
    if L <= 1000 or path == "chunked":
        check_mamba(rng, C, L, machine=machine, **SMALL_TILES)
