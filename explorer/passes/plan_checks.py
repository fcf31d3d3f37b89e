"""The checks of a plan read back from IR or from a compiled record (:mod:`explorer.passes.plan`):
a plan the lowering does not implement is refused with ValueError, TypeError or KeyError."""

from __future__ import annotations

from typing import Any

#: the strategies whose block level is a tree over the threads' aggregates
TREES = ("blelloch", "kogge_stone", "warp_shuffle")
#: the lanes that look back: one warp (read back from records where MLIR may be absent, so not
#: taken from the code generator)
LOOKBACK_LANES = 32


def check_vector(plan: Any) -> None:
    """``scan.thread`` as the lowering implements it: a wide access of a power of two up to
    VECTOR_MAX elements that divides the thread's elements (1 for a sequential plan), and a tile
    layout (direct for a tree plan only)."""
    from explorer.codegen.options import VECTOR_MAX

    v = plan.vector_width
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1) or (
            v > VECTOR_MAX or plan.elements % v or (plan.tree not in TREES and v != 1)
            or (plan.lookback is not None and plan.lookback.elements % v)):
        raise ValueError(f"a wide access of {v!r} elements is not one the lowering implements "
                         f"for {plan.elements} elements a thread (a power of two up to "
                         f"{VECTOR_MAX} that divides them; 1 for a sequential plan)")
    if plan.layout not in ("staged", "direct") or (
            plan.layout == "direct" and plan.tree not in TREES):
        raise ValueError(f"a tile layout {plan.layout!r} is not one the lowering implements "
                         "(staged, or direct for a tree plan)")


def lane_sum_from(raw: Any) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError("a plan's lane_sum is a JSON object")
    from explorer.passes.plan import LaneSum

    return LaneSum(tuple(str(r) for r in raw["readouts"]), str(raw["scheme"]))


def check_lane_sum(plan: Any) -> None:
    """A lane sum the lowering implements for the plan's strategy and grid, of readouts that
    are stored."""
    if not plan.stored or len(set(plan.stored)) != len(plan.stored):
        raise ValueError(f"a plan stores one or more distinct outputs, not {list(plan.stored)}")
    ls = plan.lane_sum
    if ls is None:
        return
    want = ("lanes-in-block" if plan.tree not in TREES else
            "readout-kernel" if plan.grid.scheme == "lookback" else "lane-loop")
    if ls.scheme != want:
        raise ValueError(f"a {plan.strategy} plan on the {plan.grid.scheme} grid sums the "
                         f"lanes as {want!r}, not {ls.scheme!r}")
    if not ls.readouts or not set(ls.readouts) <= set(plan.stored):
        raise ValueError(f"scan.lane_sum sums {list(ls.readouts)}: readouts the plan stores "
                         f"({list(plan.stored)})")


def _fields(raw: Any, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """``raw`` (a record's or an op's attributes) when it is an object with ``keys``."""
    if not isinstance(raw, dict):
        raise TypeError(f"a plan's {what} is a JSON object")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise ValueError(f"a plan's {what} lacks {', '.join(missing)}")
    return raw


def lookback_from(raw: Any, threads: int, layout: str) -> Any:
    """A plan's look-back (None: none); ``threads``, the block's, and ``layout``, the plan's,
    where it names none (a plan written before the look-back block had threads or a layout of
    its own)."""
    if raw is None:
        return None
    raw = _fields(raw, "lookback", ("lanes", "tiles_per_lane", "elements"))
    from explorer.passes.plan import Lookback

    return Lookback(int(raw["lanes"]), int(raw["tiles_per_lane"]), int(raw["elements"]),
                    int(raw.get("threads", threads)), str(raw.get("layout", layout)))


def short_from(raw: Any, layout: str) -> Any:
    """A plan's short kernel (None: none), from its ``scan.short`` attributes or a record
    (``layout``, the plan's, where it names none)."""
    if raw is None:
        return None
    raw = _fields(raw, "short kernel", ("threads", "elements", "longest"))
    from explorer.passes.plan import Short

    return Short(int(raw["threads"]), int(raw["elements"]), int(raw["longest"]),
                 str(raw.get("layout", layout)))


def _check_tiles(layout: str, whose: str, packed: bool = False) -> None:
    """A kernel's own tile layout (``scan.short``'s, ``scan.lookback``'s) is one the lowering
    implements (``packed``: the look-back kernel's alone)."""
    known = ("staged", "direct", "packed") if packed else ("staged", "direct")
    if layout not in known:
        raise ValueError(f"{whose} tiles {layout!r:.40} are not a layout the lowering "
                         f"implements ({', '.join(known)})")


def check_short(plan: Any) -> None:
    """``scan.short`` goes with a tree plan, has a block the lowering implements, and takes
    only sequences that no kernel of the grid takes (at most its shortest chunk)."""
    short = plan.short
    if short is None:
        return
    if plan.tree not in TREES or plan.lane_sum is not None:
        raise ValueError("scan.short goes with a tree plan that sums no lanes")
    n, e = short.threads, short.elements
    if not 32 <= n <= 1024 or n & (n - 1) or not 1 <= e <= 16 or e & (e - 1):
        raise ValueError(f"a short kernel of {n} threads x {e} elements is not one the "
                         "lowering implements (powers of two: a warp to 1024 threads, at "
                         "most 16 elements)")
    _check_tiles(short.layout, "a short kernel's")
    if e % plan.vector_width:
        raise ValueError(f"a short kernel of {e} elements a thread cannot take the plan's "
                         f"accesses of {plan.vector_width}")
    most = plan.grid.shortest_chunk
    if not 1 <= short.longest <= most:
        raise ValueError(f"a short kernel for sequences of up to {short.longest} steps: "
                         f"from 1 to {most} (the grid's shortest chunk)")


def check_lookback(plan: Any) -> None:
    """A look-back grid has its ``scan.lookback`` (a warp of lanes), and no other grid has one."""
    from explorer.codegen.options import LOOKBACK_ELEMENTS_MAX as EMAX
    from explorer.codegen.options import LOOKBACK_TILES_MAX as TMAX
    look = plan.lookback
    if (look is not None) != (plan.grid.scheme == "lookback"):
        raise ValueError("scan.lookback goes with the lookback grid, and only with it")
    if look is not None:
        t = look.tiles_per_lane
        if look.lanes != LOOKBACK_LANES or not 1 <= t <= TMAX or t & (t - 1):
            raise ValueError(f"a look-back of {look.lanes} lanes x {t} tiles is not one the "
                             f"lowering implements (a warp of 32, 1 to {TMAX} tiles a lane)")
        e = look.elements
        if not 1 <= e <= EMAX or e & (e - 1):
            raise ValueError(f"a look-back tile of {e} elements a thread is not one the "
                             f"lowering implements (a power of two up to {EMAX})")
        n = look.threads
        if not 32 <= n <= 1024 or n & (n - 1):
            raise ValueError(f"a look-back block of {n} threads is not one the lowering "
                             "implements (a power of two from a warp to 1024)")
        if plan.grid.tile != n * e:
            raise ValueError(f"the look-back grid's tile is {plan.grid.tile} steps, not "
                             f"{n} threads x {e} elements")
        _check_tiles(look.layout, "a look-back kernel's", packed=True)
        v = plan.vector_width
        if look.layout == "packed" and (plan.reads or not isinstance(v, int) or v < 4
                                        or e % v):
            raise ValueError("a packed look-back tile moves whole 16-byte vectors of each "
                             "input at its own positions: no input read at an offset, and "
                             f"{e} elements a thread a multiple of the plan's accesses of "
                             f"{v!r:.20} (at least 4)")


def reads_from(raw: Any) -> tuple[tuple[str, int], ...]:
    """The ``scan.read`` pairs of a record's plan (a list of ``[input, offset]``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise TypeError("a plan's reads are a JSON list")
    out = []
    for pair in raw:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise TypeError("a plan's read is an [input, offset] pair")
        name, k = pair
        if not isinstance(name, str) or isinstance(k, bool) or not isinstance(k, int):
            raise TypeError("a plan's read is an [input, offset] pair")
        out.append((name, k))
    return tuple(out)


def check_reads(plan: Any) -> None:
    """Inputs read in place at another time (``scan.read``): each once, by name, at a nonzero
    offset the lowering implements, sorted by name."""
    from explorer.codegen.options import READ_OFFSET_MAX

    names = [n for n, _ in plan.reads]
    if names != sorted(set(names)):
        raise ValueError(f"scan.read names each input once, in order: {names}")
    for name, k in plan.reads:
        if not name.isidentifier() or k == 0 or abs(k) > READ_OFFSET_MAX:
            raise ValueError(f"scan.read of {name!r:.40} at offset {k} is not one the lowering "
                             f"implements (a nonzero offset of at most {READ_OFFSET_MAX} steps)")


def check_plan(plan: Any) -> None:
    """Every check of a plan read back (from IR or from a record), beside its grid's: the
    thread's accesses and the reads first (a look-back tile's own check relies on them)."""
    check_vector(plan)
    check_reads(plan)
    check_lookback(plan)
    check_short(plan)
    check_lane_sum(plan)
