"""Compile options of the code generator, checked before anything is built.

``validate(strategy, target, **options)`` returns a frozen :class:`Options` or raises
:class:`explorer.errors.OptionError` naming the bad value and what is accepted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from explorer.errors import OptionError

STRATEGIES = ("sequential", "blelloch", "kogge_stone", "warp_shuffle")
TARGETS = ("cuda", "cpu")
#: the dtype of the timed inputs in memory (``dtype=``): the kernels load a 16-bit input and
#: extend it to float32 (``arith.extf``), compute and accumulate in float32, and store the outputs
#: in ``out_dtype``; parameters, initial states and workspaces stay float32
DTYPES = ("float32", "bfloat16", "float16")
#: bytes of an element of each dtype in memory
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: the dtype of the stored outputs (``out_dtype=``): ``None`` (the default) stores them in the
#: input dtype; ``"float32"`` keeps the float32 results of 16-bit inputs unrounded
OUT_DTYPES = ("float32", "bfloat16", "float16")
#: how a tree plan spreads one sequence over blocks when there are too few sequences to fill
#: the GPU: ``lookback`` (one pass: each block scans one tile and takes the prefix of the tiles
#: before it from their published aggregates, 12 bytes an fp32 affine element) or ``chunked``
#: (reduce the chunks, carry across them, rescan: the inputs read twice, 20 bytes an element)
GRIDS = ("auto", "chunked", "lookback")
#: which outputs a compile stores (``outputs=``; a list of output names is accepted too):
#: ``readouts`` the readouts, or the states of a recurrence that has none (the default: a state
#: that nobody asked for is never written); ``states`` the states alone (no readout is
#: computed); ``all`` the states and the readouts
OUTPUTS = ("readouts", "states", "all")
#: the floating-point freedoms of the kernels' arithmetic (``fast_math=``, pass
#: ``scan-fastmath``): ``contract`` fuses a multiply and an add into one FMA (nvcc's default),
#: ``fast`` also approximates exp, log and division (nvcc's ``--use_fast_math``), ``none`` rounds
#: every operation on its own
FAST_MATH = ("contract", "fast", "none")
#: how a tree plan's tile meets its threads on the GPU (``tile_layout=``, the plan's
#: ``scan.thread {layout}``): ``staged`` through the block's shared-memory stage, V consecutive
#: elements a thread at once so that a warp's accesses are coalesced; ``direct`` each thread
#: loads and stores its own E consecutive positions from registers (no stage, no barrier for
#: it); ``auto`` the plan's choice (:func:`explorer.passes.plan.tile_layout`)
TILE_LAYOUTS = ("auto", "staged", "direct")
#: how the look-back kernel meets its tile (``lookback_layout=``, the plan's ``scan.lookback
#: {layout}``): ``staged`` and ``direct`` as above; ``packed`` staged with the stage holding the
#: values as they are in memory (16 bits a value for 16-bit inputs) and each thread reading its
#: own consecutive elements back as 16-byte vectors; ``auto`` the plan's choice
#: (:func:`explorer.passes.plan_options.lookback_layout`)
LOOKBACK_LAYOUTS = ("auto", "staged", "direct", "packed")
#: how a vector recurrence's kernels read a parameter given for the trailing batch axes alone
#: (Mamba's ``A (D, N)`` beside ``x (batch, D, L)``; ``param_rows=``): ``modulus`` where it is
#: (a row modulus argument each: channel c reads row ``c % rows``), ``channel`` a row per
#: channel (the runtime lays such a parameter out per channel first: a small copy a call,
#: no remainder in the kernel), ``auto`` ``modulus`` (``Backward.compile`` gives the GPU
#: Blelloch adjoint ``channel``: there the remainder doubled ptxas' spills, sm_90: 116 -> 252
#: bytes of spill stores; the kernel took 2.12 ms at 8 x 1536 x 16 x 2^11 on an H100 before
#: it, 3.52 ms after)
PARAM_ROWS = ("auto", "modulus", "channel")
#: where a Blelloch tree runs its levels inside a warp (``warp_sweeps=``, the plan's
#: ``scan.sweep {via}``): ``shuffle`` in registers, the partners' values traded by
#: ``gpu.shuffle`` with no barrier; ``shared`` through shared memory with a barrier after each
#: level; ``auto`` ``shuffle`` on the GPU (:func:`explorer.passes.plan_options.shuffled_sweeps`)
WARP_SWEEPS = ("auto", "shuffle", "shared")
#: a kernel of its own for short sequences (``short_tile=``, the plan's ``scan.short``):
#: ``"<threads>x<elements>"`` (powers of two, a warp to 1024 threads, at most 16 elements),
#: ``none`` for the plain kernel alone, ``auto`` 32 x 16 where the plan takes the open scalar
#: tile (:func:`explorer.passes.plan_options.short_tile`), else none
SHORT_TILES = ("auto", "none")


def layout_choice(target: str, strategy: str) -> bool:
    """Whether a compile for ``target`` with ``strategy`` may choose its tile layout: the
    direct layout is a GPU tree plan's (the CPU kernels and the sequential plan stage)."""
    return target == "cuda" and strategy != "sequential"

# NVIDIA chips the NVPTX backend and ptxas 12/13 know, with the lowest PTX ISA version that
# supports each: the PTX we write declares that version, so older drivers can still load it.
CHIP_PTX = {
    "sm_70": 60, "sm_72": 61, "sm_75": 63,
    "sm_80": 70, "sm_86": 71, "sm_87": 74, "sm_89": 78,
    "sm_90": 78, "sm_90a": 80,
    "sm_100": 86, "sm_100a": 86, "sm_101": 86, "sm_101a": 86, "sm_103": 88, "sm_103a": 88,
    "sm_120": 87, "sm_120a": 87, "sm_121": 88, "sm_121a": 88,
}

#: the lowest PTX ISA version with ``nanosleep``, which the look-back walk backs off with (LLVM's
#: NVPTX backend cannot select it for the older versions that sm_70 and sm_72 declare)
LOOKBACK_MIN_PTX = 63


def lookback_supported(chip: str) -> bool:
    """Whether the PTX written for ``chip`` can hold the look-back kernel."""
    return CHIP_PTX[chip] >= LOOKBACK_MIN_PTX


#: the first chip with asynchronous copies from global to shared memory (``cp.async``)
ASYNC_COPY_MIN_SM = 80


def async_copies(chip: str) -> bool:
    """Whether ``chip`` has ``cp.async`` (sm_80 and later)."""
    return int(chip[3:].rstrip("a")) >= ASYNC_COPY_MIN_SM


#: the most elements a thread of the look-back kernel composes (``lookback_elements``) and the
#: most tiles each lane of its walk examines (``lookback_tiles``), powers of two: what the
#: lowering implements (a recorded plan is checked against them too)
LOOKBACK_ELEMENTS_MAX = 32
LOOKBACK_TILES_MAX = 16

#: the widest tile access (``vector_width``) in elements: 8 float32 workspace elements are 32
#: bytes, two 16-byte accesses on NVIDIA GPUs
VECTOR_MAX = 8

# Static shared memory a kernel may declare without opting in to more (CUDA's 48 KiB).
STATIC_SHARED_LIMIT = 48 * 1024
# Dynamic shared memory a block may use after opting in (sm_80 and later: 227 KiB on sm_90).
SHARED_LIMIT = 227 * 1024


#: the plain kernel's tile (threads, elements a thread) where the plan does not choose another
#: (:func:`explorer.passes.plan_options.resolve_tiles`), and the count left open beside a
#: given one
GENERAL_TILE = (128, 8)


@dataclass(frozen=True)
class Options:
    """Everything that shapes the generated code; part of the artifact's manifest."""

    strategy: str = "blelloch"
    target: str = "cuda"
    #: threads of a block, and elements each composes (the plain kernel's tile). ``"auto"``
    #: (both left open): the plan's choice for the recurrence
    #: (:func:`explorer.passes.plan_options.resolve_tiles`); one given, the other is that of
    #: :data:`GENERAL_TILE` (128 by 8)
    block_size: int | str = "auto"
    elements_per_thread: int | str = "auto"
    chunk_tiles: int = 8
    chip: str = "sm_90"
    dtype: str = "float32"
    opt_level: int = 3
    #: scan backwards in time: h[t] = A_t h[t+1] + b_t, the initial state after the last step
    reverse: bool = False
    #: the grid level of a tree plan (one of GRIDS). "auto": the plan takes the look-back scan
    #: where its packed protocol applies (a scalar first-order state), the chunked scan
    #: otherwise. Measured on an H100 (scanweaver bench, fp32 affine scan, 16 elements a thread
    #: in the look-back kernel), the look-back grid reaches 0.73 to 0.77 of a copy for few long
    #: sequences, against 0.55 to 0.57 for the chunked grid, and runs many sequences in the same
    #: plain kernel as the chunked grid
    grid: str = "auto"
    #: tiles each lane of the look-back warp examines per round trip (the window is 32 times
    #: this): the walk keeps up with the tiles arriving only if a window spans the tiles that
    #: finish during one round trip to L2
    lookback_tiles: int = 1
    #: elements a thread of the look-back kernel composes (its tile: block_size times this),
    #: apart from the plain kernel's ``elements_per_thread``: the look-back block holds one
    #: tile and waits on the tiles before it, so a longer tile keeps more bytes in flight per
    #: wait. ``"auto"``: twice ``elements_per_thread`` (at most 16) for a scalar first-order
    #: state (measured on an H100 at 1 x 2^26: 16 a thread 0.77 of a copy, 8 a thread 0.64)
    #: whose tile moves at most three arrays
    #: (:data:`explorer.passes.plan_options.LOOKBACK_WIDE_STREAMS`), ``elements_per_thread``
    #: otherwise (their elements take more registers)
    lookback_elements: int | str = "auto"
    #: threads of a look-back block, apart from the plain kernel's ``block_size`` (the look-back
    #: kernel's tile is this times ``lookback_elements``). ``"auto"``: on the GPU, at least
    #: :data:`explorer.passes.plan_options.LOOKBACK_THREADS` where a thread of the look-back kernel
    #: composes 16 elements (a scalar first-order state's default), ``block_size`` otherwise: on an
    #: H200 the look-back kernel of 256 threads by 16 elements (one walk of the tiles before it per
    #: 4096 steps) reached 0.79 of a copy at 1 x 2^26 in float32 against 0.76 for 128 by 16, 0.57
    #: against 0.53 in bfloat16, where 128 threads kept the plain kernel's tile fit for 1024-step
    #: sequences (README, *Speed*)
    lookback_threads: int | str = "auto"
    #: the outputs the kernels write: one of OUTPUTS, or a tuple of output names (resolved
    #: against the recurrence by the plan, :func:`explorer.passes.outputs.stored_outputs`)
    outputs: str | tuple[str, ...] = "readouts"
    #: the dtype of the stored outputs: None for ``dtype`` itself, or one of OUT_DTYPES
    #: (``"float32"`` with 16-bit inputs: the float32 results, not rounded to 16 bits)
    out_dtype: str | None = None
    #: elements a thread of a tree plan loads (and stores) at once from a tile, one vector
    #: access of up to 16 bytes (``vector<4xf32>``, ``vector<8xbf16>``), where the row and the
    #: tile start are aligned to it and the tile lies whole in the range (a check per tile, the
    #: scalar loads otherwise): ``"auto"`` 16 bytes of the input dtype (4 float32 elements, 8
    #: of 16 bits, at most ``elements_per_thread``), ``1`` off (one element a load)
    vector_width: int | str = "auto"
    #: one of FAST_MATH (see :mod:`explorer.passes.fastmath`)
    fast_math: str = "contract"
    #: one of TILE_LAYOUTS
    tile_layout: str = "auto"
    #: one of LOOKBACK_LAYOUTS
    lookback_layout: str = "auto"
    #: timed inputs read in place at another time (the plan's ``scan.read``): ``(name, k)``
    #: pairs, sorted; the array passed as ``name`` is read at time ``t + k`` for step t, zero
    #: where ``t + k`` is outside the sequence. ``Backward.compile`` reads the forward's
    #: arrays this way (``a_next`` is ``a`` at ``t + 1``) instead of shifted copies of them
    read_offsets: tuple[tuple[str, int], ...] = ()
    #: one of PARAM_ROWS
    param_rows: str = "auto"
    #: the recurrence's fused backward kernel instead of its forward
    #: (:mod:`explorer.passes.backward`): True, or "readouts" (a loss of the readouts alone:
    #: the states' cotangents not read)
    backward: bool | str = False
    #: one of WARP_SWEEPS
    warp_sweeps: str = "auto"
    #: one of SHORT_TILES, or "<threads>x<elements>" (see SHORT_TILES)
    short_tile: str = "auto"

    @property
    def vector_elements(self) -> int:
        """``vector_width`` resolved: the elements of one wide access (1: scalar accesses)."""
        if self.vector_width == "auto":   # an open tile has at least VECTOR_MAX elements
            E = VECTOR_MAX if self.elements_per_thread == "auto" else self.elements_per_thread
            return min(16 // (4 if self.dtype == "float32" else 2), int(E))
        return int(self.vector_width)

    @property
    def output_dtype(self) -> str:
        """The dtype the kernels store their outputs in."""
        return self.out_dtype or self.dtype
    #: packed variable-length batches: the kernels take the ``segment_marks`` argument (built
    #: by the runtime from a call's ``cu_seqlens=``) and restart the state at each sequence
    #: start (the plan's ``scan.segments``); a call without ``cu_seqlens`` is one sequence
    varlen: bool = False

    @property
    def tile(self) -> int:
        """Elements of one sequence handled by one block per tile (Blelloch)."""
        return int(self.block_size) * int(self.elements_per_thread)

    @property
    def time_chunk(self) -> int:
        """Time steps of one chunk of the chunked Blelloch scan (one block each)."""
        return self.tile * self.chunk_tiles

    @property
    def ptx_features(self) -> str:
        """The ``+ptxNN`` feature string for the NVPTX backend."""
        return f"+ptx{CHIP_PTX[self.chip]}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _power_of_two(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{name} must be an integer power of two in [{low}, {high}], "
                          f"got {value!r}")
    if value < low or value > high or value & (value - 1):
        raise OptionError(f"{name} must be a power of two in [{low}, {high}], got {value}")
    return value


def validate(strategy: str = "blelloch", target: str = "cuda", **options: Any) -> Options:
    """Check every option and return them as :class:`Options` (defaults filled in)."""
    if strategy not in STRATEGIES:
        raise OptionError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if target not in TARGETS:
        raise OptionError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    known = {"block_size", "elements_per_thread", "chunk_tiles", "chip", "dtype", "opt_level",
             "reverse", "grid", "lookback_tiles", "lookback_elements", "lookback_threads",
             "outputs", "out_dtype",
             "varlen", "vector_width", "fast_math", "tile_layout", "lookback_layout",
             "read_offsets",
             "param_rows", "warp_sweeps", "short_tile", "backward"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise OptionError(f"unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    defaults = Options()
    for name, low, high in (("block_size", 32, 1024), ("elements_per_thread", 1, 16)):
        given = options.get(name)
        if isinstance(given, str) and given != "auto":
            raise OptionError(f"{name} must be 'auto' or an integer power of two in "
                              f"[{low}, {high}], got {given!r:.40}")
    block_size = options.get("block_size", defaults.block_size)
    if block_size != "auto":
        block_size = _power_of_two(block_size, "block_size", 32, 1024)
    ept = options.get("elements_per_thread", defaults.elements_per_thread)
    if ept != "auto":
        ept = _power_of_two(ept, "elements_per_thread", 1, 16)
    if (block_size == "auto") != (ept == "auto"):   # one given: the other the general tile's
        block_size, ept = (GENERAL_TILE[0] if block_size == "auto" else block_size,
                           GENERAL_TILE[1] if ept == "auto" else ept)
    chunk_tiles = _power_of_two(options.get("chunk_tiles", defaults.chunk_tiles), "chunk_tiles",
                                1, 1024)
    chip = options.get("chip", defaults.chip)
    if not isinstance(chip, str) or chip not in CHIP_PTX:
        raise OptionError(f"unknown chip {chip!r}; choose one of {', '.join(CHIP_PTX)}")
    dtype = options.get("dtype", defaults.dtype)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise OptionError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    out_dtype = options.get("out_dtype", defaults.out_dtype)
    if out_dtype is not None and (not isinstance(out_dtype, str) or out_dtype not in OUT_DTYPES):
        raise OptionError(f"unsupported out_dtype {out_dtype!r}; choose None (the input dtype) "
                          f"or one of {', '.join(OUT_DTYPES)}")
    if out_dtype not in (None, "float32", dtype):
        raise OptionError(f"out_dtype {out_dtype!r} with dtype {dtype!r}: the outputs are "
                          f"stored in the input dtype or in float32")
    if out_dtype == dtype:
        out_dtype = None   # one spelling a choice: the cache key sees the same options
    opt_level = options.get("opt_level", defaults.opt_level)
    if isinstance(opt_level, bool) or opt_level not in (0, 1, 2, 3):
        raise OptionError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
    reverse = options.get("reverse", defaults.reverse)
    if not isinstance(reverse, bool):
        raise OptionError(f"reverse must be True or False, got {reverse!r}")
    grid = options.get("grid", defaults.grid)
    if grid not in GRIDS:
        raise OptionError(f"unknown grid {grid!r}; choose one of {', '.join(GRIDS)}")
    if grid == "lookback" and not lookback_supported(chip):
        raise OptionError(f"grid 'lookback' needs PTX ISA {LOOKBACK_MIN_PTX / 10:.1f} "
                          f"(nanosleep); the PTX for {chip} declares "
                          f"{CHIP_PTX[chip] / 10:.1f}: choose grid 'chunked' or a later chip")
    lookback_tiles = _power_of_two(options.get("lookback_tiles", defaults.lookback_tiles),
                                   "lookback_tiles", 1, LOOKBACK_TILES_MAX)
    lookback_elements = options.get("lookback_elements", defaults.lookback_elements)
    if lookback_elements != "auto":
        lookback_elements = _power_of_two(lookback_elements, "lookback_elements (or 'auto')",
                                          1, LOOKBACK_ELEMENTS_MAX)
    lookback_threads = options.get("lookback_threads", defaults.lookback_threads)
    if lookback_threads != "auto":
        lookback_threads = _power_of_two(lookback_threads, "lookback_threads (or 'auto')",
                                         32, 1024)
    outputs = _outputs(options.get("outputs", defaults.outputs))
    varlen = options.get("varlen", defaults.varlen)
    if not isinstance(varlen, bool):
        raise OptionError(f"varlen must be True or False, got {varlen!r}")
    vector_width = options.get("vector_width", defaults.vector_width)
    if vector_width != "auto":
        vector_width = _power_of_two(vector_width, "vector_width (or 'auto')", 1, VECTOR_MAX)
        if ept != "auto" and vector_width > int(ept):   # "auto" is at least VECTOR_MAX
            raise OptionError(f"vector_width {vector_width} is more than elements_per_thread "
                              f"{ept}: a thread loads its tile's elements in whole vectors")
    if (lookback_elements != "auto" and vector_width != "auto"
            and int(lookback_elements) < int(vector_width)):
        raise OptionError(f"lookback_elements {lookback_elements} is less than vector_width "
                          f"{vector_width}: a thread loads its tile's elements in whole vectors")
    fast_math = options.get("fast_math", defaults.fast_math)
    if fast_math not in FAST_MATH:
        raise OptionError(f"unknown fast_math {fast_math!r}; choose one of "
                          f"{', '.join(FAST_MATH)}")
    tile_layout = options.get("tile_layout", defaults.tile_layout)
    if tile_layout not in TILE_LAYOUTS:
        raise OptionError(f"unknown tile_layout {tile_layout!r}; choose one of "
                          f"{', '.join(TILE_LAYOUTS)}")
    if tile_layout == "direct" and not layout_choice(target, strategy):
        raise OptionError("tile_layout 'direct' is a layout of a tree plan's threads on the "
                          "GPU (target 'cuda', strategy blelloch, kogge_stone or "
                          "warp_shuffle); the CPU kernels and the sequential plan stage "
                          "their tiles")
    lookback_layout = options.get("lookback_layout", defaults.lookback_layout)
    if lookback_layout not in LOOKBACK_LAYOUTS:
        raise OptionError(f"unknown lookback_layout {lookback_layout!r:.40}; choose one of "
                          f"{', '.join(LOOKBACK_LAYOUTS)}")
    if lookback_layout != "auto" and strategy == "sequential":
        raise OptionError(f"lookback_layout {lookback_layout!r} is a layout of a tree plan's "
                          "look-back kernel; the sequential plan has none")
    if lookback_layout == "direct" and target != "cuda":
        raise OptionError("lookback_layout 'direct' is a layout of the GPU's threads; the CPU "
                          "kernels stage their tiles (staged or packed)")
    if lookback_layout == "packed" and vector_width != "auto":
        raise OptionError("lookback_layout 'packed' moves its tile in 16-byte vectors: "
                          "leave vector_width 'auto'")
    param_rows = options.get("param_rows", defaults.param_rows)
    if param_rows not in PARAM_ROWS:
        raise OptionError(f"unknown param_rows {param_rows!r:.40}; choose one of "
                          f"{', '.join(PARAM_ROWS)}")
    warp_sweeps = options.get("warp_sweeps", defaults.warp_sweeps)
    if warp_sweeps not in WARP_SWEEPS:
        raise OptionError(f"unknown warp_sweeps {warp_sweeps!r:.40}; choose one of "
                          f"{', '.join(WARP_SWEEPS)}")
    if warp_sweeps == "shuffle" and strategy != "blelloch":
        raise OptionError(f"warp_sweeps 'shuffle' moves a Blelloch tree's levels inside a "
                          f"warp to shuffles; strategy {strategy!r} has no such levels "
                          f"(warp_shuffle shuffles by itself)")
    short_tile = _short_tile(options.get("short_tile", defaults.short_tile), strategy)
    backward = _backward(options, target, dtype, reverse, varlen)
    return Options(strategy=strategy, target=target, block_size=block_size,
                   elements_per_thread=ept, chunk_tiles=chunk_tiles, chip=chip, dtype=dtype,
                   opt_level=opt_level, reverse=reverse, grid=grid,
                   lookback_tiles=lookback_tiles, lookback_elements=lookback_elements,
                   lookback_threads=lookback_threads, outputs=outputs, out_dtype=out_dtype,
                   varlen=varlen, vector_width=vector_width, fast_math=fast_math,
                   tile_layout=tile_layout, lookback_layout=lookback_layout,
                   read_offsets=_read_offsets(options.get("read_offsets", ())),
                   param_rows=param_rows, warp_sweeps=warp_sweeps, short_tile=short_tile,
                   backward=backward)


def _backward(options: dict[str, Any], target: str, dtype: str, reverse: bool,
              varlen: bool) -> bool | str:
    """``backward`` checked: a float32 GPU compile of a forward scan."""
    value = options.get("backward", False)
    if not isinstance(value, bool) and value != "readouts":
        raise OptionError(f"backward must be True, False or 'readouts', got {value!r:.40}")
    if value and (target != "cuda" or dtype != "float32" or reverse or varlen
                  or options.get("read_offsets")):
        raise OptionError("backward=True compiles the fused backward of a forward scan for the "
                          "GPU in float32: target='cuda', no reverse, varlen or read_offsets "
                          "(on the CPU, ex.grad(rec).compile(target='cpu') is the backward)")
    return value


def _short_tile(value: Any, strategy: str) -> str:
    """``short_tile`` checked: auto, none, or threads x elements of a tree plan."""
    if value in SHORT_TILES:
        return str(value)
    parts = value.split("x") if isinstance(value, str) else []
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 4 for p in parts):
        raise OptionError(f"short_tile {value!r:.40} is not 'auto', 'none' or threads x "
                          "elements ('32x16': powers of two, 32 to 1024 threads, at most 16 "
                          "elements)")
    # the block's bounds, as block_size's and elements_per_thread's
    threads = _power_of_two(int(parts[0]), "short_tile's threads", 32, 1024)
    elements = _power_of_two(int(parts[1]), "short_tile's elements", 1, 16)
    if strategy == "sequential":
        raise OptionError("short_tile gives a tree plan's short kernel; strategy 'sequential' "
                          "has none")
    return f"{threads}x{elements}"


#: the farthest in time an input may be read in place (``read_offsets``), either way
READ_OFFSET_MAX = 8


def _read_offsets(value: object) -> tuple[tuple[str, int], ...]:
    """``read_offsets``: a mapping (or pairs) of input names to nonzero integer offsets in
    time of at most READ_OFFSET_MAX steps either way, as sorted pairs. Which names are timed
    inputs of the recurrence is checked by the plan, which knows them."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list | tuple) or len(pairs) > 64:
        raise OptionError(f"read_offsets must map input names to time offsets, got "
                          f"{value!r:.60}")
    out: dict[str, int] = {}
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise OptionError(f"read_offsets must map input names to time offsets, got "
                              f"{value!r:.60}")
        name, k = pair
        if not isinstance(name, str) or not name.isidentifier() or name in out:
            raise OptionError(f"read_offsets names each input once, by name: {name!r:.40}")
        if isinstance(k, bool) or not isinstance(k, int) or k == 0 or \
                abs(k) > READ_OFFSET_MAX:
            raise OptionError(f"the time offset of {name} must be a nonzero integer of at "
                              f"most {READ_OFFSET_MAX} steps either way, got {k!r:.40}")
        out[name] = k
    return tuple(sorted(out.items()))


def _outputs(value: object) -> str | tuple[str, ...]:
    """``outputs``: a keyword of OUTPUTS, or a non-empty list of distinct names (which
    outputs of the recurrence they are is checked by the plan, which knows them)."""
    if isinstance(value, str):
        if value in OUTPUTS:
            return value
        if value.isidentifier():
            return (value,)
    elif isinstance(value, list | tuple) and value and all(
            isinstance(v, str) and v.isidentifier() for v in value):
        if len(set(value)) != len(value):
            raise OptionError(f"outputs names an output twice: {list(value)}")
        return tuple(value)
    raise OptionError(f"outputs must be one of {', '.join(OUTPUTS)} or a list of output "
                      f"names, got {value!r:.60}")


def tile_of(options: Options, plan: Any, role: str) -> tuple[Options, str]:
    """The options a kernel of ``role`` is emitted with, and the role whose layout it has: the
    short kernel is the plain scan kernel with the plan's short tile; the look-back kernel
    meets its tile as ``scan.lookback {layout}`` says."""
    if role == "lookback" and plan.lookback is not None:
        return replace(options, tile_layout=plan.lookback.layout), role
    if role != "short":
        return options, role
    return (replace(options, block_size=plan.short.threads,
                    elements_per_thread=plan.short.elements, tile_layout=plan.short.layout),
            "scan")


def options_for(options: Options, plan: Any) -> Options:
    """The options the emitters follow, with every decision of the plan taken from the plan."""
    reverse, look = plan.grid.direction == "reverse", plan.lookback
    if plan.tree == "none":
        return replace(options, strategy="sequential", block_size=plan.threads, reverse=reverse,
                       outputs=plan.stored, varlen=plan.segments, read_offsets=plan.reads)
    return replace(options, strategy=plan.tree, block_size=plan.threads, outputs=plan.stored,
                   varlen=plan.segments, read_offsets=plan.reads,
                   elements_per_thread=plan.elements, chunk_tiles=plan.grid.min_tiles,
                   reverse=reverse, grid=plan.grid.scheme, vector_width=plan.vector_width,
                   tile_layout=plan.layout,
                   lookback_tiles=look.tiles_per_lane if look else options.lookback_tiles,
                   lookback_elements=look.elements if look else options.lookback_elements,
                   lookback_threads=look.threads if look else options.lookback_threads)
