"""The Mamba benchmark's pieces that need no GPU: the shapes it reads and the cut of mamba-ssm's
binding to its forward (built at benchmark time from a checkout, never kept here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import mamba_speed  # noqa: E402

BINDING = """#include <torch/extension.h>
void selective_scan_fwd_cuda(SSMParamsBase &params, cudaStream_t stream);
void selective_scan_bwd_cuda(SSMParamsBwd &params, cudaStream_t stream);
void set_ssm_params_bwd(SSMParamsBwd &params) { }

std::vector<at::Tensor>
selective_scan_fwd(const at::Tensor &u) { return {u}; }

std::vector<at::Tensor>
selective_scan_bwd(const at::Tensor &u) { selective_scan_bwd_cuda(p, s); return {u}; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("fwd", &selective_scan_fwd, "Selective scan forward");
    m.def("bwd", &selective_scan_bwd, "Selective scan backward");
}
"""


def test_the_cut_keeps_the_forward_and_binds_it_alone():
    cut = mamba_speed._forward_only_source(BINDING)
    assert "selective_scan_fwd(const at::Tensor &u)" in cut
    assert "selective_scan_bwd(const" not in cut
    assert cut.count("PYBIND11_MODULE") == 1
    assert 'm.def("fwd"' in cut and 'm.def("bwd"' not in cut


FP32_BINDING = BINDING.replace(
    "void selective_scan_fwd_cuda",
    "#define DISPATCH_ITYPE_FLOAT_AND_HALF_AND_BF16(ITYPE, NAME, ...) half_too\n"
    "#define DISPATCH_WTYPE_FLOAT_AND_COMPLEX(WTYPE, NAME, ...) complex_too\n"
    "template<typename input_t, typename weight_t>\nvoid selective_scan_fwd_cuda")


def test_the_float32_cut_redefines_the_dispatch_before_the_kernels_are_declared():
    cut = mamba_speed._fp32_source(FP32_BINDING)
    # the binding keeps both entry points; its dispatch macros now take float32 alone
    assert 'm.def("fwd"' in cut and 'm.def("bwd"' in cut
    ours = cut.index("#undef DISPATCH_ITYPE_FLOAT_AND_HALF_AND_BF16")
    assert cut.index("half_too") < ours < cut.index("void selective_scan_fwd_cuda")
    assert "using input_t = float;" in cut and "using weight_t = float;" in cut
    assert cut.count("built for float32 only") == 2
    with pytest.raises(RuntimeError, match="another layout"):
        mamba_speed._fp32_source(BINDING)   # no templated kernel declaration to anchor on


def test_another_layout_is_refused():
    with pytest.raises(RuntimeError, match="another layout"):
        mamba_speed._forward_only_source(BINDING.replace("selective_scan_bwd(", "bwd_entry("))
    swapped = BINDING.replace("selective_scan_fwd(const", "forward(const")
    with pytest.raises(RuntimeError, match="another layout"):
        mamba_speed._forward_only_source(swapped)


@pytest.mark.parametrize("text, shape", [("8x1536x16x2048", (8, 1536, 16, 2048)),
                                         ("1x4x16x2^17", (1, 4, 16, 131072))])
def test_shapes(text, shape):
    assert mamba_speed._parse_shape(text) == shape


@pytest.mark.parametrize("text", ["8x1536x16", "8x0x16x4", "axbxcxd"])
def test_bad_shapes_are_refused(text):
    with pytest.raises((SystemExit, ValueError)):
        mamba_speed._parse_shape(text)


def test_artifacts_of_another_dtype_are_refused(tmp_path):
    pytest.importorskip("mlir.ir", reason="compiling needs MLIR's Python bindings")
    import explorer as ex
    from explorer.presets import PRESETS

    ex.compile(PRESETS["Mamba selective scan"], dtype="bfloat16").save(tmp_path / "blelloch")
    kernels = {"blelloch": ex.load(tmp_path / "blelloch")}
    mamba_speed.check_dtypes(kernels, "bfloat16")   # the run's dtype: accepted
    with pytest.raises(SystemExit, match=r"compiled for another dtype: blelloch \(bfloat16\)"):
        mamba_speed.check_dtypes(kernels, "float32")
    # the 16-bit arrays of the compile are mamba-ssm's: x, dt, z, B, C and y; A, D, dt_bias not
    assert set(kernels["blelloch"].narrow) == {"x", "dt", "z", "B", "C", "y"}


def test_every_build_variant_is_a_valid_compile_and_unknown_ones_are_refused(tmp_path: Path
                                                                              ) -> None:
    from explorer.codegen.options import validate

    for name, (strategy, options) in mamba_speed.VARIANTS.items():
        opts = validate(strategy, "cuda", **options)
        assert opts.strategy == strategy, name
    assert set(mamba_speed.STRATEGIES) <= set(mamba_speed.VARIANTS)
    with pytest.raises(SystemExit, match="unknown variant warp64"):
        mamba_speed.build(tmp_path, ("warp64",))
    assert not any(tmp_path.iterdir())   # refused before anything is compiled


def test_the_packed_batch_bench_builds_the_same_variants(tmp_path: Path) -> None:
    import varlen_speed

    assert set(varlen_speed.STRATEGIES) <= set(mamba_speed.VARIANTS)
    with pytest.raises(SystemExit, match="unknown variant warp64"):
        varlen_speed.build(tmp_path, ("warp64",))
    assert not any(tmp_path.iterdir())


def test_torch_associative_scan_baseline_matches_the_float64_reference() -> None:
    """The benchmark's torch ``associative_scan`` baseline computes the preset's ``y`` (on the
    CPU here, small: every batch row and channel against the recurrence's float64 reference)."""
    from types import SimpleNamespace

    import numpy as np
    torch = pytest.importorskip("torch")
    import explorer as ex

    g = torch.Generator().manual_seed(0)
    batch, D, N, L = 2, 3, 4, 37
    p = SimpleNamespace(
        x=torch.randn(batch, D, L, generator=g), dt=torch.randn(batch, D, L, generator=g) - 1,
        z=torch.randn(batch, D, L, generator=g), B=torch.randn(batch, 1, N, L, generator=g),
        C=torch.randn(batch, 1, N, L, generator=g), A=-torch.rand(D, N, generator=g) - 0.1,
        Dskip=torch.randn(D, generator=g), dt_bias=0.1 * torch.randn(D, generator=g))
    y = mamba_speed.torch_assoc_y(p)
    assert y.shape == (batch, D, L) and y.dtype == torch.float32
    text = ex.PRESETS["Mamba selective scan"]
    for b in range(batch):
        for d in range(D):
            want = ex.reference(
                text, x=p.x[b, d].double().numpy(), dt=p.dt[b, d].double().numpy(),
                z=p.z[b, d].double().numpy(), B=p.B[b, 0].double().numpy(),
                C=p.C[b, 0].double().numpy(), A=p.A[d].double().numpy(), D=float(p.Dskip[d]),
                dt_bias=float(p.dt_bias[d]))["y"]
            got = y[b, d].double().numpy()
            assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))
