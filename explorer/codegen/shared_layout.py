"""The workgroup (shared-memory) arrays of each kernel of a tree plan, and what they hold: the
stage buffers of a tile, the aggregate buffers of the block tree, and with a lane loop the rows
the lanes share and one row per term of the sums over n. The kernel specs
(:mod:`explorer.codegen.kernels`) size the kernels from here, and the kernels bind their arrays
in the same order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from explorer.codegen.emit import Algebra
from explorer.codegen.gen import scan_io
from explorer.codegen.hoist import ChannelSplit, split_channel
from explorer.codegen.lower_grid import blelloch_shapes
from explorer.codegen.lower_sequential import seq_layout
from explorer.codegen.options import ELEMENT_BYTES, Options
from explorer.codegen.packed import packs_outputs, shares_stage


def lane_loop_split(form: Any, plan: Any) -> ChannelSplit | None:
    """What the lane loop of a chunked tree plan's scan kernel reads per lane and per channel
    (None: no lane loop)."""
    if plan.tree == "none" or plan.lane_sum is None or not plan.lane_sum.fused:
        return None
    io = scan_io(form, plan.stored, plan.lane_sum)
    # the lane-summed readouts' timed inputs (outside their sums) are staged with the rest, so
    # that the tile's readouts read them from the stage
    return split_channel(form, io.lane_terms, also=io.outer, readouts=io.readouts)


def packed_lookback(plan: Any) -> bool:
    """Whether the plan's look-back kernel packs its stage (``scan.lookback {layout =
    "packed"}``): its inputs then have stage buffers of their own, of their bytes, and its
    outputs theirs (:mod:`explorer.codegen.packed`)."""
    return plan.lookback is not None and plan.lookback.layout == "packed"


def stage_counts(form: Any, options: Options, plan: Any) -> dict[str, int]:
    """Stage buffers of each kernel role: with a packed look-back the inputs' come first, then
    the outputs' where they have their own (:func:`explorer.codegen.packed.shares_stage`)."""
    alg = Algebra(form.A)
    coeff = {s.name for s in (*form.A.free_symbols, *form.b.free_symbols)}
    io = scan_io(form, plan.stored, plan.lane_sum)
    split = lane_loop_split(form, plan)
    scan = max(1, len(split.lane_inputs if split is not None else io.inputs), len(io.outputs))
    own = 0 if shares_stage(options, len(io.inputs), len(io.outputs)) else len(io.outputs)
    look = len(io.inputs) + own if packed_lookback(plan) else scan
    return {"scan": scan, "lookback": look,
            "reduce": max(1, len([n for n in form.inputs if n in coeff])),
            "carry": max(alg.width, alg.S)}


def tile_steps(options: Options, plan: Any, role: str) -> int:
    """Steps of one tile of the kernel of ``role``."""
    return plan.grid.tile if role == "lookback" else options.tile


def shared_arrays(form: Any, options: Options, role: str, plan: Any) -> list[int]:
    """Sizes (floats) of the workgroup arrays of the kernel of ``role``: for the trees, the
    stage buffers, the aggregate buffers, and with a lane loop one row of the tile per term
    of the sums over n."""
    if role == "readout":
        return []
    if options.strategy == "sequential":
        return [seq_layout(form, options, plan.stored, plan.lane_sum).floats]
    look = plan.lookback if role == "lookback" else None
    shapes = blelloch_shapes(options, plan.grid.scheme,
                             look.elements if look is not None else None,
                             look.threads if look is not None else None)
    count = stage_counts(form, options, plan)[role]
    sizes = [shapes.stage] * count
    if look is not None and packed_lookback(plan):   # the inputs' bytes, unpadded
        nin = len(scan_io(form, plan.stored, plan.lane_sum).inputs)
        words = look.threads * look.elements * ELEMENT_BYTES[options.dtype] // 4
        outs = words if packs_outputs(options) else shapes.stage
        sizes = [words] * nin + [outs] * (count - nin)
    sizes += [shapes.agg] * Algebra(form.A).width
    split = lane_loop_split(form, plan) if role == "scan" else None
    if split is not None:
        # what the lanes share (a row of the tile each), then a row per lane term
        sizes += [shapes.stage] * (len(split.channel_staged) + len(split.terms))
    return sizes


#: the alignment of each workgroup array (LLVM merges neighbouring shared loads into 16-byte
#: vector loads, which fault on a less aligned buffer)
SHARED_ALIGN = 16


def carve(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(byte offset, floats) of each workgroup array laid out one after another, each
    aligned to SHARED_ALIGN bytes."""
    out, offset = [], 0
    for n in sizes:
        out.append((offset, n))
        offset += -(-n * 4 // SHARED_ALIGN) * SHARED_ALIGN
    return out


def shared_bytes(sizes: Sequence[int]) -> int:
    """Bytes of shared memory the workgroup arrays ``sizes`` (floats) take, aligned."""
    carved = carve(sizes)
    return carved[-1][0] + carved[-1][1] * 4 if carved else 0
