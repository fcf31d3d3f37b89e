"""The driver: runs the stages in order and keeps every one of them on the result.

    text ──parse──▶ Recurrence ──decompose──▶ AffineForm ──plan──▶ ScanPlan ──codegen──▶ MLIR
         ──passes (IR after each)──▶ LLVM IR ──▶ PTX            (target="cuda")
         ──passes (IR after each)──▶ LLVM IR for the host         (target="cpu")

`compile` returns a :class:`Compiled`; its ``stages`` is an ordered dict name -> :class:`Stage`
(recurrence, affine, plan, mlir, one entry per pass, llvm, and ptx for CUDA), ``passes`` the pass
records.  The widget reads these records and never recomputes them.

The result's types are in :mod:`explorer.compiled`, the record a compile writes to a file in
:mod:`explorer.compiled_record`, the cache of compiled results in :mod:`explorer.cache`; their
public names are importable from here too.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from typing import Any

from explorer import __version__
from explorer.cache import _MEMORY as _MEMORY
from explorer.cache import (
    _from_disk,
    _from_memory,
    _remember,
    _to_disk,
    cache_dir,
    cache_limit_bytes,
    clear_cache,
    wait_for_cache_writes,
)
from explorer.compiled import _PENDING, Compiled, Stage, _assemble
from explorer.compiled_record import _FORMAT as _FORMAT
from explorer.compiled_record import RECORD_LIMIT, load_compiled
from explorer.frontend.recurrence import Recurrence, check_state_size

__all__ = [
    "PLAN_PICTURE_N", "RECORD_LIMIT", "Compiled", "Stage", "cache_dir", "cache_limit_bytes",
    "clear_cache", "compile", "load_compiled", "wait_for_cache_writes",
]

#: the picture of the plan is drawn for this many positions (the kernel's tile is larger)
PLAN_PICTURE_N = 16


def compile(rec: Recurrence | str, target: str = "cuda", strategy: str = "blelloch",
            cache: bool = True, **options: Any) -> Compiled:
    """Compile a recurrence (or its text) for ``target`` with the scan ``strategy``.

    Options: ``block_size`` (power of two), ``elements_per_thread`` (power of two), ``chip``
    (``sm_80``, ``sm_90``, ...), ``dtype`` ('float32'), ``vector_width`` (elements a thread of a
    tree plan loads and stores at once: ``"auto"``, 16 bytes; ``1`` off).  Raises
    :class:`RecurrenceError` for bad text, :class:`OptionError` for bad options (before any
    compile), :class:`CompileError` when a pass fails.
    """
    from explorer.codegen.options import validate

    opts = validate(strategy, target, **options)
    t0 = time.perf_counter()
    if isinstance(rec, str):
        rec = Recurrence.parse(rec)
    elif not isinstance(rec, Recurrence):
        raise TypeError(f"compile() takes a Recurrence or its text, not {type(rec).__name__}")
    check_state_size(rec, opts.strategy)   # a dimension the strategy cannot compile in seconds
    t_parse = time.perf_counter() - t0
    opt_dict = asdict(opts)
    key = _key(rec.text, opt_dict)
    if cache:
        hit = _from_memory(key) or _from_disk(key, rec)
        if hit is not None:
            return hit
    compiled = _compile(rec, opts, opt_dict, key, t_parse)
    if cache:
        _remember(compiled)
        _to_disk(compiled)
    return compiled


def _key(text: str, options: dict[str, Any]) -> str:
    from explorer.codegen import source_digest, tool_versions

    blob = json.dumps({"text": text, "options": options, "explorer": __version__,
                       "source": source_digest(), "tools": tool_versions()}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _compile(rec: Recurrence, opts: Any, opt_dict: dict[str, Any], key: str,
             t_parse: float) -> Compiled:
    from explorer.codegen.locations import split_locations
    from explorer.codegen.pipeline import lower
    from explorer.codegen.steps import cpu_steps, cuda_steps, scan_steps
    from explorer.dialect.build import build_scan
    from explorer.passes.outputs import outputs_text
    from explorer.passes.state import ScanState

    t0 = time.perf_counter()
    text = build_scan(rec)
    t_build = time.perf_counter() - t0
    state = ScanState(rec, opts)
    upstream = cuda_steps(opts) if opts.target == "cuda" else cpu_steps(opts)
    done: dict[str, Any] = {}

    def meanwhile() -> None:
        """What our passes decided, written and drawn (while the NVPTX backend runs)."""
        plan, built = state.plan, state.built
        done["recurrence"] = (rec.summary(), rec.dependence_dot())
        done["affine"] = state.form.as_text()
        about = (plan.text() if opts.backward else   # the fused backward's plan says itself
                 _plan_text(plan) + "\n" + _outputs_choice(opts.outputs, rec, plan)
                 + outputs_text(plan, rec.states))
        done["plan"] = (about, plan.picture(PLAN_PICTURE_N).to_dot())
        done["picture"] = plan.picture(plan.threads)
        done["mlir"] = split_locations(text)[0]
        done["kernels"] = [dict(k.manifest(), args=k.manifest_args(built.args))
                           for k in built.kernels]

    lowered = lower(text, opts, scan_steps(state) + upstream, meanwhile)
    passes = list(lowered.passes)
    ours = {p.name: p for p in passes[:3]}
    form, plan = state.form, state.plan
    decomposed, planned = ours["scan-decompose"], ours["scan-plan"]
    stages = [Stage("recurrence", done["recurrence"][0], t_parse, done["recurrence"][1]),
              Stage("affine", done["affine"] + "\n\n" + _scan_ops(decomposed.ir),
                    decomposed.seconds),
              Stage("plan", done["plan"][0] + "\n\n" + _scan_ops(planned.ir), planned.seconds,
                    done["plan"][1]),
              Stage("mlir", done["mlir"], t_build, kind="mlir")]
    back = [Stage("llvm", lowered.llvm_ir, lowered.llvm_seconds, kind="llvm")]
    if opts.target == "cuda" and lowered.ptx is not None:
        # PTX is emitted by the gpu-module-to-binary pass: its time is the PTX stage's
        to_binary = [p.seconds for p in passes if p.name.startswith("gpu-module-to-binary")]
        back.append(Stage("ptx", lowered.ptx, sum(to_binary), kind="ptx"))
    assembled = _assemble(stages, passes, back)
    return Compiled(rec, form, done["picture"], opts.strategy, opts.target, opt_dict,
                    assembled, passes, done["kernels"], lowered.final_module, lowered.ptx,
                    lowered.llvm_ir,
                    _PENDING, key, scan_plan=plan)


def _scan_ops(ir: str) -> str:
    """The ``scan`` ops of a module's text (what our passes wrote), one a line."""
    return "\n".join(line.strip() for line in ir.splitlines() if '"scan.' in line)


def _plan_text(plan: Any) -> str:
    B, E = plan.threads, plan.elements
    if plan.tree == "none":
        return (f"each warp stages 32 sequences x {plan.tile_steps} time steps through shared "
                "memory, coalesced along time; one thread per sequence walks its row with the "
                f"state in registers ({B} threads, {B} sequences a block)")
    tree = {"blelloch": "Blelloch (up-sweep, then down-sweep: exclusive prefixes)",
            "kogge_stone": "Kogge-Stone (log2 B levels: inclusive prefixes)",
            "warp_shuffle": "warp-shuffle (Kogge-Stone among a warp's lanes by shuffles, "
                            "then the warps joined in order)"}[plan.tree]
    prefix = {"blelloch": "its exclusive prefix from the down-sweep",
              "kogge_stone": "the inclusive prefix of thread i - 1",
              "warp_shuffle": "lane i - 1's inclusive prefix, shuffled, after the warps "
                              "before"}[plan.tree]
    shuffled = sum(sw.via == "shuffle" for sw in plan.sweeps)
    where = ("in registers and, across warps, shared memory: "
             f"{len(plan.sweeps)} sweeps, one barrier" if plan.tree == "warp_shuffle" else
             f"in {len(plan.sweeps)} sweeps: the {shuffled} inside a warp by shuffles in "
             f"registers (no barrier), the {len(plan.sweeps) - shuffled} across warps in shared "
             "memory, a barrier after each" if shuffled else
             f"in shared memory, {len(plan.sweeps)} sweeps, a barrier after each")
    return (
        f"each block scans one chunk of a sequence in tiles of {B * E} steps ({B} threads x "
        f"{E} elements):\n"
        f"  1. scan.thread: each thread composes its {E} consecutive elements sequentially in "
        f"registers ({E - 1} combines)\n"
        + _wide_text(plan) +
        f"  2. scan.block: the {tree} tree over the {B} thread aggregates {where}\n"
        f"  3. each thread applies the prefix of the threads before it ({prefix}) to its {E} "
        "elements\n"
        + _grid_text(plan))


def _outputs_choice(outputs: str | tuple[str, ...], rec: Recurrence, plan: Any) -> str:
    """The ``outputs`` option as the plan took it (a line of the plan stage's text)."""
    chosen = repr(outputs) if isinstance(outputs, str) else repr(list(outputs))
    line = (f"  outputs={chosen}" + (" (the default)" if outputs == "readouts" else "")
            + f": scan.store {{outputs = [{', '.join(plan.stored)}]}}")
    skipped = [r for r in rec.readouts if r not in plan.stored]
    if skipped:
        line += (f"; the readouts {', '.join(skipped)} are not computed (outputs='readouts' "
                 "or 'all' computes them)")
    return line + "\n"


def _wide_text(plan: Any) -> str:
    """How the tile moves between memory and the threads (``scan.thread``'s vector_width and
    layout)."""
    V = plan.vector_width
    if plan.layout == "direct":
        where = ("     layout direct: each thread loads its own consecutive elements into "
                 "registers and stores its outputs from them, no stage (tile_layout='staged' "
                 "goes through shared memory, a warp's accesses coalesced)\n")
    else:
        where = ("     layout staged: the tile goes through the block's shared-memory stage, "
                 "a warp's accesses coalesced\n")
    if V <= 1:
        return where + "     the tile is loaded and stored one element an access (vector_width=1)\n"
    return where + (f"     the tile is loaded and its outputs stored {V} consecutive elements "
                    "a thread at once (one vector access), where the rows and the tile start "
                    f"are aligned to {V} elements and the tile is whole; element by element "
                    "otherwise (vector_width=1 switches it off)\n")


def short_text(plan: Any) -> str:
    """What the plan's short kernel takes (empty without one)."""
    s = plan.short
    if s is None:
        return ""
    return (f"sequences of at most {s.longest} steps run whole in a kernel of their own, a "
            f"block of {s.threads} threads x {s.elements} elements each, its tiles "
            f"{s.layout} (scan.short; short_tile='none' leaves them to the plain kernel)")


def _packed_text(layout: str) -> str:
    """What a packed look-back tile is (empty for the others)."""
    if layout != "packed":
        return ""
    return (" (its stage holds the inputs as they are in memory, 16 bits a value for 16-bit "
            "inputs, and each thread reads its own elements back in 16-byte vectors; float32 "
            "tiles reach it by asynchronous copies, cp.async, on sm_80 on; "
            "lookback_layout='staged' stages float32 scalars through registers)")


def _grid_text(plan: Any) -> str:
    g = plan.grid
    short = f"{short_text(plan)}; longer ones " if plan.short is not None else ""
    whole = (f"  4. scan.grid ({g.scheme}): {short}a whole sequence per block when there are "
             f"at least {g.unchunked_from} x the GPU's block slots of sequences, else ")
    if plan.lookback is not None:
        look = plan.lookback
        window = look.lanes * look.tiles_per_lane
        return (whole + f"one tile of {look.threads} threads x {look.elements} elements per "
                f"block, its tiles {look.layout}{_packed_text(look.layout)}, in one pass: the "
                "block publishes its tile's "
                "aggregate, warp 0 looks back over the tiles before it (scan.lookback: "
                f"{window} tiles a round trip, waiting on tiles not yet published) for the "
                "state before its tile, publishes the state after it, and the block applies "
                "it as the carry; the choice is made per call")
    return (whole + f"chunks of at least {g.min_tiles} tiles giving {g.fill} x the slots in "
            "blocks: reduce (one aggregate per chunk) -> carry (one block per sequence scans "
            "the aggregates) -> scan each chunk from its carry; the chunk length is chosen per "
            "call")

