"""The plan's choices that the compile options leave to it (their ``"auto"`` values), resolved
for a recurrence's affine form by :func:`explorer.passes.plan.choose_plan`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from explorer.passes.outputs import stored_outputs


def scalar_first_order(form: Any) -> bool:
    """One state component, one lane: the look-back's packed protocol applies, and its element
    is two floats."""
    return not form.vector and tuple(form.A.shape) == (1, 1)


#: the most arrays (timed inputs and stored outputs) whose look-back tile may take twice the
#: elements a thread: the affine scan's three (a, b, h). The adjoint of the affine scan moves
#: five (a_next, grad_h, fwd_h_prev in; lam_h, grad_sum_a out): with 16 elements a thread its
#: look-back kernel took 283 us at 16 x 2^20 on an H100 (ptxas at 48 registers: 344 bytes of
#: spills; 282 to 286 us at 1024, 768 and 640 threads an SM), with 8 149 us (24 bytes)
LOOKBACK_WIDE_STREAMS = 3


def few_streams(rec: Any, outputs: Any) -> bool:
    """Whether a tile of ``rec`` moves at most LOOKBACK_WIDE_STREAMS arrays (its timed inputs
    and the outputs that ``outputs`` stores)."""
    return len(rec.inputs) + len(stored_outputs(rec, outputs)) <= LOOKBACK_WIDE_STREAMS


#: the look-back tile (threads, elements a thread) of 16-bit inputs in a packed stage
#: (:func:`packed_tile`): measured on an H200 (bfloat16, one call; README, *A packed stage for
#: 16-bit look-back tiles*) against 256 x 16 packed, 0.654 / 0.618 of a copy at 1 x 2^26, 0.639 /
#: 0.601 at 16 x 2^20, 0.664 / 0.625 at 64 x 2^18, 0.641 / 0.606 at 4 x 2^24 (with the outputs
#: still staged as float32 scalars the two tiles were within 2%)
PACKED_LOOKBACK_TILE = (128, 32)


def packable(options: Any, elements: int) -> bool:
    """Whether a look-back tile of ``elements`` a thread can be packed: it moves 16-byte
    vectors (``vector_width`` left automatic, at 16 bytes; whole vectors a thread) and reads no
    input at an offset."""
    from explorer.codegen.options import ELEMENT_BYTES

    size = ELEMENT_BYTES[options.dtype]
    return (options.vector_width == "auto" and options.vector_elements * size == 16
            and (elements * size) % 16 == 0 and not options.read_offsets)


#: the look-back tile of float32 inputs in a packed stage, which its tiles reach by
#: asynchronous copies (:func:`copied_float32`): measured on an H200 (one call; README,
#: *Asynchronous copies into a packed float32 stage*), 256 x 16 at 0.818 of a copy at 1 x 2^26
#: and 0.759 at 16 x 2^20, against 0.798 and 0.742 for 128 x 16 (12 blocks an SM), 0.817 and
#: 0.759 for 128 x 32 (80 registers), 0.786 and 0.726 for 64 x 32 and 0.793 and 0.737 staged
COPIED_LOOKBACK_TILE = (256, 16)


def copied_float32(form: Any, options: Any) -> bool:
    """Whether ``lookback_layout="auto"`` packs a float32 look-back tile (its callers ask
    whether it is ``auto``), which then lands in the stage by asynchronous copies: a scalar
    first-order state forwards in time on a GPU with them (sm_80 on) whose tile moves at most
    LOOKBACK_WIDE_STREAMS arrays, ``tile_layout`` left open."""
    from explorer.codegen.options import async_copies

    return bool(options.tile_layout == "auto"
                and options.target == "cuda" and options.dtype == "float32"
                and async_copies(options.chip)
                and not options.reverse and scalar_first_order(form)
                and few_streams(form.recurrence, options.outputs))


def packed_tile(form: Any, options: Any) -> tuple[int, int] | None:
    """The look-back kernel's tile where it is left open and :func:`lookback_layout` packs it
    by itself: PACKED_LOOKBACK_TILE for 16-bit inputs, COPIED_LOOKBACK_TILE for float32."""
    if options.lookback_layout != "auto":
        return None
    tile = (PACKED_LOOKBACK_TILE if narrow_direct(form, options) else
            COPIED_LOOKBACK_TILE if copied_float32(form, options) else None)
    return tile if tile is not None and packable(options, tile[1]) else None


def lookback_elements(form: Any, options: Any) -> int:
    """``lookback_elements`` resolved: the tile of :func:`packed_tile` where it gives one,
    twice ``elements_per_thread`` (at most 16) for a scalar first-order state whose tile moves
    at most LOOKBACK_WIDE_STREAMS arrays, ``elements_per_thread`` for the others."""
    if options.lookback_elements != "auto":
        return int(options.lookback_elements)
    tile = packed_tile(form, options)
    if tile is not None and options.lookback_threads == "auto":
        return tile[1]
    E = int(options.elements_per_thread)
    return min(16, 2 * E) if scalar_first_order(form) and few_streams(form.recurrence,
                                                                       options.outputs) else E


#: the fewest threads of a look-back block whose threads compose 16 elements
#: (``lookback_threads="auto"`` on the GPU; see :class:`explorer.codegen.options.Options`)
LOOKBACK_THREADS = 256


def lookback_threads(form: Any, options: Any, elements: int) -> int:
    """``lookback_threads`` resolved for a look-back tile of ``elements`` a thread:
    the tile of :func:`packed_tile` where it gives one and the elements are its, at least
    LOOKBACK_THREADS on the GPU where they are 16 (the scalar first-order default),
    ``block_size`` otherwise."""
    if options.lookback_threads != "auto":
        return int(options.lookback_threads)
    tile = packed_tile(form, options)
    if tile is not None and elements == tile[1]:
        return tile[0]
    if options.target == "cuda" and elements == 16:
        return max(int(options.block_size), LOOKBACK_THREADS)
    return int(options.block_size)


def shuffled_sweeps(options: Any) -> bool:
    """``warp_sweeps`` resolved: whether a Blelloch tree's levels inside a warp trade their
    values by shuffles. ``auto``: on the GPU (the host runs every level as a loop over shared
    memory). Measured on an H200 (README, *Speed*)."""
    if options.strategy != "blelloch":
        return False
    if options.warp_sweeps != "auto":
        return bool(options.warp_sweeps == "shuffle")
    return bool(options.target == "cuda")


#: the plain kernel's tile (threads, elements a thread) where ``block_size`` and
#: ``elements_per_thread`` are left open: :data:`SCALAR_TILE` for a scalar first-order state on the
#: GPU whose tile moves at most LOOKBACK_WIDE_STREAMS arrays (a tree plan),
#: :data:`explorer.codegen.options.GENERAL_TILE` for the rest (vector states, states of several
#: components, adjoints, the sequential plan, the host). Measured on an H200 (the affine scan,
#: Blelloch with its levels inside a warp shuffled, ``scanweaver bench``; the look-back kernel is
#: the same for both, 256 by 16): 64 by 16 reached 0.894, 1.039 and 0.924 of a copy at 4096 x 2^10,
#: 131072 x 2^11 and 1024 x 2^14 in float32 against 0.875, 1.039 and 0.909 for 128 by 8, in bfloat16
#: 0.689, 0.920, 0.840 against 0.622, 0.754, 0.711 (README, *Speed*)
SCALAR_TILE = (64, 16)


def _scalar_tile(options: Any, rec: Any) -> bool:
    """Whether an open tile is :data:`SCALAR_TILE` for ``rec``."""
    from explorer.passes.plan_checks import TREES

    return bool(options.target == "cuda" and options.strategy in TREES and not rec.vector
                and sum(rec.order.values()) == 1 and few_streams(rec, options.outputs))


def resolve_tiles(options: Any, rec: Any) -> Any:
    """``options`` with ``block_size`` and ``elements_per_thread`` resolved for the
    recurrence ``rec`` where both are open (a no-op otherwise)."""
    from explorer.codegen.options import GENERAL_TILE

    if options.block_size != "auto" or options.elements_per_thread != "auto":
        return options     # given (validate fills a count left open beside a given one)
    scalar = _scalar_tile(options, rec)
    B, E = SCALAR_TILE if scalar else GENERAL_TILE
    short = options.short_tile
    if short == "auto":     # the short kernel goes with the scalar tile
        short = "x".join(map(str, SHORT_TILE)) if scalar else "none"
    return replace(options, block_size=B, elements_per_thread=E, short_tile=short)


#: the short kernel's tile (threads, elements a thread) and the longest sequence it takes:
#: with the scalar tile (64 x 16, 1024 steps) a 512-step sequence leaves half of each block
#: idle and a 1024-step one gets a block that scans one tile with nothing in flight behind it.
#: Measured on an H200 (the affine scan, one call; README, *Speed*), 32 x 16 against 64 x 16:
#: float32 0.913 against 0.485 of a copy at 16384 x 2^9, 0.902 / 0.890 at 4096 x 2^10, 0.906 /
#: 0.912 at 2048 x 2^12; bfloat16 0.661 / 0.292, 0.770 / 0.684, 0.852 / 0.751; but at
#: 1024 x 2^14 (1024 one-warp blocks) 0.895 / 0.915 and 0.691 / 0.829
SHORT_TILE = (32, 16)
SHORT_LONGEST = 4096


#: the 16-bit dtypes, whose plain and short kernels load their tiles direct and whose look-back
#: kernel stages them (``tile_layout="auto"``, a scalar first-order state moving at most
#: LOOKBACK_WIDE_STREAMS arrays): measured on an H200 (bfloat16, one call each; README, *Speed*):
#: the short kernel's 32 x 16 direct against staged 0.868 / 0.772 of a copy at 4096 x 2^10,
#: 0.825 / 0.658 at 16384 x 2^9, 1.112 / 1.075 at 131072 x 2^11; the plain kernel's 64 x 16 0.889
#: / 0.837 at 1024 x 2^14; the look-back kernel's 256 x 16 0.395 / 0.572 at 1 x 2^26 (direct, it
#: holds its inputs in registers through the tree and the wait: 104 registers, half the blocks)
DIRECT_DTYPES = ("bfloat16", "float16")


def narrow_direct(form: Any, options: Any) -> bool:
    """Whether ``tile_layout="auto"`` gives the plain and short kernels of ``form`` direct
    tiles and its look-back kernel staged ones: 16-bit inputs of a scalar first-order state on
    the GPU whose tile moves at most LOOKBACK_WIDE_STREAMS arrays."""
    return bool(options.tile_layout == "auto" and options.target == "cuda"
                and options.dtype in DIRECT_DTYPES and scalar_first_order(form)
                and few_streams(form.recurrence, options.outputs))


def lookback_layout(form: Any, options: Any, layout: str, elements: int) -> str:
    """How the look-back kernel meets its tile (``scan.lookback {layout}``) of ``elements`` a
    thread: the option ``lookback_layout`` where given; else ``layout`` (``scan.thread``'s),
    but where :func:`narrow_direct` made that direct, packed (16-bit inputs: their stage holds
    them as 16-bit values, read back in vectors; README, *A packed stage for 16-bit look-back
    tiles*) where :func:`packable`, staged otherwise; packed too where
    :func:`copied_float32` (float32 inputs reach the stage by asynchronous copies)."""
    if options.lookback_layout != "auto":
        return str(options.lookback_layout)
    if narrow_direct(form, options):
        return "packed" if packable(options, elements) else "staged"
    if copied_float32(form, options) and packable(options, elements):
        return "packed"
    return layout


def short_tile(options: Any, grid_steps: int) -> tuple[int, int, int] | None:
    """(threads, elements, longest) of the plan's short kernel, or None: ``short_tile`` as
    :func:`resolve_tiles` left it (``auto`` is SHORT_TILE where the plan takes the open scalar
    tile, ``none`` elsewhere; ``auto`` beside a given tile is ``none``), for sequences of at
    most SHORT_LONGEST steps and at most ``grid_steps``, the shortest chunk of the grid's
    other kernels (so that a call launches one or the other)."""
    from explorer.passes.plan_checks import TREES

    if options.short_tile in ("auto", "none") or options.strategy not in TREES:
        return None
    threads, elements = (int(n) for n in str(options.short_tile).split("x"))
    return threads, elements, min(SHORT_LONGEST, grid_steps)


def tile_layout(form: Any, options: Any, stored: tuple[str, ...],
                lane_sum: Any) -> str:
    """``tile_layout`` resolved (``scan.thread {layout}``, the plain kernel's and the short
    kernel's). ``auto`` is ``direct`` for 16-bit inputs where :func:`narrow_direct` says so,
    and for a tree plan on the GPU whose kernels stream no output through the tile: the lane
    loop of a fused lane sum that stores its readouts alone (and last states), where the stage
    would only hold inputs; ``staged`` for the rest."""
    from explorer.passes.plan_checks import TREES

    if options.tile_layout != "auto":
        return str(options.tile_layout)
    if options.target != "cuda" or options.strategy not in TREES:
        return "staged"
    if narrow_direct(form, options):
        return "direct"
    rec = form.recurrence
    summed = lane_sum.readouts if lane_sum is not None and lane_sum.scheme == "lane-loop" else ()
    streamed = [o for o in stored if o in rec.states or (o in rec.readouts and o not in summed)]
    return "direct" if summed and not streamed else "staged"


def grid_scheme(form: Any, options: Any) -> str:
    """The grid level the options ask for, ``"auto"`` resolved: the look-back scan for a tree
    plan of a scalar first-order state (its tiles publish through the packed protocol of
    :mod:`explorer.codegen.lower_lookback`, one load a round), the chunked scan for the rest
    (vector states, whose readouts the chunked grid sums in the scan kernel, and states of
    several components) and for chips whose PTX cannot hold the look-back kernel (sm_70,
    sm_72)."""
    from explorer.codegen.options import lookback_supported
    from explorer.passes.plan_checks import TREES

    if options.grid != "auto":
        return str(options.grid)
    fits = (options.strategy in TREES and scalar_first_order(form)
            and lookback_supported(options.chip))
    return "lookback" if fits else "chunked"
