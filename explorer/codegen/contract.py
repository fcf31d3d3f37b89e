"""The kernel contract as the lowering writes it: the kernels of a compile in launch order with
their geometry (:class:`KernelSpec`: what the manifest says, plus what only the compiler needs),
the arguments in parameter order (:func:`kernel_args`), and the rule that picks the chunk length
of each call (:func:`chunk_rule`). Its manifest form is read, checked and typed by
:mod:`explorer.runtime.contract`, which every launcher uses (the grid and workspace rules live
there, once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from explorer.codegen.emit import (
    Algebra,
)
from explorer.codegen.options import Options
from explorer.frontend.names import (
    AGGREGATES,
    CARRIES,
    SEGMENT_MARKS,
    TILE_FLAGS,
    TIME_CHUNK,
    h0_name,
    last_name,
)

KERNEL_PREFIX = "scanweaver"

#: words (floats) a tile has in the look-back's ``tile_flags`` workspace (see
#: :mod:`explorer.codegen.lower_lookback`: a flag, or a packed aggregate and state)
TILE_SLOT_WORDS = 4

#: how a kernel whose grid counts channels spreads them over blocks (the manifest's
#: ``channels``; the launchers read the rule from :mod:`explorer.runtime.contract`):
#: ``threads``: a lane a thread, ``floor(threads / N)`` whole channels a block (N <= threads);
#: ``block``: one channel a block, its lanes one after another
CHANNEL_RULES = ("threads", "block")


#: the readout kernel's time_chunk, in blocks of threads: with N lanes a block covers about
#: READOUT_CHUNK_TILES * block_size / N steps
READOUT_CHUNK_TILES = 16


#: the host functions of the CPU target that emulate one kernel's grid end with this
GRID_SUFFIX = "_grid"


#: chunk rule, in units of the device's resident-block slots (SMs x blocks/SM): blocks wanted
#: when chunking, and the sequences from which each runs whole in one block. Measured on an
#: H200 (bench/kernel_speed.py, 2112 slots; ratio to copy, unchunked against the best chunked):
#: 16 sequences 0.05 / 0.53, 256: 0.64 / 0.56, 512: 0.85 / 0.56, 1024: 0.83 / 0.52; chunked,
#: 1 to 4 times the slots in blocks are within a few percent of each other
CHUNK_FILL = 2.0


UNCHUNKED_FROM = 0.1

#: the look-back scan runs each sequence whole in one block from this many sequences (in
#: units of the resident-block slots), else one tile a block: where the chunked scan runs them
#: whole too (measured on an H100 at 1024 x 2^14: whole sequences 0.89 of a copy, the first
#: look-back 0.34)
LOOKBACK_UNCHUNKED_FROM = UNCHUNKED_FROM


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of the module and how to launch it (block, grid rule, shared memory)."""

    name: str
    role: str                     # "scan", "reduce", "carry", "lookback" or "readout"
    block: tuple[int, int, int]
    sequences_per_block: int      # grid_x = ceil(C * N / sequences_per_block) [* chunks]
    shared_bytes: int = 0         # dynamic shared memory to pass at launch
    static_shared_bytes: int = 0  # shared memory declared in the kernel itself
    # an int, or TIME_CHUNK: the value of the size argument of that name (chosen per call)
    time_chunk: int | str | None = None  # grid_x *= ceil(L / time_chunk); block = seq*chunks+k
    launch_when_longer_than: int | str | None = None  # launched only when L > this
    launch_unless_longer_than: int | str | None = None  # launched only when L <= this
    min_blocks_per_sm: int = 0    # occupancy asked of ptxas (0: none)
    #: the grid counts whole channels, not sequences (see CHANNEL_RULES): a lane-summed
    #: readout is computed where all the lanes of a channel are
    channels: str | None = None
    #: the workspaces this kernel reads zeroed (the look-back's flags): its arguments say
    #: ``reset``, and the launcher clears them before a launch in which this kernel runs, not
    #: before one that runs only kernels that never read them
    zeroes: tuple[str, ...] = ()

    def manifest_args(self, args: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The module's arguments as this kernel's manifest lists them (``reset`` on those it
        reads zeroed)."""
        return [dict(a, reset=True) if a["name"] in self.zeroes and a["role"] == "workspace"
                else a for a in args]

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "block": list(self.block),
                               "sequences_per_block": self.sequences_per_block,
                               "shared_bytes": self.shared_bytes}
        if self.time_chunk is not None:
            out["time_chunk"] = self.time_chunk
        if self.launch_when_longer_than is not None:
            out["launch_when_longer_than"] = self.launch_when_longer_than
        if self.launch_unless_longer_than is not None:
            out["launch_unless_longer_than"] = self.launch_unless_longer_than
        if self.channels is not None:
            out["channels"] = self.channels
        return out


@dataclass
class BuiltModule:
    """The MLIR module of one compile, as text, with what a launcher needs to know."""

    text: str
    kernel_name: str                  # the scan kernel (cuda) or host function (cpu)
    args: list[dict[str, Any]]        # manifest "args", in kernel parameter order
    block: tuple[int, int, int]
    sequences_per_block: int
    shared_bytes: int
    target: str = "cuda"
    kernels: list[KernelSpec] = field(default_factory=list)   # launch in this order
    static_shared_bytes: int = 0
    seconds: float = 0.0


def kernel_args(form: Any, options: Options | None = None, grid: Any = None,
                plan: Any = None) -> list[dict[str, Any]]:
    """The manifest ``args`` of the kernel ABI, in parameter order (workspaces last): the
    outputs are those the plan stores (without a plan, those ``options`` ask for; all of them
    without options), and the states that a readout kernel reads back but nobody asked for
    are workspaces."""
    from explorer.passes.outputs import last_states, stored_outputs
    from explorer.passes.plan import lane_sum_of
    from explorer.passes.plan_options import grid_scheme, resolve_tiles

    if options is not None:
        options = resolve_tiles(options, form.recurrence)   # a tile left open: the plan's
    if plan is not None and grid is None:
        grid = plan.grid
    # the grid level: the plan's, else what the options resolve to
    scheme = (grid.scheme if grid is not None else
              grid_scheme(form, options) if options else "chunked")
    if plan is not None:
        stored, lane_sum, segments = plan.stored, plan.lane_sum, plan.segments
    else:
        segments = bool(options and options.varlen)
        stored = stored_outputs(form.recurrence, options.outputs if options else "all")
        lane_sum = lane_sum_of(form, stored, options.strategy if options else "sequential",
                               scheme)
    lanes = set(form.recurrence.lane_names)
    out: list[dict[str, Any]] = []
    # timed inputs in the compile's dtype, outputs in its output dtype (16-bit ones are
    # extended to float32 where loaded and rounded where stored); the rest stays float32
    in_dtype = options.dtype if options is not None else "float32"
    out_dtype = options.output_dtype if options is not None else "float32"
    for name in form.inputs:
        out.append({"name": name, "role": "input", "timed": True, "lane": name in lanes,
                    "dtype": in_dtype})
    for name in form.params:
        out.append({"name": name, "role": "param", "timed": False, "lane": name in lanes,
                    "dtype": "float32"})
    for state in form.recurrence.states:
        out.append({"name": h0_name(state), "role": "h0", "timed": False,
                    "lane": bool(form.vector), "dtype": "float32"})
    if segments:
        # per time step: the sequence there, and whether it starts or ends there (shared by
        # every channel; see explorer.runtime.contract.segment_marks)
        out.append({"name": SEGMENT_MARKS, "role": "segments", "timed": True, "lane": False,
                    "dtype": "float32"})
    added = set(form.recurrence.lane_readouts) if form.vector else set()
    for name in form.outputs:
        if name in stored and name in added:
            # a lane readout is added into its output (zeroed by the launcher: ``reset``), in
            # float32, so that channels that share its row sum there (``rowmap`` below)
            out.append({"name": name, "role": "output", "timed": True, "lane": True,
                        "dtype": "float32", "reset": True})
        elif name in stored:
            out.append({"name": name, "role": "output", "timed": True,
                        "lane": bool(form.output_is_lane(name)), "dtype": out_dtype})
    # the last states: no time axis, one per sequence (of a packed batch) and channel
    for state in last_states(form.recurrence, tuple(stored)):
        out.append({"name": last_name(state), "role": "output", "timed": False,
                    "lane": bool(form.vector), "dtype": "float32"})
    for name in ("C", "N", "L"):
        out.append({"name": name, "role": "size", "timed": False, "lane": False,
                    "dtype": "int64"})
    if form.vector:
        # an input with the lane axis may come with a row per block of channels (Mamba's B
        # and C, one per batch row): channel c reads its row c // divisor
        for name in form.inputs:
            if name in lanes:
                out.append({"name": name, "role": "rowmap", "timed": False, "lane": False,
                            "dtype": "int64"})
        # a stored lane readout too: channel c adds into its row c // divisor (1 unless the
        # caller sums it over the channels that share a row, as a gradient of an input given
        # with a row per block of channels)
        for name in form.outputs:
            if name in stored and name in added:
                out.append({"name": name, "role": "rowmap", "timed": False, "lane": False,
                            "dtype": "int64"})
        # a parameter may come with a row per channel of the trailing batch axes (Mamba's A,
        # D and delta_bias, (D, ...) beside x of (batch, D, L)): channel c reads its row
        # c % modulus, and the same tensor serves every batch row without a copy
        # (unless the compile asks for a row per channel: ``param_rows="channel"``)
        if options is None or options.param_rows != "channel":
            for name in form.params:
                out.append({"name": name, "role": "rowmod", "timed": False, "lane": False,
                            "dtype": "int64"})
    if lane_sum is not None and not lane_sum.fused:
        # the readout kernel reads the states back: those not stored go through a workspace
        # of (C, N, L) floats (one float per (sequence, chunk of one step))
        for name in form.recurrence.states:
            if name not in stored:
                out.append({"name": name, "role": "workspace", "timed": False, "lane": False,
                            "dtype": "float32", "per_chunk": 1, "time_chunk": 1})
    if options is not None and options.strategy != "sequential":
        alg = Algebra(form.A)
        spaces = [(AGGREGATES, alg.width), (CARRIES, alg.S)]
        if scheme == "lookback":
            spaces.append((TILE_FLAGS, TILE_SLOT_WORDS))
        for name, per in spaces:
            # which kernel needs a workspace zeroed is its own (KernelSpec.zeroes)
            out.append({"name": name, "role": "workspace", "timed": False, "lane": False,
                        "dtype": "float32", "per_chunk": per, "time_chunk": TIME_CHUNK})
        out.append({"name": TIME_CHUNK, "role": "size", "timed": False, "lane": False,
                    "dtype": "int64", "chunk_rule": chunk_rule(options, grid, scheme)})
    return out


def chunk_rule(options: Options, grid: Any = None, scheme: str | None = None
               ) -> dict[str, Any]:
    """The manifest's rule for the per-call ``time_chunk`` (whole tiles; when chunking, never
    fewer than ``chunk_tiles`` tiles a chunk): the plan's ``scan.grid`` when given."""
    if grid is not None:
        rule = {"tile": grid.tile, "min_tiles": grid.min_tiles, "fill": grid.fill,
                "unchunked_from": grid.unchunked_from}
        if grid.scheme == "lookback":
            rule["max_tiles"] = 1
        return rule
    if (scheme or options.grid) == "lookback":
        return {"tile": options.tile, "min_tiles": 1, "fill": CHUNK_FILL,
                "unchunked_from": LOOKBACK_UNCHUNKED_FROM, "max_tiles": 1}
    return {"tile": options.tile, "min_tiles": options.chunk_tiles, "fill": CHUNK_FILL,
            "unchunked_from": UNCHUNKED_FROM}
