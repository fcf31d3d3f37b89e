"""Code generation and the pass pipeline: options, IR text (CHECK-style), per-pass capture, PTX,
compile errors with reproducers. CPU only; PTX is checked with ptxas when it is installed."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from explorer.codegen import build_module, lower, validate
from explorer.codegen.ptxas import (
    find_tool,
    parse_ptxas_output,
    ptxas_info,
    ptxas_report,
    sass,
)
from explorer.errors import CompileError, OptionError
from explorer.frontend import Recurrence
from explorer.passes.affine import decompose

SCALAR = "h[t] = a[t] * h[t-1] + b[t]"
MAMBA = ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
         "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]")
COMPANION = "h[t] = a[t] * h[t-1] + c[t] * h[t-2] + x[t]"

needs_ptxas = pytest.mark.skipif(find_tool("ptxas") is None, reason="ptxas not installed")


def form_of(text: str):  # type: ignore[no-untyped-def]
    return decompose(Recurrence.parse(text))


def check_order(text: str, *patterns: str) -> None:
    """CHECK: each pattern occurs, in this order."""
    pos = 0
    for p in patterns:
        found = text.find(p, pos)
        assert found >= 0, f"{p!r} not found after offset {pos}"
        pos = found + len(p)


@contextmanager
def fd2_captured() -> Iterator[list[str]]:
    """Redirect file descriptor 2 to a file; the list gets what was written to it."""
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out.append(f.read().decode(errors="replace"))


# -- options ------------------------------------------------------------------------------------
def test_defaults() -> None:
    o = validate("blelloch", "cuda")
    assert (o.block_size, o.elements_per_thread, o.chip, o.dtype) == ("auto", "auto", "sm_90",
                                                                      "float32")
    # the tile left open is the plan's: 64 x 16 for a scalar first-order state on the GPU,
    # 128 x 8 for the others; a count given alone takes the other from 128 x 8
    from explorer.passes.plan_options import resolve_tiles

    o = resolve_tiles(o, Recurrence.parse("h[t] = a[t] * h[t-1] + b[t]"))
    assert (o.block_size, o.elements_per_thread) == (64, 16)
    for text in ("h[t] = a[t] * h[t-1] + c[t] * h[t-2] + x[t]", MAMBA):
        r = resolve_tiles(validate("blelloch", "cuda"), Recurrence.parse(text))
        assert (r.block_size, r.elements_per_thread) == (128, 8)
    assert validate(block_size=256).elements_per_thread == 8
    assert validate(elements_per_thread=4).block_size == 128
    for name in ("block_size", "elements_per_thread"):
        with pytest.raises(OptionError, match=f"{name} must be 'auto' or an integer"):
            validate(**{name: "AUTO"})
    o = validate("blelloch", "cuda", block_size=128)
    assert o.tile == 1024 and o.ptx_features == "+ptx78"
    assert o.chunk_tiles == 8 and o.time_chunk == 8 * 1024


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"strategy": "kogge"}, "strategy"),
    ({"target": "rocm"}, "target"),
    ({"block_size": 48}, "block_size"),
    ({"block_size": 2048}, "block_size"),
    ({"block_size": 16}, "block_size"),
    ({"block_size": 256.0}, "block_size"),
    ({"elements_per_thread": 3}, "elements_per_thread"),
    ({"elements_per_thread": 32}, "elements_per_thread"),
    ({"chunk_tiles": 3}, "chunk_tiles"),
    ({"chunk_tiles": 0}, "chunk_tiles"),
    ({"chip": "sm_91x"}, "chip"),
    ({"chip": 90}, "chip"),
    ({"dtype": "float64"}, "dtype"),
    ({"unroll": 2}, "unknown option"),
])
def test_bad_options(kwargs: dict[str, object], words: str) -> None:
    args = {"strategy": "blelloch", "target": "cuda", **kwargs}
    with pytest.raises(OptionError, match=words):
        validate(**args)  # type: ignore[arg-type]


def test_tile_too_large_for_shared_memory() -> None:
    o = validate("blelloch", "cuda", block_size=1024, elements_per_thread=16, grid="chunked")
    with pytest.raises(OptionError, match="more than 232448"):
        build_module(form_of(COMPANION), o)


def test_tiles_past_static_shared_memory_take_dynamic_shared_memory() -> None:
    """A tree tile whose workgroup arrays pass CUDA's 48 KiB of static shared memory takes
    them from dynamic shared memory (the launch opts in); smaller ones stay static."""
    from explorer.codegen.kernels import kernel_specs

    big = validate("blelloch", "cuda", block_size=1024, elements_per_thread=16, grid="chunked")
    small = validate("blelloch", "cuda", block_size=128, elements_per_thread=8, grid="chunked")
    form = form_of(SCALAR)
    for spec in kernel_specs(form, big):
        if spec.role == "scan":
            assert spec.shared_bytes > 48 * 1024 and spec.static_shared_bytes == 0
    assert all(s.shared_bytes == 0 for s in kernel_specs(form, small))
    text = build_module(form, big).text
    assert "gpu.dynamic_shared_memory" in text
    # each array a view of the one buffer, at 16-byte aligned offsets
    offsets = [int(m) for m in re.findall(r"memref\.view %\w+\[%c(\d+)\]", text)]
    assert offsets and all(o % 16 == 0 for o in offsets)
    assert "gpu.dynamic_shared_memory" not in build_module(form, small).text


# -- IR text ------------------------------------------------------------------------------------
def test_blelloch_cuda_ir() -> None:
    built = build_module(form_of(SCALAR), validate("blelloch", "cuda", block_size=256,
                                                   elements_per_thread=4, chunk_tiles=16,
                                                   grid="chunked"))
    t = built.text
    check_order(t, "gpu.container_module", "gpu.module @scanweaver_kernels",
                "gpu.func @scanweaver_blelloch_reduce(", "workgroup(", "kernel",
                "gpu.func @scanweaver_blelloch_carry(", "workgroup(",
                "gpu.func @scanweaver_blelloch(", "workgroup(", "kernel",
                "scf.for",           # tiles
                "gpu.barrier",       # after the tile is staged
                "gpu.barrier",       # after the per-thread aggregates
                "arith.cmpi slt",    # a level of the tree: only the threads with a pair
                "gpu.barrier",
                "gpu.return",
                "func.func @scanweaver_launch", "scf.if", "gpu.launch_func")
    # tile of 1024 staged (padded to 1056) for a and b; 256 aggregates (+8 pad, +1 total)
    assert "memref<1056xf32, #gpu.address_space<workgroup>>" in t
    assert "memref<265xf32, #gpu.address_space<workgroup>>" in t
    assert built.sequences_per_block == 1 and built.block == (256, 1, 1)
    assert built.static_shared_bytes == (2 * 1056 + 2 * 265) * 4 and built.shared_bytes == 0
    # the chunk length is the last argument, chosen per call by the rule it carries
    assert [a["name"] for a in built.args] == ["a", "b", "h0", "h", "C", "N", "L",
                                               "chunk_aggregates", "chunk_carries", "time_chunk"]
    assert [a["role"] for a in built.args] == ["input", "input", "h0", "output", "size", "size",
                                               "size", "workspace", "workspace", "size"]
    assert [(a["per_chunk"], a["time_chunk"]) for a in built.args[-3:-1]] == [
        (2, "time_chunk"), (1, "time_chunk")]
    assert built.args[-1]["dtype"] == "int64"
    assert built.args[-1]["chunk_rule"] == {"tile": 1024, "min_tiles": 16, "fill": 2.0,
                                            "unchunked_from": 0.1}
    assert [k.manifest() for k in built.kernels] == [
        {"name": "scanweaver_blelloch_reduce", "block": [256, 1, 1], "sequences_per_block": 1,
         "shared_bytes": 0, "time_chunk": "time_chunk",
         "launch_when_longer_than": "time_chunk"},
        {"name": "scanweaver_blelloch_carry", "block": [256, 1, 1], "sequences_per_block": 1,
         "shared_bytes": 0, "launch_when_longer_than": "time_chunk"},
        {"name": "scanweaver_blelloch", "block": [256, 1, 1], "sequences_per_block": 1,
         "shared_bytes": 0, "time_chunk": "time_chunk"}]
    # the kernels read the chunk length from their last argument: no constant 16384 left
    assert "16384" not in t


def test_sequential_cuda_ir() -> None:
    built = build_module(form_of(SCALAR), validate("sequential", "cuda", block_size=128))
    t = built.text
    assert "gpu.barrier" not in t          # warps own their tiles: warp syncs only
    check_order(t, "gpu.func @scanweaver_sequential(", "gpu.dynamic_shared_memory",
                "memref.view", "gpu.thread_id  x", "gpu.block_id  x",
                "scf.for",                       # full tiles of 32 steps
                "memref.load", "memref.store",  # staged in
                "nvvm.bar.warp.sync",
                "arith.mulf", "arith.addf",      # the walk
                "nvvm.bar.warp.sync",
                "scf.if",                        # the ragged tail tile
                "gpu.return")
    assert "loop_annotation" in t            # the batch loop stays rolled
    assert built.sequences_per_block == 128
    # 4 warps x 2 buffers (a, b; h written over a) x 32 rows x 33 floats
    assert built.shared_bytes == 4 * 2 * 32 * 33 * 4
    assert [a["role"] for a in built.args][-1] == "size"     # no workspace


def test_sequential_vector_stages_channel_inputs_once() -> None:
    from explorer.codegen.lower_sequential import seq_layout

    lay = seq_layout(form_of(MAMBA), validate("sequential", "cuda", block_size=128))
    # dt (read alone by exp(dt * A)) and the channel value dt * x (the channel's factors of
    # b = dt * B * x) by channel; B by lane
    assert lay.inputs == ("dt", "B", "#0")
    assert lay.private == (False, True, False)
    assert lay.out_buffer == (1,) and lay.buffers == 3


def test_mamba_ir_sums_the_lanes_in_the_chunked_scan() -> None:
    """The chunked grid: the scan kernel's blocks each take a chunk of a whole channel (the
    grid counts channels) and loop over its lanes; no readout kernel, no h by default."""
    built = build_module(form_of(MAMBA), validate("blelloch", "cuda", block_size=256))
    assert [k.name for k in built.kernels] == ["scanweaver_blelloch_reduce",
                                               "scanweaver_blelloch_carry",
                                               "scanweaver_blelloch"]
    assert [k.channels for k in built.kernels] == [None, None, "block"]
    assert "math.exp" in built.text
    lane = {a["name"]: a["lane"] for a in built.args
            if a["role"] not in ("size", "workspace", "rowmap", "rowmod")}
    assert lane == {"dt": False, "B": True, "x": False, "C": True, "A": True, "D": False,
                    "h0": True, "y": False}
    # B and C may come with a row per block of channels: their divisors follow C, N, L; A and
    # D with a row per channel of the trailing batch axes: their moduli follow
    assert [(a["name"], a["role"]) for a in built.args[8:15]] == [
        ("C", "size"), ("N", "size"), ("L", "size"), ("B", "rowmap"), ("C", "rowmap"),
        ("A", "rowmod"), ("D", "rowmod")]
    every = build_module(form_of(MAMBA), validate("blelloch", "cuda", block_size=256,
                                                  outputs="all"))
    assert [a["name"] for a in every.args if a["role"] == "output"] == ["h", "y"]


def test_mamba_ir_has_readout_kernel_on_the_lookback_grid() -> None:
    """The look-back grid keeps the readout kernel, which reads the states back: from a
    workspace of (C, N, L) floats when the states are not asked for."""
    built = build_module(form_of(MAMBA), validate("blelloch", "cuda", block_size=256,
                                                  grid="lookback"))
    assert [k.name for k in built.kernels] == ["scanweaver_blelloch",
                                               "scanweaver_blelloch_lookback",
                                               "scanweaver_readout"]
    assert [k.sequences_per_block for k in built.kernels] == [1, 1, 1]
    check_order(built.text, "gpu.func @scanweaver_readout(", "scf.for", "scf.for", "arith.mulf")
    assert built.kernels[-1].time_chunk == 16 * 256
    roles = {a["name"]: a["role"] for a in built.args if a["role"] != "size"}
    assert roles["h"] == "workspace" and roles["y"] == "output"
    h = next(a for a in built.args if a["name"] == "h")
    assert (h["per_chunk"], h["time_chunk"]) == (1, 1)      # C * N * L floats
    every = build_module(form_of(MAMBA), validate("blelloch", "cuda", block_size=256,
                                                  grid="lookback", outputs="all"))
    assert {a["name"]: a["role"] for a in every.args}["h"] == "output"


def test_sequential_lanes_in_block() -> None:
    """The sequential plan sums a channel's lanes in its block: the grid counts channels,
    the lane terms go through the warp tiles and a barrier, and h is not an argument."""
    built = build_module(form_of(MAMBA), validate("sequential", "cuda"))
    (k,) = built.kernels
    assert k.channels == "threads" and k.manifest()["channels"] == "threads"
    assert [a["name"] for a in built.args if a["role"] == "output"] == ["y"]
    check_order(built.text, "gpu.func @scanweaver_sequential(", "nvvm.bar.warp.sync",
                "math.exp", "gpu.barrier", "scf.for", "arith.addf", "gpu.barrier")
    from explorer.codegen.lower_sequential import seq_layout
    from explorer.passes.plan import choose_plan

    plan = choose_plan(form_of(MAMBA), validate("sequential", "cuda"))
    lay = seq_layout(form_of(MAMBA), validate("sequential", "cuda", block_size=128), plan.stored,
                     plan.lane_sum)
    # x for the readout's D * x, and the channel value dt * x for the lanes' b = B * (dt * x)
    assert lay.inputs == ("dt", "B", "x", "C", "#0")
    assert lay.private == (False, True, False, True, False)
    assert lay.out_buffer == (1,)       # the lane term C * h written over B, in place


def test_cpu_ir_is_host_code() -> None:
    built = build_module(form_of(COMPANION), validate("blelloch", "cpu"))
    assert "gpu." not in built.text
    check_order(built.text, "func.func @scanweaver_blelloch_reduce_grid(",
                "llvm.emit_c_interface", "memref.alloc", "scf.for",
                "func.func @scanweaver_blelloch_grid(",
                "func.func @scanweaver_blelloch(", "llvm.emit_c_interface",
                "call @scanweaver_blelloch_reduce_grid", "call @scanweaver_blelloch_carry_grid",
                "call @scanweaver_blelloch_grid")


def test_kernel_grid_rule() -> None:
    """The contract the compiler writes, read as every launcher reads it (one grid rule)."""
    from explorer.codegen.contract import kernel_args
    from explorer.codegen.kernels import kernel_specs
    from explorer.runtime.contract import parse_kernels

    o = validate("blelloch", "cuda", block_size=32, elements_per_thread=2, chunk_tiles=4,
                 grid="chunked")
    form = form_of(SCALAR)
    args = kernel_args(form, o)
    reduce, carry, scan = parse_kernels([dict(k.manifest(), args=args)
                                         for k in kernel_specs(form, o)])
    assert o.time_chunk == 256

    def grid(k, C, N, L, T):   # noqa: ANN001, ANN202
        sizes = {"time_chunk": T}
        return k.grid(C, N, L, sizes)[0] if k.launched(L, sizes) else 0
    for C, N, L in [(3, 1, 1), (3, 2, 256), (3, 2, 257), (1, 1, 10_000)]:
        for T in (256, 512, L):
            chunks = -(-L // T)
            assert grid(scan, C, N, L, T) == C * N * chunks
            assert grid(reduce, C, N, L, T) == (C * N * chunks if L > T else 0)
            assert grid(carry, C, N, L, T) == (C * N if L > T else 0)
    with pytest.raises(ValueError, match="time_chunk"):
        scan.grid(1, 1, 10)
    o_seq = validate("sequential", "cuda", block_size=64)
    (seq,) = parse_kernels([dict(k.manifest(), args=kernel_args(form, o_seq))
                            for k in kernel_specs(form, o_seq)])
    assert seq.grid(130, 1, 5) == (3, 1, 1) and seq.time_chunk is None


# -- pipeline -----------------------------------------------------------------------------------
CUDA_PASSES = [
    "canonicalize (input)", "cse (input)",
    "convert-nvgpu-to-nvvm", "gpu-kernel-outlining", "convert-vector-to-scf",
    "convert-scf-to-cf", "convert-nvvm-to-llvm", "convert-func-to-llvm",
    "expand-strided-metadata", "nvvm-attach-target", "lower-affine", "convert-arith-to-llvm",
    "convert-index-to-llvm", "canonicalize", "cse", "convert-gpu-to-nvvm",
    "canonicalize (gpu.module)", "cse (gpu.module)", "reconcile-unrealized-casts (gpu.module)",
    "gpu-to-llvm", "ensure-debug-info-scope-on-llvm-func", "gpu-module-to-binary",
    "convert-math-to-llvm", "canonicalize (host)", "cse (host)", "reconcile-unrealized-casts"]


def test_cuda_pipeline_records_every_pass_and_writes_nothing_to_fd2() -> None:
    o = validate("blelloch", "cuda")
    with fd2_captured() as err:
        lowered = lower(build_module(form_of(MAMBA), o), o)
    assert err == [""]
    names = [p.name for p in lowered.passes]
    assert names == CUDA_PASSES
    changed = {p.name: p.changed for p in lowered.passes}
    assert changed["convert-scf-to-cf"] and changed["convert-gpu-to-nvvm"]
    assert changed["gpu-module-to-binary"] and changed["nvvm-attach-target"]
    assert changed["canonicalize (input)"]
    assert not changed["lower-affine"]
    # nothing for convert-vector-to-scf to lower (the tiles' vector loads stay for the LLVM
    # lowering): at most its rewrite driver moves the constants
    vec = names.index("convert-vector-to-scf")

    def lines(ir: str) -> list[str]:   # constants' names follow their order: not compared
        return sorted(re.sub(r"%c(st)?[_0-9]*\b", "%C", line) for line in ir.splitlines())
    assert lines(lowered.passes[vec - 1].ir) == lines(lowered.passes[vec].ir)
    assert all(p.seconds >= 0 and p.ir.startswith("module") for p in lowered.passes)
    nvvm = lowered.passes[names.index("convert-gpu-to-nvvm")].ir
    assert "nvvm.read.ptx.sreg.tid.x" in nvvm and "nvvm.barrier" in nvvm
    assert "gpu.func" not in nvvm and "llvm.func @scanweaver_blelloch" in nvvm
    assert '#nvvm.target<O = 3, chip = "sm_90", features = "+ptx78"' in nvvm
    assert "gpu.binary @scanweaver_kernels" in lowered.final_module
    # kernel LLVM IR and PTX
    check_order(lowered.llvm_ir, "define ptx_kernel void @scanweaver_blelloch_reduce(",
                "define ptx_kernel void @scanweaver_blelloch_carry(",
                "define ptx_kernel void @scanweaver_blelloch(")
    assert lowered.ptx is not None
    check_order(lowered.ptx, ".version 7.8", ".target sm_90", ".entry scanweaver_blelloch",
                "bar.sync")
    assert ".extern .func" not in lowered.ptx    # math functions linked


def test_chip_option_reaches_ptx() -> None:
    o = validate("sequential", "cuda", chip="sm_80")
    lowered = lower(build_module(form_of(SCALAR), o), o)
    assert lowered.ptx is not None and ".target sm_80" in lowered.ptx
    assert "bar.sync" not in lowered.ptx


def test_cpu_pipeline() -> None:
    o = validate("sequential", "cpu")
    with fd2_captured() as err:
        lowered = lower(build_module(form_of(SCALAR), o), o)
    assert err == [""]
    assert lowered.ptx is None
    assert "llvm.func @_mlir_ciface_scanweaver_sequential" in lowered.final_module
    assert "define void @scanweaver_sequential(" in lowered.llvm_ir


def _few_spills(ptx: str, name: str, info: dict[str, Any]) -> None:
    """No spills, except in a kernel that asks ptxas for occupancy (``.minnctapersm``: the lane
    loop, the look-back), which trades a few for it (measured faster): bounded there."""
    start = ptx.index(f".entry {name}(")
    asks = ".minnctapersm" in ptx[start:ptx.index("{", start)]
    limit = 128 if asks else 0
    assert info["spills_stores"] <= limit and info["spills_loads"] <= limit, (name, info)


@needs_ptxas
@pytest.mark.parametrize("strategy", ["sequential", "blelloch"])
@pytest.mark.parametrize("text", [SCALAR, MAMBA, COMPANION])
def test_ptxas_accepts(text: str, strategy: str) -> None:
    o = validate(strategy, "cuda", block_size=128, grid="chunked")
    lowered = lower(build_module(form_of(text), o), o)
    assert lowered.ptx is not None
    info = ptxas_info(lowered.ptx, o.chip)
    assert info is not None
    assert info["kernel"] == f"scanweaver_{strategy}"
    assert 0 < info["registers"] <= 255
    _few_spills(lowered.ptx, info["kernel"], info)
    if strategy == "blelloch":
        width = 2 if text != COMPANION else 6     # companion: 4 matrix entries + 2 of b
        # Mamba: the channel's dt, x (which the readout reads too) and dt * x staged (B and
        # C go straight from memory to the registers of the thread that uses them), a row of
        # the tile for the lane terms
        staged = {SCALAR: 2, MAMBA: 3, COMPANION: 3}[text]
        terms = 1 if text == MAMBA else 0
        tile = o.tile + o.tile // 32                # one padding slot per 32
        # the buffers in order, each starting 16-byte aligned (the last one unpadded)
        sizes = ([tile * 4] * staged + [(128 + 4 + 1) * 4] * width + [tile * 4] * terms)
        assert info["shared_bytes"] == sum(-(-b // 16) * 16 for b in sizes[:-1]) + sizes[-1]
    report = ptxas_report(lowered.ptx, o.chip)
    assert report is not None and len(report) >= 1
    for name, kernel in report.items():   # every kernel, not only the main one
        _few_spills(lowered.ptx, name, kernel)
    assert sass(lowered.ptx, o.chip) is None or "scanweaver" in str(sass(lowered.ptx, o.chip))


def test_parse_ptxas_output() -> None:
    text = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
            "ptxas info    : Function properties for k\n"
            "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
            "ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, "
            "400 bytes cmem[0]\n")
    assert parse_ptxas_output(text) == {"k": {
        "stack_bytes": 8, "spills_stores": 4, "spills_loads": 4, "registers": 40,
        "barriers": 1, "shared_bytes": 8192, "constant_bytes": 400}}


# -- errors -------------------------------------------------------------------------------------
BAD_KERNEL = """
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%a: memref<?xf32>) kernel {
      gpu.return
    }
  }
}
"""


def test_failing_pass_raises_compile_error_with_reproducer() -> None:
    o = validate("blelloch", "cuda")
    with fd2_captured() as err, pytest.raises(CompileError) as info:
        lower(BAD_KERNEL, o)
    assert err == [""]
    e = info.value
    assert e.pass_name == "convert-gpu-to-nvvm"
    assert "gpu.func" in e.diagnostics
    assert e.reproducer is not None and e.ir_before is not None
    with open(e.reproducer.ir_path) as f:
        assert f.read() == e.ir_before
    assert "memref<?xf32>" in e.ir_before
    assert e.reproducer.command.startswith(f"mlir-opt {e.reproducer.ir_path} --pass-pipeline=")
    assert "convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1" in e.reproducer.command
    assert "reproduce with: mlir-opt" in str(e)
    os.unlink(e.reproducer.ir_path)


def test_unparsable_text_raises_compile_error() -> None:
    with fd2_captured() as err, pytest.raises(CompileError) as info:
        lower("module { this is not mlir }", validate("sequential", "cpu"))
    assert err == [""]
    assert info.value.pass_name == "parse" and info.value.reproducer is not None
    os.unlink(info.value.reproducer.ir_path)


@pytest.mark.parametrize("strategy", ["blelloch", "kogge_stone", "sequential"])
def test_shared_buffers_are_aligned_for_vector_access(strategy: str) -> None:
    """LLVM merges neighbouring shared-memory loads into ld.shared.v2/v4: every shared buffer
    is declared 16-byte aligned, or those loads fault (misaligned address) on the GPU."""
    import re

    import explorer as ex

    c = ex.compile("h[t] = 0.9 * h[t-1] + x[t]", target="cuda", strategy=strategy,
                   block_size=32, elements_per_thread=1, chunk_tiles=1)
    decls = [line for line in (c.ptx or "").splitlines()
             if re.match(r"\s*(\.extern\s+)?\.shared", line)]
    assert decls
    assert all(".align 16" in d for d in decls), decls
