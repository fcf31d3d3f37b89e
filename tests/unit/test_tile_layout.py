"""The tile layout of tree plans (``tile_layout``, ``scan.thread {layout}``): the option, the
plan that resolves and records it, and the IR each layout lowers to. The direct layout is a GPU
layout (each thread's registers), so its kernels run in ``tests/gpu/test_wide_gpu.py``, against
their staged twins and float64; here the IR is checked.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from explorer.codegen.options import validate
from explorer.errors import OptionError
from explorer.passes.plan import plan_from_dict

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402
from explorer.passes.plan import plan_ir  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
SMALL = {"block_size": 32, "elements_per_thread": 8}


@pytest.mark.parametrize("bad", ["wide", "", None, 1, True])
def test_an_unknown_layout_is_refused(bad: object) -> None:
    with pytest.raises(OptionError, match="tile_layout"):
        validate(tile_layout=bad)


@pytest.mark.parametrize("options", [{"target": "cpu"}, {"strategy": "sequential"}])
def test_the_direct_layout_is_refused_where_no_gpu_tree_runs(options: dict[str, Any]) -> None:
    with pytest.raises(OptionError, match="direct"):
        validate(tile_layout="direct", **options)


def _layout(c: Any) -> str:
    return plan_ir(c.stages["scan-plan"].text).layout


@pytest.mark.parametrize("rec,options,want", [
    (AFFINE, {}, "staged"),                                  # streams its states out
    (AFFINE, {"tile_layout": "direct"}, "direct"),
    (AFFINE, {"target": "cpu"}, "staged"),
    (PRESETS["selective scan"], {}, "direct"),               # the lane loop, y summed in it
    (PRESETS["selective scan"], {"outputs": "all"}, "staged"),   # h streamed out as well
    (PRESETS["selective scan"], {"target": "cpu"}, "staged"),
    (PRESETS["selective scan"], {"tile_layout": "staged"}, "staged"),
    (PRESETS["selective scan"], {"grid": "lookback"}, "staged"),  # a readout kernel
])
def test_auto_resolves_in_the_plan(rec: str, options: dict[str, Any], want: str) -> None:
    c = ex.compile(rec, **{**SMALL, **options})
    assert _layout(c) == want
    assert f'layout = "{want}"' in c.stages["scan-plan"].text


def test_the_direct_kernel_has_no_stage_and_stores_from_registers() -> None:
    staged = ex.compile(AFFINE, **SMALL).stages["scan-lower"].text
    direct = ex.compile(AFFINE, tile_layout="direct", **SMALL).stages["scan-lower"].text
    # the staged kernels declare the stage (two inputs, the output through the first);
    # the direct ones only the tree's slots, and store the thread's own 4-element vectors
    assert direct.count("memref.alloca") + direct.count("workgroup") < \
        staged.count("memref.alloca") + staged.count("workgroup")
    assert "vector.store" in direct and "vector.load" in direct
    assert staged.count("gpu.barrier") > direct.count("gpu.barrier")


def test_a_record_without_the_layout_reads_as_staged() -> None:
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose
    from explorer.passes.plan import choose_plan

    raw = asdict(choose_plan(decompose(Recurrence.parse(AFFINE)), validate(**SMALL)))
    assert plan_from_dict(raw).layout == "staged"
    assert plan_from_dict({**raw, "layout": "direct"}).layout == "direct"
    del raw["layout"]
    assert plan_from_dict(raw).layout == "staged"


@pytest.mark.parametrize("bad", ["wide", 3, None])
def test_a_plan_with_a_layout_the_lowering_lacks_is_refused(bad: object) -> None:
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose
    from explorer.passes.plan import choose_plan

    raw = asdict(choose_plan(decompose(Recurrence.parse(AFFINE)), validate(**SMALL)))
    with pytest.raises(ValueError, match="tile layout"):
        plan_from_dict({**raw, "layout": bad})


def test_a_sequential_plan_cannot_be_direct() -> None:
    c = ex.compile(AFFINE, strategy="sequential", block_size=32)
    with pytest.raises(ValueError, match="tile layout"):
        plan_from_dict({**asdict(plan_ir(c.stages["scan-plan"].text)), "layout": "direct"})
