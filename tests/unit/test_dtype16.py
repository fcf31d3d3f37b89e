"""16-bit inputs on the CPU: the options, the contract's dtypes, the IR (bf16/f16 buffers, extf
loads, truncf stores), the host rounding, runs against the float64 reference of the rounded
inputs, the bench's byte count and tolerance, and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import explorer as ex
from explorer.bench.affine import TOLERANCE, affine_scan_f64, max_rel_error, tolerance
from explorer.codegen.options import validate
from explorer.errors import OptionError, RecurrenceError
from explorer.frontend.names import AGGREGATES, CARRIES
from explorer.runtime.contract import ArtifactError, parse_kernels
from explorer.runtime.dtypes import (
    FLOAT16_MAX,
    from_storage,
    round_bf16,
    storage,
    to_storage,
    widen_bf16,
)

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


# --- options -------------------------------------------------------------------------------

def test_dtype_and_out_dtype_options() -> None:
    assert validate(dtype="bfloat16").output_dtype == "bfloat16"
    assert validate(dtype="float16", out_dtype="float32").output_dtype == "float32"
    # the input dtype spelled again is the default: one cache key for one choice
    assert validate(dtype="bfloat16", out_dtype="bfloat16") == validate(dtype="bfloat16")
    with pytest.raises(OptionError, match="unsupported dtype 'float64'; choose one of "
                                          "float32, bfloat16, float16"):
        validate(dtype="float64")
    with pytest.raises(OptionError, match="input dtype or in float32"):
        validate(dtype="float16", out_dtype="bfloat16")
    with pytest.raises(OptionError, match="unsupported out_dtype"):
        validate(dtype="bfloat16", out_dtype="int8")
    with pytest.raises(OptionError, match="unsupported dtype"):
        validate(dtype=["bfloat16"])


# --- the contract ---------------------------------------------------------------------------

def _args(c: ex.Compiled) -> dict[str, str]:
    return {a.name: a.dtype for a in c.contract[0].args}


def test_contract_carries_the_dtype_of_every_argument() -> None:
    c = ex.compile(AFFINE, target="cpu", strategy="blelloch", dtype="bfloat16")
    dtypes = _args(c)
    assert dtypes["a"] == dtypes["b"] == dtypes["h"] == "bfloat16"
    assert dtypes["h0"] == "float32"
    assert {dtypes[n] for n in (AGGREGATES, CARRIES)} == {"float32"}
    assert {dtypes[n] for n in ("C", "N", "L")} == {"int64"}
    c32 = ex.compile(AFFINE, target="cpu", strategy="sequential", dtype="float16",
                     out_dtype="float32")
    assert _args(c32)["a"] == "float16" and _args(c32)["h"] == "float32"


def _kernel(args: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{"name": "k", "block": [128, 1, 1], "sequences_per_block": 128, "shared_bytes": 0,
             "args": args}]


def _arg(name: str, role: str, dtype: str) -> dict[str, object]:
    return {"name": name, "role": role, "timed": role in ("input", "output"), "lane": False,
            "dtype": dtype}


SIZE_ARGS = [_arg(n, "size", "int64") for n in ("C", "N", "L")]


def test_runtime_contract_reads_16bit_inputs_and_refuses_them_elsewhere() -> None:
    kernels = parse_kernels(_kernel([_arg("a", "input", "bfloat16"),
                                     _arg("h", "output", "float16"), *SIZE_ARGS]))
    assert [a.dtype for a in kernels[0].args[:2]] == ["bfloat16", "float16"]
    with pytest.raises(ArtifactError, match=r"array argument 'h0' \(h0\) must be float32"):
        parse_kernels(_kernel([_arg("h0", "h0", "bfloat16"), *SIZE_ARGS]))
    with pytest.raises(ArtifactError, match="has dtype 'float64'"):
        parse_kernels(_kernel([_arg("a", "input", "float64"), *SIZE_ARGS]))


# --- the IR ---------------------------------------------------------------------------------

def test_cuda_ir_and_ptx_show_16bit_buffers() -> None:
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch", dtype="bfloat16")
    lowered = next(p.ir for p in c.passes if p.name == "scan-lower")
    assert "memref<?xbf16>" in lowered and "arith.extf" in lowered
    assert "arith.truncf" in lowered and " : f32 to bf16" in lowered
    ptx = c.stages["ptx"].text
    assert "ld.global.b16" in ptx or "ld.global.u16" in ptx
    assert "cvt.rn.bf16.f32" in ptx
    f32 = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    assert "bf16" not in next(p.ir for p in f32.passes if p.name == "scan-lower")


def test_wide_loads_branch_gives_16bit_vectors_widened_after_it() -> None:
    """A tile's wide load and its element-by-element fallback give the 16-bit vector from
    their branch; it is widened after the branch (where the code using it is), so a load
    issued ahead of its use is not waited for at once by its widening."""
    import re

    for dtype, elem in (("bfloat16", "bf16"), ("float16", "f16")):
        c = ex.compile(AFFINE, target="cuda", strategy="blelloch", dtype=dtype)
        lowered = next(p.ir for p in c.passes if p.name == "scan-lower")
        results = re.findall(r"scf\.if [^\n]*-> \(([^)]*)\)", lowered)
        assert any(f"vector<8x{elem}>" in r for r in results), results
        assert not any("vector<8xf32>" in r for r in results), results


@pytest.mark.parametrize("L", [2999, 3000])
def test_cpu_16bit_wide_loads_aligned_or_not(L: int) -> None:
    """Rows of odd length are not aligned for the wide loads (the fallback branch), rows of
    even length are (the wide branch, the last tile ragged): both widened after the branch."""
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, (2, L)).astype(np.float32)
    b = rng.standard_normal((2, L)).astype(np.float32)
    c = ex.compile(AFFINE, target="cpu", strategy="blelloch", dtype="bfloat16",
                   block_size=32, elements_per_thread=8, out_dtype="float32")
    lowered = next(p.ir for p in c.passes if p.name == "scan-lower")
    assert "-> (vector<8xbf16>" in lowered
    ar, br = (from_storage(to_storage(n, x, "bfloat16"), "bfloat16")
              for n, x in (("a", a), ("b", b)))
    assert max_rel_error(c(a=a, b=b), affine_scan_f64(ar, br)) <= TOLERANCE


# --- host rounding -----------------------------------------------------------------------------

def test_bf16_rounding_is_nearest_even_as_torch_rounds() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 1.0 + 2**-9, 3e-39, -7e-45,
                        np.inf, -np.inf, 3.3895314e38, 3.38e38], np.float32)
    x = np.concatenate([special, rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng
                        .integers(-30, 30, 10000)]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(round_bf16(x), want)
    assert np.array_equal(widen_bf16(round_bf16(x)),
                          torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    nan = round_bf16(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(widen_bf16(nan)).all()


def test_to_storage_accepts_reals_and_refuses_overflow_and_complex() -> None:
    x = np.array([[1.0, 2.5, -0.1]])
    assert to_storage("x", x, "float16").dtype == np.float16
    bits = to_storage("x", x, "bfloat16")
    assert bits.dtype == storage("bfloat16") == np.uint16
    assert np.allclose(from_storage(bits, "bfloat16"), x, rtol=2**-8)
    assert to_storage("x", np.arange(3), "float16").tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RecurrenceError, match="x holds 7e\\+04, beyond float16's range"):
        to_storage("x", np.array([1.0, 7e4]), "float16")
    assert to_storage("x", np.array([FLOAT16_MAX]), "float16")[0] == FLOAT16_MAX
    with pytest.raises(RecurrenceError, match="beyond bfloat16's range"):
        to_storage("x", np.array([3.4e38]), "bfloat16")   # float32, but inf in bfloat16
    with pytest.raises(RecurrenceError, match="complex"):
        to_storage("x", np.array([1j]), "bfloat16")
    # infinities given stay infinities (no overflow: nothing finite became inf)
    assert math.isinf(float(from_storage(to_storage("x", np.array([np.inf]), "bfloat16"),
                                         "bfloat16")[0]))


def test_torch_16bit_host_tensors_are_taken_bit_for_bit() -> None:
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, 1.00390625, -3.14159]).to(torch.bfloat16)
    bits = to_storage("t", t, "bfloat16")
    assert np.array_equal(bits, t.view(torch.int16).numpy().view(np.uint16))


# --- runs on the CPU against the reference of the rounded inputs -----------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("strategy,grid", [("sequential", "chunked"), ("blelloch", "chunked"),
                                           ("blelloch", "lookback")])
def test_cpu_run_16bit_affine_scan(dtype: str, strategy: str, grid: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 1.0, (3, 3000)).astype(np.float32)
    b = rng.standard_normal((3, 3000)).astype(np.float32)
    c = ex.compile(AFFINE, target="cpu", strategy=strategy, dtype=dtype, grid=grid,
                   block_size=32, elements_per_thread=2)
    h = c(a=a, b=b)
    assert h.dtype == (np.float16 if dtype == "float16" else np.float32)
    ar, br = (from_storage(to_storage(n, x, dtype), dtype) for n, x in (("a", a), ("b", b)))
    ref = affine_scan_f64(ar, br)
    err = max_rel_error(h, ref)
    assert err <= tolerance(dtype), err
    # the outputs are rounded to the dtype: the error is that rounding, far above float32's
    assert err > TOLERANCE
    # out_dtype="float32": the same scan, unrounded on the way out
    c32 = ex.compile(AFFINE, target="cpu", strategy=strategy, dtype=dtype, grid=grid,
                     block_size=32, elements_per_thread=2, out_dtype="float32")
    h32 = c32(a=a, b=b)
    assert h32.dtype == np.float32 and max_rel_error(h32, ref) <= TOLERANCE


def test_cpu_run_16bit_selective_scan() -> None:
    from explorer.presets import SELECTIVE_SCAN

    rng = np.random.default_rng(2)
    C, N, L = 3, 4, 200
    arrays = {"dt": rng.uniform(0.01, 0.2, (C, L)), "A": -rng.uniform(0.5, 2.0, (C, N)),
              "B": rng.standard_normal((C, N, L)), "x": rng.standard_normal((C, L)),
              "C": rng.standard_normal((C, N, L)), "D": rng.standard_normal(C)}
    c = ex.compile(SELECTIVE_SCAN, target="cpu", strategy="blelloch", dtype="bfloat16",
                   block_size=32, elements_per_thread=2)
    rec = c.recurrence
    rounded = {k: (from_storage(to_storage(k, v, "bfloat16"), "bfloat16") if k in rec.inputs
                   else v) for k, v in arrays.items()}
    got = c(**{k: v.astype(np.float32) for k, v in arrays.items()})
    want = ex.reference(SELECTIVE_SCAN, **rounded)
    want = want[c.outputs[0]] if isinstance(want, dict) else want
    assert max_rel_error(got, want) <= tolerance("bfloat16") + 5e-4


def test_cpu_run_refuses_float16_overflow_before_running() -> None:
    c = ex.compile(AFFINE, target="cpu", strategy="sequential", dtype="float16")
    with pytest.raises(RecurrenceError, match="b holds 1e\\+05, beyond float16's range"):
        c(a=np.full((1, 8), 0.5, np.float32), b=np.full((1, 8), 1e5, np.float32))


# --- the bench --------------------------------------------------------------------------------

def test_bench_counts_6_bytes_an_element_and_states_its_tolerance() -> None:
    from explorer.bench.methods import COPY, TORCH_ASSOC, Problem

    assert Problem(4, 1000, None, None, dtype="bfloat16").bytes == 6 * 4000
    assert Problem(4, 1000, None, None).bytes == 12 * 4000
    assert tolerance("bfloat16") == 2**-8 + TOLERANCE
    assert tolerance("float16") == 2**-11 + TOLERANCE
    assert tolerance() == TOLERANCE
    assert "bfloat16" in COPY.dtypes and "float16" in TORCH_ASSOC.dtypes


def test_bench_command_line_takes_a_dtype() -> None:
    from explorer.cli.parser import build_parser

    args = build_parser().parse_args(["bench", "--dtype", "bfloat16"])
    assert args.dtype == "bfloat16"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--dtype", "float64"])


def test_cpu_run_takes_torch_16bit_tensors_and_refuses_bool() -> None:
    torch = pytest.importorskip("torch")
    a = torch.full((2, 8), 0.5, dtype=torch.float16)
    b = torch.ones((2, 8), dtype=torch.float16)
    c = ex.compile(AFFINE, target="cpu", strategy="sequential", dtype="float16")
    h = c(a=a, b=b)
    assert h.dtype == np.float16 and np.array_equal(h[0, :3], [1.0, 1.5, 1.75])
    with pytest.raises(RecurrenceError, match="a has dtype torch.bool; give real numbers"):
        c(a=a.bool(), b=b)


def test_widget_dtype_box_compiles_and_checks_bfloat16() -> None:
    pytest.importorskip("ipywidgets")
    from explorer.widget import Explorer

    widget = Explorer(AFFINE, target="cpu")
    assert not widget.dtype.disabled
    assert list(widget.dtype.options) == ["float32", "bfloat16", "float16"]
    widget.dtype.value = "bfloat16"
    assert widget.error is None, widget.error_box.value
    assert widget.compiled.options["dtype"] == "bfloat16"
    panel = widget.run
    panel.length.value, panel.channels.value = 300, 3
    rows = panel.run_and_check()
    # the inputs are rounded before the reference; the tolerance allows the outputs' rounding
    assert rows and panel.passed(rows), panel.check.value
    assert rows[0]["max_rel"] > 1e-4 and "0.0049" in panel.check.value


def test_the_torch_operator_refuses_16bit_compiles() -> None:
    pytest.importorskip("torch")
    c = ex.compile(AFFINE, target="cpu", strategy="sequential", dtype="bfloat16")
    with pytest.raises(OptionError, match="float32 compiles only"):
        c.torch()


def test_a_manifest_whose_inputs_contradict_its_dtype_is_refused() -> None:
    from explorer.runtime.artifact import validate_manifest

    manifest = {"format": "scanweaver-artifact/1", "dtype": "float32",
                "kernels": [{**_kernel([_arg("a", "input", "bfloat16"),
                                        _arg("h", "output", "bfloat16"), *SIZE_ARGS])[0],
                             "ptx": "kernel.ptx"}]}
    with pytest.raises(ArtifactError, match=r"take \['bfloat16'\] inputs, but the manifest's "
                                            "dtype is 'float32'"):
        validate_manifest(manifest)
    validate_manifest({**manifest, "dtype": "bfloat16"})
