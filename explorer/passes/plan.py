"""Pass ``scan-plan``: ``scan.affine`` + the compile options -> the plan, as ``scan`` ops.

The plan says how the scan maps onto the machine, from the innermost level out:

* ``scan.thread {elements = E, vector_width = V}``: each thread composes E consecutive elements
  serially in registers (E - 1 combines); the tile reaches the block's stage (and the outputs
  leave it) V consecutive elements a thread at once, one vector access (``vector<4xf32>``: 16
  bytes), where the rows and the tile start are aligned to V elements and the tile is whole (a
  check per tile; the scalar accesses otherwise); V = 1: one element an access. Its ``layout``
  says how the tile meets the threads on the GPU: ``staged`` through the block's shared-memory
  stage (thread ``tid`` moves positions ``(g B + tid) V + j``, a warp's accesses coalesced),
  ``direct`` from registers (thread ``tid`` loads and stores its own E positions ``tid E + k``,
  no stage and no barrier for it; see :func:`tile_layout`);
* ``scan.block {threads = B, tree = ...}``: B threads, and the tree that scans their B aggregates
  in shared memory, spelled out as one ``scan.sweep {phase, stride, active, via}`` per level (a
  barrier after each): ``blelloch`` is an up-sweep (strides 1 .. B/2; the last level also sets
  the total aside and starts the down-sweep, phase ``up_root``) and a down-sweep (strides B/4 ..
  1) giving exclusive prefixes; on the GPU its levels whose pairs lie inside one warp (strides
  1 .. 16) are ``via = "shuffle"`` (option ``warp_sweeps``): the aggregates stay in registers
  and the partners' values come by ``gpu.shuffle``, with no barrier, the warp's last lane
  meeting the levels in shared memory; ``kogge_stone`` is ``log2 B`` levels of phase ``scan``
  (stride 2^d, every thread i >= 2^d combining with i - 2^d) giving inclusive prefixes;
  ``warp_shuffle`` keeps the aggregates in registers: five levels of phase ``shuffle`` (strides
  1 .. 16, Kogge-Stone among the 32 lanes of each warp, the values traded by ``gpu.shuffle up``,
  no barrier), then, for more than one warp, one level of phase ``warps`` (stride 32, ``active``
  the warps): each warp's last lane leaves the warp's total in shared memory, a barrier, and
  every thread joins the totals of the warps before its own, in order;
* ``scan.grid {scheme, direction, tile, min_tiles, fill, unchunked_from}``: the direction in
  time (``forward``, or ``reverse``: position t of the scan is time L - 1 - t, so
  ``h[t] = A_t h[t+1] + b_t`` with the initial state after the last step), and how a sequence is
  spread over blocks: whole when there are enough sequences to fill the GPU, else
  ``lookback``: one tile a block in a single pass (each block publishes its tile's aggregate,
  then the state after it; a block takes the state before its tile by looking back over the
  tiles before it, a warp at a time: Merrill and Garland's decoupled look-back), or
  ``chunked``: chunks of whole tiles (reduce each chunk, carry across chunks, rescan from the
  carry: the inputs are read twice), the chunk length chosen per call by this rule;
* ``scan.lookback {lanes = 32, tiles_per_lane, elements, threads, layout}`` (look-back grids
  only): the warp that looks back examines ``lanes * tiles_per_lane`` tiles per round trip to
  memory; a look-back block has ``threads`` threads (its tree is ``scan.block``'s tree over
  them, the sweeps ``sweeps_of(tree, threads)``, in shared memory), each composing
  ``elements`` elements (its tile, ``scan.grid {tile}``, is ``threads * elements``) and meets
  its tile as ``layout`` says (``scan.thread``'s layouts, or ``packed``, its own: the stage
  holds the inputs as they are in memory and each thread reads its own back in 16-byte
  vectors, :mod:`explorer.codegen.packed`; packed on a tile of 128 x 32 for 16-bit inputs whose
  plain kernel is direct, see :func:`lookback_layout`; the plain kernel of whole sequences keeps
  ``scan.block {threads}`` and ``scan.thread {elements, layout}``);
* ``scan.short {threads, elements, longest, layout}`` (tree plans, optional): sequences of at
  most ``longest`` steps run whole in a kernel of their own whose block has ``threads`` threads
  of ``elements`` elements (the same tree over them) and meets its tile as ``layout`` says
  (``scan.thread``'s layouts), longer ones in the kernels above; ``longest``
  is at most the grid's shortest chunk (``tile * min_tiles``), so a call launches one or the
  other;
* ``scan.store {outputs}``: the outputs the kernels write, chosen by the ``outputs`` option
  (:func:`stored_outputs`): by default the readouts when the recurrence has any, so a state
  that nobody asked for is never written; ``<state>_last`` (``h_last``) is the state after the
  last step of each sequence, written once per sequence by whichever thread computes it (the
  state history itself is not stored unless asked for);
* ``scan.read {input, offset}`` (option ``read_offsets``): the array passed as ``input`` is
  read in place at time ``t + offset`` for step t (zero where that is outside the sequence):
  the adjoint of a recurrence reads the forward's ``a`` as ``a_next`` (``a[t+1]``) and its
  saved states as ``h[t-1]`` this way, with no shifted copy of them;
* ``scan.segments {argument, reset = "leaf"}`` (``varlen=True``): sequences packed along time;
  the kernels read ``argument`` (per step: the sequence, whether it starts or ends there) and
  restart the state at each start by rewriting the leaf, ``(A_t, b_t) -> (0, A_t h0 + b_t)``
  (``h0``: that sequence's initial state): a segmented scan every tree and grid runs unchanged;
* ``scan.lane_sum {readouts, scheme}`` (a vector state whose readouts are stored): where the
  readouts' sums over the lanes ``n`` are computed. ``lanes-in-block`` (sequential plans): the
  N lanes of a channel are consecutive threads of one block (``floor(B / N)`` channels a block,
  so ``N <= B``); after each warp tile every thread leaves its lane's terms in shared memory and
  the block sums them, a readout value per (channel, step), written coalesced along time.
  ``lane-loop`` (tree plans, chunked grid): one block per chunk of a channel scans the channel's
  lanes one after another, tile by tile, from each lane's true incoming state (the carry, kept
  per lane between tiles), adding each lane's terms into a shared-memory row of the tile; then
  the readout is written. ``readout-kernel`` (look-back grid): a kernel after the scan reads the
  states back (a workspace of the compile when they are not stored).

The ``sequential`` strategy has ``scan.warp_tile {sequences = 32, steps}`` (a warp stages 32
sequences x ``steps`` time steps through shared memory, coalesced, then each thread walks its
own sequence), ``scan.block {tree = "none"}`` and ``scan.grid {scheme = "sequence-per-thread"}``.

:func:`read_plan` reads the ops back into a :class:`Plan`: the lowering and the picture both
read the plan from here, so the tree that is drawn is the tree that runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explorer.dialect import scan
from explorer.frontend.names import SEGMENT_MARKS
from explorer.passes.outputs import stored_outputs
from explorer.passes.plan_checks import (
    LOOKBACK_LANES,
    TREES,
    check_plan,
    lane_sum_from,
    lookback_from,
    reads_from,
    short_from,
)
from explorer.passes.plan_options import (
    grid_scheme,
    lookback_elements,
    lookback_layout,
    lookback_threads,
    resolve_tiles,
    short_tile,
    shuffled_sweeps,
    tile_layout,
)
from explorer.passes.plans import WARP_LANES, Level, ScanPlan, Step, warp_levels
from explorer.passes.state import ScanState

NAME = "scan-plan"


@dataclass(frozen=True)
class Sweep:
    """One level of the block tree: ``phase`` up / up_root / down (Blelloch), scan
    (Kogge-Stone) or shuffle / warps (warp shuffles), partners ``stride`` apart, ``active``
    threads (warps for ``warps``) working. ``via``: ``shared`` (the level's values in shared
    memory, a barrier after it) or ``shuffle`` (a Blelloch level whose pairs lie in one warp,
    its values traded in registers by ``gpu.shuffle``, no barrier)."""

    phase: str
    stride: int
    active: int
    via: str = "shared"


#: the grid schemes of tree plans
TREE_GRIDS = ("lookback", "chunked")


@dataclass(frozen=True)
class Grid:
    scheme: str          # "lookback", "chunked" or "sequence-per-thread"
    direction: str = "forward"    # or "reverse": scan position t is time L - 1 - t
    tile: int = 0
    min_tiles: int = 0
    fill: float = 0.0
    unchunked_from: float = 0.0

    @property
    def shortest_chunk(self) -> int:
        """Steps of the shortest chunk a call may cut (the longest a short kernel takes)."""
        return self.tile * max(1, self.min_tiles)


@dataclass(frozen=True)
class Lookback:
    """How far the look-back sees per round trip: ``lanes`` lanes of a warp, each examining
    ``tiles_per_lane`` consecutive tiles; ``elements`` a thread of its tile, ``threads`` a
    block (its block tree is ``scan.block``'s tree over these threads)."""

    lanes: int
    tiles_per_lane: int
    elements: int
    threads: int
    #: how its tile meets the threads: staged | direct (scan.thread's) | packed (its own: the
    #: stage holds the inputs as in memory, read back in 16-byte vectors)
    layout: str = "staged"

    def sweeps(self, tree: str) -> tuple[Sweep, ...]:
        """The levels of the look-back block's tree (``tree`` over :attr:`threads`), all in
        shared memory: with its Blelloch levels inside a warp shuffled, the look-back kernel
        measured slower on an H200 (README, *Speed*)."""
        return sweeps_of(tree, self.threads)


@dataclass(frozen=True)
class Short:
    """``scan.short``: the kernel of sequences of at most ``longest`` steps, its block of
    ``threads`` threads by ``elements`` elements."""

    threads: int
    elements: int
    longest: int
    layout: str = "staged"    # staged | direct (scan.thread's)

    def sweeps(self, tree: str, shuffled: bool) -> tuple[Sweep, ...]:
        """The levels of its block's tree (``tree`` over :attr:`threads`, shuffled inside a
        warp as the plain block's are)."""
        return sweeps_of(tree, self.threads, shuffled)


#: where the sums over the lanes of a readout are computed (``scan.lane_sum``'s scheme)
LANE_SUM_SCHEMES = ("lanes-in-block", "lane-loop", "readout-kernel")


@dataclass(frozen=True)
class LaneSum:
    """``scan.lane_sum``: the readouts summed over the lanes of a vector state, and where."""

    readouts: tuple[str, ...]
    scheme: str

    @property
    def fused(self) -> bool:
        """Summed inside the scan kernel (the states need not go through memory)."""
        return self.scheme != "readout-kernel"


@dataclass(frozen=True)
class Plan:
    """The plan as read from the IR."""

    strategy: str
    threads: int
    elements: int                 # per thread (tree strategies; 1 for sequential)
    tree: str                     # blelloch | kogge_stone | warp_shuffle | none
    sweeps: tuple[Sweep, ...]
    grid: Grid
    tile_steps: int = 0           # sequential: time steps of a warp tile
    lookback: Lookback | None = None   # look-back grids only
    stored: tuple[str, ...] = ()       # the outputs the kernels write (scan.store)
    lane_sum: LaneSum | None = None    # a vector state's readouts (scan.lane_sum)
    segments: bool = False             # packed variable-length sequences (scan.segments)
    vector_width: int = 1         # elements of one wide tile access (scan.thread; 1: scalar)
    layout: str = "staged"        # how the tile meets the threads (scan.thread): staged | direct
    #: inputs read in place at another time (scan.read): (name, offset) pairs, sorted
    reads: tuple[tuple[str, int], ...] = ()
    short: Short | None = None         # a kernel of its own for short sequences (scan.short)

    @property
    def shuffled(self) -> bool:
        """Whether the block tree's levels inside a warp trade values by shuffles."""
        return any(sw.via == "shuffle" for sw in self.sweeps)

    def picture(self, positions: int = 16) -> ScanPlan:
        """The block tree over the first ``positions`` thread aggregates, level by level, as
        the sweeps of the IR define it (a :class:`ScanPlan` that draws and runs on NumPy)."""
        n = min(positions, self.threads)
        if self.tree == "none":
            chain = tuple(Level("scan", (Step("combine", i - 1, i),)) for i in range(1, n))
            return ScanPlan("sequential", n, n, chain)
        def up(s: int) -> Level:
            return Level("up", tuple(Step("combine", r - s, r) for r in range(2 * s - 1, n, 2 * s)))

        def down(s: int) -> Level:
            return Level("down", tuple(Step("swap", r - s, r) for r in range(2 * s - 1, n, 2 * s)))

        levels: list[Level]
        if self.tree == "warp_shuffle":
            strides = tuple(sw.stride for sw in self.sweeps if sw.phase == "shuffle")
            return ScanPlan(self.tree, n, n, warp_levels(n, strides))
        if self.tree == "kogge_stone":
            levels = [Level("scan", tuple(Step("combine", i - sw.stride, i)
                                          for i in range(sw.stride, n)))
                      for sw in self.sweeps if sw.stride < n]
        else:
            # the up-sweep's last level (up_root) also swaps the root: drawn as the first
            # level of the down-sweep, as the picture's own root (n // 2 when n < threads)
            levels = [up(sw.stride) for sw in self.sweeps
                      if sw.phase in ("up", "up_root") and sw.stride < n]
            levels += [down(n // 2)] if n > 1 else []
            levels += [down(sw.stride) for sw in self.sweeps
                       if sw.phase == "down" and sw.stride < n // 2]
        return ScanPlan(self.tree, n, n, tuple(levels))


def sweeps_of(tree: str, threads: int, shuffled: bool = False) -> tuple[Sweep, ...]:
    """The levels of ``tree`` over ``threads`` threads; ``shuffled`` (Blelloch): the levels
    whose pairs lie inside one warp (stride at most 16) trade their values by shuffles."""
    levels = threads.bit_length() - 1
    if tree == "blelloch":
        def via(d: int) -> str:
            return "shuffle" if shuffled and 2 << d <= WARP_LANES else "shared"
        up = [Sweep("up_root" if d == levels - 1 else "up", 1 << d, threads >> (d + 1), via(d))
              for d in range(levels)]
        down = [Sweep("down", 1 << d, threads >> (d + 1), via(d))
                for d in reversed(range(levels - 1))]
        return tuple(up + down)
    if shuffled:
        raise ValueError(f"only a blelloch tree shuffles its levels inside a warp, not {tree!r}")
    if tree == "kogge_stone":
        return tuple(Sweep("scan", 1 << d, threads - (1 << d)) for d in range(levels))
    if tree == "warp_shuffle":
        warps = threads // WARP_LANES
        shuffles = [Sweep("shuffle", 1 << d, warps * (WARP_LANES - (1 << d))) for d in range(5)]
        return tuple(shuffles + ([Sweep("warps", WARP_LANES, warps)] if warps > 1 else []))
    raise ValueError(f"unknown tree {tree!r}")


def implemented_sweeps(tree: str, threads: int, sweeps: tuple[Sweep, ...]) -> bool:
    """Whether ``sweeps`` are those of ``tree`` over ``threads`` threads, shuffled or not, as
    the lowering implements them (a record's or an IR's levels)."""
    shuffled = tree == "blelloch" and any(sw.via == "shuffle" for sw in sweeps)
    return sweeps == sweeps_of(tree, threads, shuffled)


def lane_sum_of(form: Any, stored: tuple[str, ...], strategy: str, grid: str
                ) -> LaneSum | None:
    """Where the stored readouts of a vector state sum its lanes (None: nothing to sum)."""
    # a lane readout (a value per lane) sums nothing: it is written beside the state
    lanes = set(form.recurrence.lane_readouts)
    readouts = tuple(r for r in form.recurrence.readouts if r in stored and r not in lanes)
    if not form.vector or not readouts:
        return None
    if strategy not in TREES:
        return LaneSum(readouts, "lanes-in-block")
    return LaneSum(readouts, "readout-kernel" if grid == "lookback" else "lane-loop")


def choose_plan(form: Any, options: Any) -> Plan:
    """The plan for ``form`` under ``options`` (what ``scan-plan`` writes as ops)."""
    from explorer.codegen.contract import CHUNK_FILL, LOOKBACK_UNCHUNKED_FROM, UNCHUNKED_FROM
    from explorer.codegen.lower_sequential import seq_layout

    o = resolve_tiles(options, form.recurrence)   # a tile left open: the plan's choice
    direction = "reverse" if o.reverse else "forward"
    stored = stored_outputs(form.recurrence, o.outputs)
    scheme = grid_scheme(form, o)
    lane_sum = lane_sum_of(form, stored, o.strategy, scheme)
    unknown = [n for n, _ in o.read_offsets if n not in form.recurrence.inputs]
    if unknown:
        from explorer.errors import OptionError
        raise OptionError(f"read_offsets names {', '.join(unknown)}, not a timed input of the "
                          f"recurrence ({', '.join(form.recurrence.inputs)})")
    if o.strategy in TREES:
        look = lookback_elements(form, o)
        threads = lookback_threads(form, o, look)
        grid = (Grid("lookback", direction, threads * look, 1, CHUNK_FILL,
                     LOOKBACK_UNCHUNKED_FROM)
                if scheme == "lookback" else
                Grid("chunked", direction, o.tile, o.chunk_tiles, CHUNK_FILL, UNCHUNKED_FROM))
        short = short_tile(o, grid.shortest_chunk)
        if short is not None and lane_sum is not None:
            from explorer.errors import OptionError
            raise OptionError(f"short_tile {o.short_tile!r}: the plan sums the lanes of "
                              f"{', '.join(lane_sum.readouts)} in its own kernels, which a "
                              "short kernel does not; leave short_tile 'auto' or 'none'")
        layout = tile_layout(form, o, stored, lane_sum)
        return Plan(o.strategy, o.block_size, o.elements_per_thread, o.strategy,
                    sweeps_of(o.strategy, o.block_size, shuffled_sweeps(o)), grid,
                    lookback=(Lookback(LOOKBACK_LANES, o.lookback_tiles, look, threads,
                                       lookback_layout(form, o, layout, look))
                              if grid.scheme == "lookback" else None),
                    stored=stored, lane_sum=lane_sum, segments=o.varlen,
                    vector_width=o.vector_elements,
                    layout=layout, reads=o.read_offsets,
                    short=Short(*short, layout) if short is not None else None)
    return Plan("sequential", o.block_size, 1, "none", (),
                Grid("sequence-per-thread", direction),
                tile_steps=seq_layout(form, o, stored, lane_sum).steps, stored=stored,
                lane_sum=lane_sum, segments=o.varlen, reads=o.read_offsets)


def write_plan(plan: Plan, readout_loc: Any = None) -> None:
    """The ops of ``plan`` at the current insertion point (``scan.lane_sum`` at
    ``readout_loc``, the location of the first readout it sums, when given)."""
    from explorer.codegen.threads import WARP

    if plan.tree in TREES:
        scan.create("thread", {"elements": plan.elements,
                                 "vector_width": plan.vector_width, "layout": plan.layout})
    else:
        scan.create("warp_tile", {"sequences": WARP, "steps": plan.tile_steps})
    scan.create("block", {"threads": plan.threads, "tree": plan.tree})
    for sw in plan.sweeps:
        scan.create("sweep", {"phase": sw.phase, "stride": sw.stride, "active": sw.active,
                              "via": sw.via})
    g = plan.grid
    scan.create("grid", {"scheme": g.scheme, "direction": g.direction, "tile": g.tile,
                         "min_tiles": g.min_tiles,
                         "fill": float(g.fill), "unchunked_from": float(g.unchunked_from)})
    if plan.lookback is not None:
        scan.create("lookback", {"lanes": plan.lookback.lanes,
                                 "tiles_per_lane": plan.lookback.tiles_per_lane,
                                 "elements": plan.lookback.elements,
                                 "threads": plan.lookback.threads,
                                 "layout": plan.lookback.layout})
    if plan.short is not None:
        scan.create("short", {"threads": plan.short.threads, "elements": plan.short.elements,
                              "longest": plan.short.longest, "layout": plan.short.layout})
    scan.create("store", {"outputs": list(plan.stored)})
    for name, k in plan.reads:
        scan.create("read", {"input": name, "offset": k})
    if plan.segments:
        scan.create("segments", {"argument": SEGMENT_MARKS, "reset": "leaf"})
    if plan.lane_sum is not None:
        scan.create("lane_sum", {"readouts": list(plan.lane_sum.readouts),
                                 "scheme": plan.lane_sum.scheme}, loc=readout_loc)


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from mlir.ir import InsertionPoint

        affine = scan.ops(module_op, "affine")
        if len(affine) != 1 or state.form is None:
            raise ValueError(f"{NAME} runs after scan-decompose (one scan.affine)")
        last = scan.ops(module_op)[-1]
        plan = choose_plan(state.form, state.options)
        readouts = {scan.attrs(op)["target"]: op.location
                    for op in scan.ops(module_op, "readout")}
        loc = (readouts.get(plan.lane_sum.readouts[0]) if plan.lane_sum is not None else None)
        with InsertionPoint.after(last), affine[0].location:
            write_plan(plan, loc)
        state.plan = read_plan(module_op)
    return run


def plan_from_dict(raw: Any) -> Plan:
    """A :class:`Plan` from its ``dataclasses.asdict`` form (a compiled record's), checked:
    ValueError, TypeError or KeyError when it is not one the lowering implements."""
    if not isinstance(raw, dict):
        raise TypeError("a plan is a JSON object")
    sweeps = tuple(Sweep(str(s["phase"]), int(s["stride"]), int(s["active"]),
                         str(s.get("via", "shared")))
                   for s in raw["sweeps"])
    g = raw["grid"]
    layout = str(raw.get("layout", "staged"))   # a kernel's own layout where it names none
    plan = Plan(str(raw["strategy"]), int(raw["threads"]), int(raw["elements"]),
                str(raw["tree"]), sweeps,
                Grid(str(g["scheme"]), str(g["direction"]), int(g["tile"]), int(g["min_tiles"]),
                     float(g["fill"]), float(g["unchunked_from"])), int(raw["tile_steps"]),
                lookback_from(raw.get("lookback"), int(raw["threads"]), layout),
                tuple(str(o) for o in raw["stored"]), lane_sum_from(raw.get("lane_sum")),
                bool(raw.get("segments", False)), int(raw.get("vector_width", 1)),
                layout, reads_from(raw.get("reads")), short_from(raw.get("short"), layout))
    threads = plan.threads
    if threads < 1 or threads > 1024 or threads & (threads - 1):
        raise ValueError("a plan's threads are a power of two up to 1024")
    if plan.tree in TREES:
        if not implemented_sweeps(plan.tree, threads, plan.sweeps):
            raise ValueError(f"the sweeps are not those of a {plan.tree} tree")
        if plan.grid.scheme not in TREE_GRIDS:
            raise ValueError(f"a tree plan's grid is one of {', '.join(TREE_GRIDS)}, "
                             f"not {plan.grid.scheme!r}")
    elif plan.tree != "none" or plan.sweeps:
        raise ValueError(f"unknown tree {plan.tree!r}")
    elif plan.grid.scheme != "sequence-per-thread":
        raise ValueError(f"unknown grid {plan.grid.scheme!r} for a sequential plan")
    check_plan(plan)
    if plan.grid.direction not in ("forward", "reverse"):
        raise ValueError(f"unknown direction {plan.grid.direction!r}")
    return plan


def read_plan(module_op: Any) -> Plan:
    """The :class:`Plan` that the ``scan`` ops of ``module_op`` describe."""
    def one(name: str) -> dict[str, Any] | None:
        found = scan.ops(module_op, name)
        if len(found) > 1:
            raise ValueError(f"the plan has {len(found)} scan.{name} ops")
        return scan.attrs(found[0]) if found else None

    block, grid = one("block"), one("grid")
    if block is None or grid is None:
        raise ValueError("no plan in the module (run scan-plan first)")
    thread, tile, look, short = one("thread"), one("warp_tile"), one("lookback"), one("short")
    store, lane_sum, segments = one("store"), one("lane_sum"), one("segments")
    if segments is not None and (segments.get("argument") != SEGMENT_MARKS
                                 or segments.get("reset") != "leaf"):
        raise ValueError(f"scan.segments {segments} is not one the lowering implements "
                         f"(argument {SEGMENT_MARKS!r}, reset 'leaf')")
    if store is None:
        raise ValueError("the plan has no scan.store (which outputs the kernels write)")
    sweeps = tuple(Sweep(a["phase"], a["stride"], a["active"], a["via"])
                   for a in map(scan.attrs, scan.ops(module_op, "sweep")))
    layout = thread["layout"] if thread else "staged"   # a kernel's own where it names none
    tree = block["tree"]
    if tree in TREES and not implemented_sweeps(tree, block["threads"], sweeps):
        raise ValueError(f"the sweeps of the {tree} tree over {block['threads']} threads are "
                         "not the ones its lowering implements")
    if (grid["scheme"] in TREE_GRIDS) != (tree in TREES):
        raise ValueError(f"a {tree} block cannot be spread over the grid as "
                         f"{grid['scheme']!r}")
    plan = Plan(strategy=tree if tree in TREES else "sequential", threads=block["threads"],
                elements=thread["elements"] if thread else 1, tree=tree, sweeps=sweeps,
                grid=Grid(grid["scheme"], grid["direction"], grid["tile"], grid["min_tiles"],
                          grid["fill"], grid["unchunked_from"]),
                tile_steps=tile["steps"] if tile else 0,
                lookback=lookback_from(look, block["threads"], layout),
                stored=tuple(store["outputs"]),
                lane_sum=lane_sum_from(lane_sum), segments=segments is not None,
                vector_width=thread["vector_width"] if thread else 1,
                layout=layout,
                reads=reads_from([[a.get("input"), a.get("offset")]
                                  for a in map(scan.attrs, scan.ops(module_op, "read"))]),
                short=short_from(short, layout))
    check_plan(plan)
    return plan


def plan_ir(module_text: str) -> Plan:
    """:func:`read_plan` of a module's text (the ``plan`` stage's), in a context of its own."""
    from mlir.ir import Context, Location, Module

    with Context() as ctx, Location.unknown():
        scan.load(ctx)
        return read_plan(Module.parse(module_text).operation)
