"""GPU tests of the readouts summed over the lanes inside the scan kernels (the plan's
``scan.lane_sum``) and of the outputs a compile stores (``scan.store``): the selective scan
presets at several lane counts (not a power of two, a warp, more than a warp), ``y`` alone (the
default) and with ``h`` (the ``-all`` artifacts), on every plan; long chunked sequences; inputs
shared by the channels of a batch row (Mamba's ``B`` and ``C``) read where they are; a
Mamba-sized call (8 x 1536 channels, N = 16, L = 2048) checked on sampled channels against the
float64 reference.

Needs CuPy and a CUDA device (skipped otherwise) and the artifacts of
``python tests/gpu/build_artifacts.py`` (built on the fly where MLIR is importable).
Tolerances as in ``test_cuda_runtime``: 1e-4 on states, 5e-4 on a readout summed over lanes
(``max|out - ref| / max|ref|``, the reference in float64).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

from explorer.errors import RecurrenceError  # noqa: E402
from explorer.runtime.cuda import CudaKernel, gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

from explorer.bench.affine import max_rel_error  # noqa: E402
from explorer.bench.generated import sample_channels  # noqa: E402

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts"
if not (ART / "index.json").exists() and importlib.util.find_spec("mlir") is not None:
    import build_artifacts  # type: ignore[import-not-found]

    build_artifacts.main(["-o", str(ART)])
if not (ART / "index.json").exists():
    pytest.skip("no artifacts: run `python tests/gpu/build_artifacts.py` where MLIR is installed",
                allow_module_level=True)

ARTIFACTS: dict[str, dict[str, Any]] = json.loads((ART / "index.json").read_text())["artifacts"]
TOL = 1e-4
TOL_READOUT = 5e-4
#: the compiled vector recurrences with readouts (the hand-written ABI kernel aside)
LANE_SUMS = sorted(n for n, i in ARTIFACTS.items()
                   if i["vector"] and i.get("source") == "explorer")
SEQUENTIAL = [n for n in LANE_SUMS if ARTIFACTS[n]["strategy"] == "sequential"]
CHUNKED = [n for n in LANE_SUMS if ARTIFACTS[n]["strategy"] != "sequential"
           and "-lookback" not in n]


def _kernel(name: str) -> CudaKernel:
    return CudaKernel.from_artifact(ART / name, poison=True)


def _reference(text: str, **arrays: Any) -> dict[str, Any]:
    import explorer

    try:
        out = explorer.reference(text, **arrays)
    except ImportError as err:  # the float64 reference needs sympy
        pytest.skip(f"explorer.reference is unavailable here: {err}")
    assert isinstance(out, dict)
    return out


def _inputs(kernel: CudaKernel, C: int, L: int, N: int, seed: int, xp: Any = np
            ) -> dict[str, Any]:
    """Decays in (0, 1) (dt > 0, A < 0), the rest uniform in [-1, 1], float32."""
    rng = xp.random.default_rng(seed) if xp is np else None
    out: dict[str, Any] = {}
    for i, s in enumerate(kernel.specs):
        shape = (C,) + ((N,) if s.lane else ()) + ((L,) if s.timed else ())
        lo, hi = {"dt": (0.01, 0.2), "A": (-2.0, -0.5)}.get(s.name, (-1.0, 1.0))
        if xp is np:
            out[s.name] = rng.uniform(lo, hi, shape).astype(np.float32)
        else:
            xp.random.seed(seed + i)
            out[s.name] = xp.random.uniform(lo, hi, shape, dtype=xp.float32)
    return out


def _outputs(kernel: CudaKernel, got: Any) -> dict[str, Any]:
    return got if isinstance(got, dict) else {kernel.output_names[0]: got}


def _check(name: str, kernel: CudaKernel, got: Any, want: dict[str, Any]) -> None:
    outs = _outputs(kernel, got)
    assert tuple(outs) == tuple(ARTIFACTS[name]["outputs"]) == kernel.output_names
    for o, v in outs.items():
        err = max_rel_error(cp.asnumpy(v) if isinstance(v, cp.ndarray) else v, want[o])
        tol = TOL if kernel.output_lane[o] else TOL_READOUT
        assert err <= tol, f"{name} {o}: max rel err {err:.2e}"


@pytest.mark.parametrize("N", [3, 16, 32, 40])
@pytest.mark.parametrize("name", LANE_SUMS)
def test_lane_counts(name: str, N: int) -> None:
    """N not a power of two (channels across warps), a warp, more than a warp (a channel over
    two warps of the block; the tree plans loop over any N)."""
    kernel = _kernel(name)
    C, L = 5, 300
    arrays = _inputs(kernel, C, L, N, seed=N * 7 + C)
    _check(name, kernel, kernel(**arrays), _reference(ARTIFACTS[name]["recurrence"], **arrays))


@pytest.mark.parametrize("name", SEQUENTIAL)
def test_more_lanes_than_a_block_are_refused(name: str) -> None:
    """The sequential plan keeps a channel's lanes in one block of 128 threads: N = 129 is
    refused before any launch, with what fits."""
    kernel = _kernel(name)
    arrays = _inputs(kernel, 2, 10, 129, seed=1)
    with pytest.raises(RecurrenceError, match="do not fit"):
        kernel(**arrays)


@pytest.mark.parametrize(("C", "N", "L"), [(1, 16, 2**16), (3, 5, 40_000)])
@pytest.mark.parametrize("name", CHUNKED)
def test_lane_loop_across_chunks(name: str, C: int, N: int, L: int) -> None:
    """Few channels, long sequences: the chunked grid (reduce and carry per lane, the scan
    kernel a chunk of a channel a block, its lanes in turn); the device's chunk length and
    forced ones of one and three tiles."""
    kernel = _kernel(name)
    arrays = _inputs(kernel, C, L, N, seed=L + N)
    want = _reference(ARTIFACTS[name]["recurrence"], **arrays)
    rule = kernel.artifact.kernels[0].args[-1].chunk_rule
    assert rule is not None
    for forced in (None, rule.tile, 3 * rule.tile):
        run = kernel.prepare(time_chunk=forced, **arrays)
        run.launch()
        _check(name, kernel, run.result(), want)


def _mamba_layout(kernel: CudaKernel, batch: int, D: int, N: int, L: int, seed: int
                  ) -> dict[str, Any]:
    """Mamba's layout on the GPU: inputs with the lane axis (B, C) per batch row,
    ``(batch, 1, N, L)``; the other inputs per channel, ``(batch, D, L)``; parameters
    ``(D, ...)``, shared by the batch rows (decays: dt > 0, A < 0)."""
    from explorer.bench.inputs import mamba_shape

    out: dict[str, Any] = {}
    for i, s in enumerate(kernel.specs):
        lo, hi = {"dt": (0.01, 0.2), "A": (-2.0, -0.5)}.get(s.name, (-1.0, 1.0))
        cp.random.seed(seed + i)
        out[s.name] = cp.random.uniform(lo, hi, mamba_shape(s, batch, D, N, L),
                                        dtype=cp.float32)
    return out


def _sampled_reference(name: str, arrays: dict[str, Any], D: int, channels: Any) -> Any:
    """The float64 y of the sampled channels (channel c is batch row c // D, column c % D)."""
    import explorer

    rows = []
    for c in channels:
        b, d = int(c) // D, int(c) % D
        one = {}
        for k, v in arrays.items():
            if v.ndim == 4:           # (batch, 1, N, L)
                one[k] = cp.asnumpy(v[b, 0])
            elif v.ndim == 3:         # (batch, D, L)
                one[k] = cp.asnumpy(v[b, d])
            else:                     # (D, ...)
                one[k] = cp.asnumpy(v[d])
        try:
            rows.append(explorer.reference(ARTIFACTS[name]["recurrence"], **one)["y"])
        except ImportError as err:
            pytest.skip(f"explorer.reference is unavailable here: {err}")
    return np.stack(rows)


@pytest.mark.parametrize("name", [n for n in SEQUENTIAL + CHUNKED if not n.endswith("-all")])
def test_mamba_size_on_sampled_channels(name: str) -> None:
    """batch 8 x D 1536 channels, N = 16, L = 2048 in Mamba's layout (B and C per batch row,
    read where they are: a row per 1536 channels), y alone; the float64 reference on 24
    channels spread over the batch, first and last among them."""
    kernel = _kernel(name)
    batch, D, N, L = 8, 1536, 16, 2048
    arrays = _mamba_layout(kernel, batch, D, N, L, seed=5)
    run = kernel.prepare(**arrays)
    lane_inputs = {s.name for s in kernel.specs if s.timed and s.lane}
    # the lane inputs are not copied per channel: a row per batch row
    for n in lane_inputs:
        assert run.inputs[n].shape == (batch, N, L), n
    run.launch()
    y = run.result()
    assert y.shape == (batch, D, L) and kernel.output_names == ("y",)
    channels = sample_channels(batch * D, 24)
    want = _sampled_reference(name, arrays, D, channels)
    got = cp.asnumpy(y.reshape(batch * D, L)[cp.asarray(channels)])
    err = max_rel_error(got, want)
    assert err <= TOL_READOUT, f"{name}: max rel err {err:.2e} on channels {channels}"
    del arrays, y, run
    cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("name", LANE_SUMS)
def test_inputs_shared_by_batch_rows(name: str) -> None:
    """A small Mamba layout on every plan: B and C read with a row per batch row give what
    the same inputs copied per channel give."""
    kernel = _kernel(name)
    batch, D, N, L = 3, 7, 5, 300
    arrays = _mamba_layout(kernel, batch, D, N, L, seed=8)
    shared = kernel(**arrays)
    copied = kernel(**{k: (cp.ascontiguousarray(cp.broadcast_to(v, (batch, D, *v.shape[2:])))
                           if v.ndim == 4 else v) for k, v in arrays.items()})
    shared = _outputs(kernel, shared)
    copied = _outputs(kernel, copied)
    for o in shared:
        np.testing.assert_allclose(cp.asnumpy(shared[o]), cp.asnumpy(copied[o]),
                                   rtol=1e-5, atol=1e-6)
    want = _sampled_reference(name, arrays, D, np.arange(batch * D))
    err = max_rel_error(cp.asnumpy(shared["y"]).reshape(batch * D, L), want)
    assert err <= TOL_READOUT, f"{name}: max rel err {err:.2e}"


@pytest.mark.parametrize("name", [n for n in LANE_SUMS if n.endswith("-all")])
def test_storing_the_states_leaves_the_readout_unchanged(name: str) -> None:
    """The same plan with and without h stored gives the same y (the same arithmetic)."""
    every, alone = _kernel(name), _kernel(name[:-len("-all")])
    arrays = _inputs(every, 6, 500, 16, seed=3)
    both = every(**arrays)
    assert set(both) == {"h", "y"}
    np.testing.assert_allclose(alone(**arrays), both["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in LANE_SUMS if n.startswith("mamba-selective-scan")])
def test_softplus_and_sigmoid_far_past_the_range_of_exp(name: str) -> None:
    """``dt + dt_bias`` past 88 (softplus written as ``log(1 + exp(x))`` was inf there) and
    ``z`` below -88 (the gate ``z * sigmoid(z)``): every output finite and as float64, on every
    plan, ``fast_math="fast"`` included (its ``exp`` is ``ex2.approx``)."""
    kernel = _kernel(name)
    C, L, N = 4, 300, 16
    arrays = _inputs(kernel, C, L, N, seed=11)
    arrays["dt"] = (arrays["dt"] + 95.0).astype(np.float32)
    z = arrays["z"].copy()
    z[:, ::3] -= 120.0
    arrays["z"] = z.astype(np.float32)
    want = _reference(ARTIFACTS[name]["recurrence"], **arrays)
    got = _outputs(kernel, kernel(**arrays))
    for o, v in got.items():
        assert np.all(np.isfinite(cp.asnumpy(v) if isinstance(v, cp.ndarray) else v)), o
    _check(name, kernel, got, want)


def _torch_mamba(kernel: CudaKernel, seed: int) -> tuple[Any, dict[str, Any]]:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    arrays = _mamba_layout(kernel, 3, 7, 5, 300, seed=seed)
    return torch, {k: torch.from_dlpack(v).clone() for k, v in arrays.items()}


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("name", [n for n in LANE_SUMS if n.startswith("mamba-selective-scan")
                                  and not n.endswith("-all")])
def test_torch_plan_reads_the_parameters_of_each_call(name: str, per_row: bool) -> None:
    """Torch calls of one signature share a launch plan. Parameters given per channel of the
    trailing batch axes (A, D, dt_bias of (D, ...)) are read where they are (the kernels' row
    modulus); a parameter given per batch row (``per_row``: dt_bias of (batch, 1)) is
    broadcast into a buffer of the plan by every call. Either way a parameter changed in place,
    or through ``.data`` (which torch's version counter does not see), is read anew, and each
    call's y (added into by the kernels) starts from zero: as the checking path (CuPy arrays)
    on the same values."""
    kernel = _kernel(name)
    torch, t = _torch_mamba(kernel, seed=11)
    if per_row:
        t["dt_bias"] = torch.linspace(-0.5, 0.5, 3, device=t["x"].device).reshape(3, 1)
    params = [s.name for s in kernel.specs if not s.timed]
    assert params, "the preset has parameters given per channel"

    def checked() -> Any:
        return kernel(**{k: cp.from_dlpack(v) for k, v in t.items()})

    def same(x: Any, y: Any) -> None:
        np.testing.assert_allclose(cp.asnumpy(cp.from_dlpack(x)), cp.asnumpy(y), rtol=1e-6,
                                   atol=1e-6)

    first = kernel(**t)
    assert len(kernel._plans.plans) == 1
    copied = {lay.name for lay in next(iter(kernel._plans.plans.values())).layouts
              if not lay.direct}
    assert copied == ({"dt_bias"} if per_row else set())
    same(first, checked())
    for i, p in enumerate(params):
        if i % 2:
            t[p].data.mul_(0.5)
        else:
            t[p].mul_(0.5)
        again = kernel(**t)
        assert len(kernel._plans.plans) == 1
        assert float((again - first).abs().max()) > 1e-3, p
        same(again, checked())


@pytest.mark.parametrize("name", ["mamba-selective-scan-warp_shuffle-fast"])
def test_torch_plan_calls_from_threads(name: str) -> None:
    """Threads calling one plan (the same signature and stream) with parameters of their own:
    each gets its own answer (a call's copies and launches are enqueued together)."""
    import threading

    if name not in ARTIFACTS:
        pytest.skip(f"no artifact {name}")
    kernel = _kernel(name)
    torch, base = _torch_mamba(kernel, seed=12)
    scales = (0.25, 0.5, 0.75, 1.0)
    timed = {s.name for s in kernel.specs if s.timed}
    calls = [{k: (v if k in timed else v * s) for k, v in base.items()} for s in scales]
    want = [cp.asnumpy(kernel(**{k: cp.from_dlpack(v) for k, v in c.items()})) for c in calls]
    torch.cuda.synchronize()
    got: list[list[Any]] = [[] for _ in scales]

    def work(j: int) -> None:
        for _ in range(25):
            got[j].append(kernel(**calls[j]))

    threads = [threading.Thread(target=work, args=(j,)) for j in range(len(scales))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    torch.cuda.synchronize()
    assert len(kernel._plans.plans) == 1
    for j, outs in enumerate(got):
        assert len(outs) == 25
        for y in outs:
            np.testing.assert_allclose(y.cpu().numpy(), want[j], rtol=1e-6, atol=1e-6)
