"""Passes ``scan-plan`` and ``scan-lower`` of a fused backward compile (``backward=True``).

``scan-plan`` writes the backward's plan after ``scan.affine``: ``scan.thread`` and
``scan.block`` (the tile: each thread its own consecutive steps, the warps' trees by shuffles),
``scan.recompute`` (the forward's states recomputed tile by tile from the saved ones),
``scan.adjoint`` (the adjoint scanned backwards, a suffix tree: ``gpu.shuffle down``) and one
``scan.gradient`` per gradient (its term and where it is reduced). ``scan-lower`` reads them
back, checks them against the terms it derives from the recurrence (a plan edited to other
terms is refused: the kernel computes what the plan says or nothing) and emits the kernel
(:mod:`explorer.codegen.lower_fused`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explorer.dialect import scan
from explorer.errors import CompileError, OptionError
from explorer.passes.fused_adjoint import BACKWARD_TILE, FusedAdjoint, derived
from explorer.passes.plan import Sweep, implemented_sweeps
from explorer.passes.state import ScanState

#: the vector width of the kernel's loads and stores (16 bytes of float32)
VECTOR = 4

#: the threads of a block the kernel takes: whole warps, at most 32 of them
MAX_THREADS = 1024


@dataclass(frozen=True)
class BackwardPlan:
    """What the backward's plan says (read from its ops)."""

    threads: int
    elements: int
    adjoint: FusedAdjoint

    #: its tile's tree (each warp's by shuffles, the warps joined through shared memory)
    tree = "warp_shuffle"

    @property
    def tile(self) -> int:
        return self.threads * self.elements

    @property
    def sweeps(self) -> tuple[Any, ...]:
        """The forward's tree over the tile's thread aggregates (the adjoint's is its mirror):
        the levels of :func:`explorer.passes.plan.sweeps_of`, as a warp-shuffle plan's."""
        from explorer.passes.plan import sweeps_of

        return sweeps_of(self.tree, self.threads)

    def picture(self, n: int) -> Any:
        """The forward's tree over ``n`` thread aggregates, as the widget draws a plan's."""
        from explorer.passes.plans import make_plan

        return make_plan("warp_shuffle", n)

    def text(self) -> str:
        return (f"the fused backward: one block a channel, {self.threads} threads x "
                f"{self.elements} steps (tiles of {self.tile} steps, the last first); "
                "per tile and lane the forward's states are recomputed from the saved state "
                "before the tile, then the adjoint is scanned back (a suffix scan: shuffles "
                "down), and every gradient reduced in the kernel. It reads the saved states "
                f"at the tiles' last steps alone, one step in {self.tile} (an argument of "
                f"L // {self.tile} steps): the torch operator's forward saves those "
                "(op.checkpoints)\n\n"
                + self.adjoint.text())


def tile_of(options: Any) -> tuple[int, int]:
    """The backward's tile: ``block_size`` x ``elements_per_thread`` where given, else
    :data:`BACKWARD_TILE`."""
    bs, e = options.block_size, options.elements_per_thread
    threads = BACKWARD_TILE[0] if bs == "auto" else int(bs)
    elements = BACKWARD_TILE[1] if e == "auto" else int(e)
    check_tile(threads, elements)
    return threads, elements


def check_tile(threads: int, elements: int) -> None:
    if threads % 32 or not 32 <= threads <= MAX_THREADS:
        raise OptionError(f"the fused backward takes whole warps a block (32 to {MAX_THREADS} "
                          f"threads, a multiple of 32), not {threads}")
    if elements % 4 or not 4 <= elements <= 32:
        raise OptionError(f"the fused backward takes 4 to 32 steps a thread, a multiple of 4 "
                          f"(its 16-byte loads), not {elements}")


def make_plan(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from mlir.ir import InsertionPoint

        affine = scan.ops(module_op, "affine")
        if len(affine) != 1 or state.form is None:
            raise ValueError("scan-plan runs after scan-decompose (one scan.affine)")
        fa = derived(state.form, reads_states(state.options.backward))
        threads, elements = state.backward_tile
        plan = BackwardPlan(threads, elements, fa)
        last = scan.ops(module_op)[-1]
        with InsertionPoint.after(last), affine[0].location:
            scan.create("thread", {"elements": plan.elements, "vector_width": VECTOR,
                                   "layout": "direct"})
            scan.create("block", {"threads": plan.threads, "tree": plan.tree})
            for sw in plan.sweeps:
                scan.create("sweep", {"phase": sw.phase, "stride": sw.stride,
                                      "active": sw.active, "via": sw.via})
            scan.create("recompute", {"state": fa.state, "saved": fa.saved,
                                      "every": plan.tile})
            scan.create("adjoint", {"state": f"lam_{fa.state}", "tree": "suffix",
                                    "c": str(fa.inject)})
            for g in fa.gradients:
                scan.create("gradient", {"target": g.target, "of": g.of, "over": g.over,
                                         "expr": g.expr()})
        state.plan = read_plan(module_op, fa)
    return run


def read_plan(module_op: Any, fa: FusedAdjoint) -> BackwardPlan:
    """The plan in the IR, checked against the terms derived here."""
    def one(name: str) -> dict[str, Any]:
        found = scan.ops(module_op, name)
        if len(found) != 1:
            raise CompileError(f"the backward's plan needs one scan.{name}, it has "
                               f"{len(found)}")
        return scan.attrs(found[0])
    thread, block, rec = one("thread"), one("block"), one("recompute")
    threads, elements = int(block["threads"]), int(thread["elements"])
    try:
        check_tile(threads, elements)
    except OptionError as err:
        raise CompileError(f"the plan's tile: {err}") from None
    plan = BackwardPlan(threads, elements, fa)
    if (block["tree"], thread["layout"], thread["vector_width"]) != (plan.tree, "direct",
                                                                     VECTOR):
        raise CompileError(f"the backward's tile is lowered as a {plan.tree} tree over direct "
                           f"tiles of {VECTOR}-element vectors, not {block['tree']} over "
                           f"{thread['layout']} tiles of {thread['vector_width']}")
    sweeps = tuple(Sweep(a["phase"], a["stride"], a["active"], a["via"])
                   for a in map(scan.attrs, scan.ops(module_op, "sweep")))
    if not implemented_sweeps(plan.tree, threads, sweeps):
        raise CompileError(f"the sweeps of the backward's {plan.tree} tree over {threads} "
                           "threads are not the ones its lowering implements")
    if int(rec["every"]) != threads * elements or rec["saved"] != fa.saved:
        raise CompileError(f"the plan recomputes every {rec['every']} steps from "
                           f"{rec['saved']!r}; the lowering recomputes a tile of "
                           f"{threads * elements} steps from {fa.saved!r}")
    adjoint = one("adjoint")
    if adjoint["tree"] != "suffix":
        raise CompileError("the backward's adjoint is lowered as a suffix tree only")
    if adjoint["c"] != str(fa.inject):
        raise CompileError(f"the plan's adjoint reads c[t] = {adjoint['c']}; the lowering "
                           f"derives c[t] = {fa.inject} for these options")
    got = [(a["target"], a["of"], a["over"], a["expr"])
           for a in map(scan.attrs, scan.ops(module_op, "gradient"))]
    want = [(g.target, g.of, g.over, g.expr()) for g in fa.gradients]
    if got != want:
        raise CompileError("the plan's scan.gradient ops are not the gradients the lowering "
                           f"derives for this recurrence: {got} against {want}")
    return plan


def make_lower(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from explorer.codegen.lower_fused import build
        from explorer.passes.lower import term_locations

        if state.form is None:
            raise ValueError("scan-lower runs after scan-decompose and scan-plan")
        plan = read_plan(module_op, derived(state.form, reads_states(state.options.backward)))
        state.plan = plan
        state.built = build(module_op, plan.adjoint, plan.threads, plan.elements,
                            term_locations(state.recurrence))
        scan.erase(scan.ops(module_op))
    return run


def reads_states(backward: Any) -> bool:
    """Whether a backward compile's kernel reads the states' cotangents (``backward=True``;
    not ``"readouts"``)."""
    return backward is True


def backward_plan_from_dict(raw: Any, form: Any, kernels: list[dict[str, Any]],
                            states: bool = True) -> BackwardPlan:
    """A record's backward plan (``{"backward": [threads, elements]}``), checked against its
    kernel's block; the terms derived from the recurrence again (ValueError if malformed).
    ``states``: see :func:`reads_states`."""
    tile = raw.get("backward") if isinstance(raw, dict) else None
    if not (isinstance(tile, list) and len(tile) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in tile)):
        raise ValueError("the record's backward plan is malformed")
    try:
        check_tile(*tile)
        fa = derived(form, states)
    except OptionError as err:
        raise ValueError(f"the record's backward plan: {err}") from None
    blocks = [k.get("block") for k in kernels]
    if blocks != [[tile[0], 1, 1]]:
        raise ValueError(f"the record's backward plan ({tile[0]} threads) disagrees with its "
                         f"kernels' blocks {blocks}")
    # the arrays its kernel reads are those of the terms derived for its options (a record
    # whose backward option was edited would show a c[t] its kernel does not compute)
    want = [*form.recurrence.inputs, fa.saved, *fa.cotangents.values()]
    got = [a.get("name") for a in kernels[0].get("args", []) if isinstance(a, dict)
           and a.get("role") == "input"]
    if got != want:
        raise ValueError(f"the record's backward kernel reads {got}; the backward its options "
                         f"say reads {want}")
    # its saved states: one step a tile, the tile's (the kernel indexes them so), and no other
    # argument (the kernel reads every step of the others)
    args = [a for a in kernels[0].get("args", []) if isinstance(a, dict)]
    saved = [a for a in args if a.get("role") == "input" and a.get("name") == fa.saved]
    every = [a.get("every") for a in saved]
    others = [a.get("name") for a in args if "every" in a and a not in saved]
    if others:
        raise ValueError(f"the record's backward kernel reads {others!r:.40} one step in a "
                         "tile: only its saved states are")
    if every != [tile[0] * tile[1]]:
        raise ValueError(f"the record's backward kernel reads {fa.saved} one step in "
                         f"{every[0] if every else None!r:.24}, not in its tile of "
                         f"{tile[0] * tile[1]} steps")
    return BackwardPlan(tile[0], tile[1], fa)

