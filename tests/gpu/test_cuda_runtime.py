"""GPU tests of the CUDA runtime: every artifact against a float64 reference, input kinds, errors.

Needs CuPy and a CUDA device (the module is skipped otherwise) and the artifacts built by
``python tests/gpu/build_artifacts.py`` (or MLIR importable here, then they are built on the fly).

Tolerances, all on ``max|out - ref| / max|ref|`` with the reference in float64:
- states of scalar recurrences: 1e-4 (float32 rounding accumulates over the scan, but the decays
  in (0.5, 1) keep the error near the last few hundred steps);
- the selective scan: 1e-4 on the states h, 5e-4 on the readout y (a sum over N = 16 lanes).
Every output buffer is filled with NaN before the launch, so an element the kernel does not
write fails the check.

Sizes: L in {1, 31, 32, 33, 1000, 4096, 4097, 2**20} x C in {1, 7, 4096, 131072} for the plain
affine scan (4096 steps the short kernel's longest, 4097 the plain or look-back kernel's);
combinations with more than 2**27 elements (512 MiB per float32 array, several arrays and a
float64 reference) are skipped for memory and time.  Other recurrences run a smaller grid, as
their reference runs on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

from explorer.errors import LaunchError, RecurrenceError  # noqa: E402
from explorer.runtime.cuda import CudaKernel, gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

from explorer.bench.affine import affine_scan_f64, max_rel_error, random_problem  # noqa: E402
from explorer.runtime.artifact import load_artifact, write_artifact  # noqa: E402

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts"

if not (ART / "index.json").exists() and importlib.util.find_spec("mlir") is not None:
    import build_artifacts  # type: ignore[import-not-found]

    build_artifacts.main(["-o", str(ART)])
if not (ART / "index.json").exists():
    pytest.skip("no artifacts: run `python tests/gpu/build_artifacts.py` where MLIR is installed",
                allow_module_level=True)

INDEX: dict[str, Any] = json.loads((ART / "index.json").read_text())
ARTIFACTS: dict[str, dict[str, Any]] = INDEX["artifacts"]

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
TOL = 1e-4
TOL_READOUT = 5e-4
MAX_ELEMENTS = 2**27

LENGTHS = [1, 31, 32, 33, 1000, 4096, 4097, 2**20]
CHANNELS = [1, 7, 4096, 131072]


def _names(pred: Any) -> list[str]:
    return sorted(n for n, info in ARTIFACTS.items() if pred(info))


AFFINE_ARTS = _names(lambda i: i["recurrence"] == AFFINE)
VECTOR_ARTS = _names(lambda i: i["vector"])
OTHER_ARTS = _names(lambda i: not i["vector"] and i["recurrence"] != AFFINE)


def _kernel(name: str) -> CudaKernel:
    return CudaKernel.from_artifact(ART / name, poison=True)


def _reference(text: str, **arrays: Any) -> Any:
    import explorer

    try:
        return explorer.reference(text, **arrays)
    except ImportError as err:  # the float64 reference of a general recurrence needs sympy
        pytest.skip(f"explorer.reference is unavailable here: {err}")


def test_index_has_no_compile_failures() -> None:
    assert ARTIFACTS, "no artifacts were built"
    assert not INDEX.get("failed"), f"artifacts that failed to compile: {INDEX['failed']}"


# --- the plain affine scan, the full size grid -----------------------------------------------

@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("C", CHANNELS)
@pytest.mark.parametrize("name", AFFINE_ARTS)
def test_affine_scan_sizes(name: str, C: int, L: int) -> None:
    if C * L > MAX_ELEMENTS:
        pytest.skip(f"C*L = {C * L} > 2**27 elements (memory and time)")
    a, b = random_problem(C, L, seed=C * 7 + L, xp=cp)
    h = _kernel(name)(a=a, b=b)
    assert isinstance(h, cp.ndarray) and h.shape == (C, L) and h.dtype == cp.float32
    err = max_rel_error(h, affine_scan_f64(a, b, xp=cp), xp=cp)
    assert err <= TOL, f"{name} C={C} L={L}: max rel err {err:.2e}"


BLELLOCH_AFFINE = [n for n in AFFINE_ARTS if ARTIFACTS[n].get("strategy") == "blelloch"]


def _grid(kernel: CudaKernel) -> str:
    """The grid the plan chose (the option may say ``auto``): the look-back kernels alone take
    the tiles' flags."""
    from explorer.frontend.names import TILE_FLAGS

    return ("lookback" if any(a.name == TILE_FLAGS for k in kernel.artifact.kernels
                              for a in k.args) else "chunked")


@pytest.mark.parametrize(("C", "L"), [(1, 2**20), (16, 100_003), (1024, 16384)])
@pytest.mark.parametrize("name", BLELLOCH_AFFINE)
def test_chunk_length_chosen_per_call(name: str, C: int, L: int) -> None:
    """The same inputs scanned with the device's choice, unchunked (one block a sequence) and
    with short chunks (look-back: one tile a block; chunked: reduce, carry, rescan) all match
    the float64 reference; a chunk the look-back kernel cannot take is refused."""
    from explorer.runtime.artifact import choose_time_chunk
    from explorer.runtime.cuda import device_machine

    kernel = _kernel(name)
    lookback = _grid(kernel) == "lookback"
    a, b = random_problem(C, L, seed=C + L, xp=cp)
    ref = affine_scan_f64(a, b, xp=cp)
    rule = kernel.artifact.kernels[0].args[-1].chunk_rule
    assert rule is not None
    machine = device_machine(kernel.artifact)
    assert machine.sms >= 1 and machine.blocks_per_sm >= 1
    for forced in (None, L, rule.tile, 3 * rule.tile):
        if lookback and forced == 3 * rule.tile and forced < L:
            with pytest.raises(ValueError, match="at most"):
                kernel.prepare(time_chunk=forced, a=a, b=b)
            continue
        run = kernel.prepare(time_chunk=forced, a=a, b=b)
        run.launch()
        h = run.result()
        chosen = run.sizes["time_chunk"]
        launched = [k.name for k, *_ in run._bound]
        expect = choose_time_chunk(rule, C, 1, L, machine) if forced is None else forced
        assert chosen == expect
        # look-back: the scan kernel alone; chunked: reduce, carry, scan when cut
        assert len(launched) == (1 if lookback or chosen >= L else 3), launched
        err = max_rel_error(h, ref, xp=cp)
        assert err <= TOL, f"{name} C={C} L={L} time_chunk={chosen}: max rel err {err:.2e}"


LOOKBACK_AFFINE = [n for n in AFFINE_ARTS
                   if ARTIFACTS[n].get("strategy") in ("blelloch", "kogge_stone")
                   and n.endswith("-lookback")]


@pytest.mark.parametrize(("C", "L"), [(1, 2**22), (3, 1_000_003), (64, 2**16)])
@pytest.mark.parametrize("name", LOOKBACK_AFFINE)
def test_lookback_many_tiles_and_repeated_launches(name: str, C: int, L: int) -> None:
    """Thousands of tiles a sequence (the small-tile variants: 32 steps a tile, so the
    look-back walks windows of 32 tiles and waits on tiles still running), launched three
    times on the same buffers: the flags are zeroed before each launch, so every launch gives
    the float64 answer (a stale flag would hand over the last launch's state)."""
    kernel = _kernel(name)
    a, b = random_problem(C, L, seed=C * 3 + L, xp=cp)
    ref = affine_scan_f64(a, b, xp=cp)
    run = kernel.prepare(a=a, b=b)
    assert run.sizes["time_chunk"] < L, "the call was not cut into tiles"
    for attempt in range(3):
        run.outputs["h"].fill(cp.nan)
        run.launch()
        err = max_rel_error(run.result(), ref, xp=cp)
        assert err <= TOL, f"{name} C={C} L={L} launch {attempt}: max rel err {err:.2e}"


@pytest.mark.parametrize("name", AFFINE_ARTS)
def test_affine_initial_state_and_batch_broadcast(name: str) -> None:
    rng = np.random.default_rng(3)
    L = 777
    a = (0.5 + 0.5 * rng.random((2, 3, L))).astype(np.float32)
    b = rng.standard_normal((3, L)).astype(np.float32)  # broadcast over the leading 2
    h0 = rng.standard_normal((2, 1)).astype(np.float32)  # broadcast over the 3
    h = _kernel(name)(a=a, b=b, h0=h0)
    assert isinstance(h, np.ndarray) and h.shape == (2, 3, L)
    bb = np.broadcast_to(b, (2, 3, L)).reshape(6, L)
    want = affine_scan_f64(a.reshape(6, L), bb,
                           h0=np.broadcast_to(h0, (2, 3)).reshape(6)).reshape(2, 3, L)
    assert max_rel_error(h, want) <= TOL


# --- other scalar recurrences and the selective scan (reference on the CPU) -------------------

def _inputs(kernel: CudaKernel, C: int, L: int, N: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for s in kernel.specs:
        shape = (C,) + ((N,) if s.lane else ()) + ((L,) if s.timed else ())
        if s.name == "dt":
            v = rng.uniform(0.01, 0.2, shape)  # a step size: positive
        elif s.name == "A":
            v = -rng.uniform(0.5, 2.0, shape)  # decays: exp(dt * A) in (0, 1)
        else:
            v = rng.standard_normal(shape)
        out[s.name] = v.astype(np.float32)
    return out


@pytest.mark.parametrize("L", [1, 33, 1000, 4096])
@pytest.mark.parametrize("C", [1, 7, 4096])
@pytest.mark.parametrize("name", OTHER_ARTS)
def test_scalar_recurrences(name: str, C: int, L: int) -> None:
    kernel = _kernel(name)
    arrays = _inputs(kernel, C, L, 1, seed=C + L)
    got = kernel(**arrays)
    want = _reference(ARTIFACTS[name]["recurrence"], **arrays)
    err = max_rel_error(got, want)
    assert err <= TOL, f"{name} C={C} L={L}: max rel err {err:.2e}"


def _check_vector(name: str, kernel: CudaKernel, got: Any, want: dict[str, Any], C: int,
                  N: int, L: int) -> None:
    """Every output the artifact stores (y alone by default, h too when built with
    outputs="all") against the reference."""
    outs = got if isinstance(got, dict) else {kernel.output_names[0]: got}
    assert tuple(outs) == kernel.output_names
    if kernel.artifact.manifest.get("strategy") != "abi-reference":
        assert set(outs) == set(ARTIFACTS[name].get("outputs", outs))
    for o, v in outs.items():
        lane = kernel.output_lane[o]
        assert v.shape == ((C, N, L) if lane else (C, L))
        err = max_rel_error(v, want[o])
        assert err <= (TOL if lane else TOL_READOUT), f"{name} {o}: max rel err {err:.2e}"


@pytest.mark.parametrize("N", [1, 16])
@pytest.mark.parametrize("L", [1, 33, 1000])
@pytest.mark.parametrize("C", [1, 7, 256])
@pytest.mark.parametrize("name", VECTOR_ARTS)
def test_selective_scan(name: str, C: int, L: int, N: int) -> None:
    kernel = _kernel(name)
    arrays = _inputs(kernel, C, L, N, seed=C * 31 + L + N)
    got = kernel(**arrays)
    want = _reference(ARTIFACTS[name]["recurrence"], **arrays)
    _check_vector(name, kernel, got, want, C, N, L)


@pytest.mark.parametrize("name", VECTOR_ARTS)
def test_selective_scan_initial_state(name: str) -> None:
    kernel = _kernel(name)
    arrays = _inputs(kernel, 5, 100, 16, seed=11)
    h0 = np.random.default_rng(12).standard_normal((5, 16)).astype(np.float32)
    got = kernel(**arrays, h0=h0)
    want = _reference(ARTIFACTS[name]["recurrence"], **arrays, h0=h0)
    _check_vector(name, kernel, got, want, 5, 16, 100)


# --- input kinds --------------------------------------------------------------------------

KIND_ART = AFFINE_ARTS[0] if AFFINE_ARTS else None
needs_affine = pytest.mark.skipif(KIND_ART is None, reason="no affine-scan artifact")


@needs_affine
def test_numpy_in_numpy_out() -> None:
    a, b = random_problem(9, 300, seed=1)
    h = _kernel(KIND_ART)(a=a, b=b)  # type: ignore[arg-type]
    assert isinstance(h, np.ndarray) and h.shape == (9, 300)
    assert max_rel_error(h, affine_scan_f64(a, b)) <= TOL


@needs_affine
def test_cupy_non_contiguous_is_made_contiguous() -> None:
    a, b = random_problem(8, 600, seed=2, xp=cp)
    a_view, b_view = a[:, ::2], b.T.copy().T[:, ::2]  # strided views, (8, 300)
    assert not a_view.flags.c_contiguous
    h = _kernel(KIND_ART)(a=a_view, b=b_view)  # type: ignore[arg-type]
    assert isinstance(h, cp.ndarray)
    want = affine_scan_f64(cp.ascontiguousarray(a_view), cp.ascontiguousarray(b_view), xp=cp)
    assert max_rel_error(h, want, xp=cp) <= TOL


@needs_affine
def test_torch_cuda_tensors_zero_copy_and_torch_out() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    a, b = random_problem(16, 512, seed=4, xp=cp)
    ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
    kernel = _kernel(KIND_ART)
    h = kernel(a=ta, b=tb)  # type: ignore[arg-type]
    assert isinstance(h, torch.Tensor) and h.is_cuda and h.shape == (16, 512)
    assert max_rel_error(cp.from_dlpack(h), affine_scan_f64(a, b, xp=cp), xp=cp) <= TOL
    # the call went through a cached launch plan, and a second call reuses it with the same
    # result as the checking path on the same values (CuPy arrays)
    assert len(kernel._plans.plans) == 1
    again = kernel(a=ta, b=tb)  # type: ignore[arg-type]
    assert len(kernel._plans.plans) == 1
    assert bool(cp.array_equal(cp.from_dlpack(again), kernel(a=a, b=b)))
    # a transposed (non-contiguous) tensor is accepted and copied to the canonical layout
    tat = ta.T.contiguous().T
    h2 = _kernel(KIND_ART)(a=tat[:, :256], b=tb[:, :256])  # type: ignore[arg-type]
    want = affine_scan_f64(a[:, :256], b[:, :256], xp=cp)
    assert max_rel_error(cp.from_dlpack(h2), want, xp=cp) <= TOL


@needs_affine
def test_torch_cpu_tensors_give_torch_cpu_out() -> None:
    torch = pytest.importorskip("torch")
    a, b = random_problem(3, 50, seed=5)
    h = _kernel(KIND_ART)(a=torch.from_numpy(a), b=torch.from_numpy(b))  # type: ignore[arg-type]
    assert isinstance(h, torch.Tensor) and not h.is_cuda
    assert max_rel_error(h.numpy(), affine_scan_f64(a, b)) <= TOL


@needs_affine
def test_empty_time_axis() -> None:
    a = np.zeros((3, 0), np.float32)
    h = _kernel(KIND_ART)(a=a, b=a)  # type: ignore[arg-type]
    assert h.shape == (3, 0)


# --- errors -------------------------------------------------------------------------------

@needs_affine
@pytest.mark.parametrize("bad, match", [
    ({"a": np.ones((2, 8), np.float64)}, r"\ba\b.*float64"),
    ({"b": np.ones((2, 8), np.int32)}, r"\bb\b.*int32"),
    ({"b": np.ones((2, 9), np.float32)}, r"time axes|length|\bL\b"),
    ({"b": np.ones((3, 8), np.float32)}, r"broadcast"),
])
def test_wrong_dtype_or_shape_raises_before_launch(bad: dict[str, Any], match: str) -> None:
    arrays = {"a": np.ones((2, 8), np.float32), "b": np.ones((2, 8), np.float32), **bad}
    with pytest.raises(RecurrenceError, match=match):
        _kernel(KIND_ART)(**arrays)  # type: ignore[arg-type]


@needs_affine
def test_missing_and_unknown_arrays() -> None:
    k = _kernel(KIND_ART)  # type: ignore[arg-type]
    with pytest.raises(RecurrenceError, match="missing.*b"):
        k(a=np.ones((2, 8), np.float32))
    with pytest.raises(RecurrenceError, match="unexpected.*zz"):
        k(a=np.ones((2, 8), np.float32), b=np.ones((2, 8), np.float32),
          zz=np.ones(3, np.float32))


@needs_affine
def test_cast_true_accepts_float64() -> None:
    a, b = random_problem(4, 64, seed=6)
    k = CudaKernel.from_artifact(ART / KIND_ART, cast=True)  # type: ignore[operator]
    h = k(a=a.astype(np.float64), b=b.astype(np.float64))
    assert max_rel_error(h, affine_scan_f64(a, b)) <= TOL


@needs_affine
def test_launch_error_names_geometry_and_process_stays_usable(tmp_path: Path) -> None:
    art = load_artifact(ART / KIND_ART)  # type: ignore[operator]
    manifest = json.loads(json.dumps(art.manifest))
    too_much = 4 * 1024 * 1024  # far beyond any GPU's shared memory per block
    for k in manifest["kernels"]:
        k["shared_bytes"] = too_much
    write_artifact(tmp_path / "bad", dict(art.ptx_text), manifest)
    a, b = random_problem(4, 64, seed=7)
    with pytest.raises(LaunchError) as info:
        CudaKernel.from_artifact(tmp_path / "bad")(a=a, b=b)
    text = str(info.value)
    assert manifest["kernels"][0]["name"] in text
    assert "grid" in text and "block" in text and str(too_much) in text
    # the context survived: the good artifact still runs and is right
    h = _kernel(KIND_ART)(a=a, b=b)  # type: ignore[arg-type]
    assert max_rel_error(h, affine_scan_f64(a, b)) <= TOL
    assert math.isfinite(float(np.abs(h).max()))


@needs_affine
def test_torch_launch_from_a_new_thread() -> None:
    """A thread that has not used CUDA yet (no context current: torch's allocator hands out
    cached memory without a runtime call) launches a cached plan and gets the same result."""
    import threading

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    a, b = random_problem(64, 700, seed=11, xp=cp)
    ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
    kernel = _kernel(KIND_ART)
    want = kernel(a=ta, b=tb)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    got: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(3):
                got.append(kernel(a=ta, b=tb))  # type: ignore[arg-type]
            torch.cuda.synchronize()
        except BaseException as err:  # noqa: BLE001 - reported in the main thread
            errors.append(err)

    for _ in range(2):   # a second thread: the plan is cached, nothing is built there
        t = threading.Thread(target=run)
        t.start()
        t.join()
    assert not errors, errors[0]
    assert len(got) == 6 and all(bool(torch.equal(g, want)) for g in got)
