"""The Scan tree tab: the plan the ``scan-plan`` pass wrote, drawn and stepped through level
by level beside the ``scan.sweep`` ops it comes from."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from explorer.compiler import PLAN_PICTURE_N, short_text
from explorer.passes.plans import MAX_DOT_POSITIONS
from explorer.widget.graphs import svg_or_message
from explorer.widget.highlight import highlight, plain_html
from explorer.widget.report import seconds_text
from explorer.widget.stage_view import View, _message

if TYPE_CHECKING:
    from explorer.compiler import Compiled
    from explorer.passes.plan import Plan
    from explorer.passes.plans import Level, ScanPlan


class TreeView(View):
    """The plan's block tree as the ``scan-plan`` pass wrote it, stepped through level by level.

    ``compiled.scan_plan`` is the plan read back from that pass's IR, the very ops the lowering
    reads; the picture is its :meth:`~explorer.passes.plan.Plan.picture` over the first few
    thread aggregates of the block (the person chooses how many), and each level is shown beside
    the ``scan.sweep`` op it comes from. Nothing here builds a plan of its own.
    """

    title = "Scan tree"
    #: the most positions a picture draws (beyond that it is unreadable)
    MAX_DRAWN = MAX_DOT_POSITIONS
    #: a plan without a tree draws one thread's chain of steps, one level a step: fewer fit
    MAX_CHAIN = 16
    #: levels whose steps are listed in full; longer ones end with a count
    MAX_LISTED = 64

    def __init__(self) -> None:
        super().__init__()
        self.info = widgets.HTML()
        self.drawn = widgets.Dropdown(description="threads drawn", options=[16], value=16,
                                      layout=widgets.Layout(width="190px"),
                                      style={"description_width": "initial"})
        self.drawn.add_class("sw-tree-drawn")
        self.step = widgets.IntSlider(description="level", min=0, max=0, value=0,
                                      continuous_update=True,
                                      layout=widgets.Layout(width="360px"))
        self.step.add_class("sw-tree-step")
        self.play = widgets.Play(min=0, max=0, interval=900, description="play")
        widgets.jslink((self.play, "value"), (self.step, "value"))
        self.level_label = widgets.HTML()
        self.level_label.add_class("sw-tree-level")
        self.steps = widgets.HTML()
        self.steps.add_class("sw-tree-steps")
        self.picture = widgets.HTML()
        self.picture.add_class("sw-tree-picture")
        self.ops = widgets.HTML()
        self.ops.add_class("sw-tree-ops")
        self.widget = widgets.VBox([
            self.info,
            widgets.HBox([self.drawn, self.play, self.step]),
            self.level_label,
            self.steps,
            self.picture,
            self.ops,
        ])
        self._compiled: Compiled | None = None
        self._picture: ScanPlan | None = None
        self._sweep_ops: list[str] = []
        self._svg: dict[int, str] = {}
        self._syncing = False
        self.step.observe(self._on_step, names="value")
        self.drawn.observe(self._on_drawn, names="value")

    # -- drawing -----------------------------------------------------------------------------
    def draw(self, compiled: Compiled) -> None:
        self._compiled = compiled
        plan = compiled.scan_plan
        recorded = compiled.stages["plan"]
        lines = recorded.text.splitlines()
        ops = [line.strip() for line in lines if line.lstrip().startswith('"scan.')]
        about = "\n".join(line for line in lines
                          if not line.lstrip().startswith('"scan.')).strip()
        self._sweep_ops = [op for op in ops if op.startswith('"scan.sweep"')]
        self.ops.value = (
            "<div style='margin-top:8px'><b>The plan's <code>scan</code> ops</b>, as the "
            "<code>scan-plan</code> pass wrote them (the picture above is read from these; "
            "the <code>scan-lower</code> pass lowers the same ops to the kernel):</div>"
            + highlight("\n".join(ops), "mlir")
            + (f"<div style='margin-top:6px'><b>What the plan does</b></div>{plain_html(about)}"
               if about else ""))
        chain = plan.tree == "none"
        top = min(plan.threads, self.MAX_CHAIN if chain else self.MAX_DRAWN)
        choices = [1 << k for k in range(1, top.bit_length()) if 1 << k <= top]
        current = self.drawn.value
        wanted = current if current in choices else min(PLAN_PICTURE_N, choices[-1])
        self._syncing = True
        try:
            self.drawn.description = "time steps drawn" if chain else "threads drawn"
            self.drawn.options = choices
            self.drawn.value = wanted
        finally:
            self._syncing = False
        self._draw_picture(recorded.seconds)

    def _draw_picture(self, plan_seconds: float | None = None) -> None:
        compiled = self._compiled
        assert compiled is not None
        plan = compiled.scan_plan
        n = int(self.drawn.value)
        self._picture = picture = plan.picture(n)
        self._svg = {}
        if compiled.options.get("backward"):   # the fused backward's plan: its own words
            self.info.value = (
                "<div><b>Read from the IR of the <code>scan-plan</code> pass</b> "
                "(<code>compiled.scan_plan</code>): the fused backward kernel.</div>"
                + plain_html(plan.text())
                + f"<div style='color:#444'>The picture: the forward's warp-shuffle tree over "
                f"the first {picture.n} of the {plan.threads} thread aggregates (the adjoint's "
                "suffix tree is its mirror: shuffles down, the later warps first).</div>")
        else:
            self.info.value = self._info_html(plan, picture, plan_seconds,
                                              compiled.options.get("outputs", "readouts"),
                                              tuple(compiled.recurrence.states),
                                              tuple(compiled.recurrence.readouts))
        levels = len(picture.levels)
        self._syncing = True
        try:
            self.step.max = levels
            self.play.max = levels
            self.step.value = 0
        finally:
            self._syncing = False
        self._render(0)

    @staticmethod
    def _info_html(plan: Plan, picture: ScanPlan, plan_seconds: float | None,
                   outputs: Any = "readouts", states: tuple[str, ...] = (),
                   readouts: tuple[str, ...] = ()) -> str:
        grid = plan.grid
        direction = (" backwards in time (scan position t is time L - 1 - t)"
                     if grid.direction == "reverse" else "")
        if plan.tree == "none":
            layout = (f"strategy <b>{html.escape(plan.strategy)}</b>: no tree; each of the "
                      f"{plan.threads} threads of a block walks its own sequence{direction}, "
                      f"a warp staging 32 sequences x {plan.tile_steps} steps through shared "
                      "memory")
            drawn = (f"The picture: one thread's chain over its first {picture.n} time steps "
                     f"(work = {picture.work} combines, depth = {picture.depth} levels)")
        else:
            layout = (f"strategy <b>{html.escape(plan.strategy)}</b>: a block of "
                      f"{plan.threads} threads, {plan.elements} elements composed in each "
                      f"thread (tiles {html.escape(plan.layout)}), then the "
                      f"<b>{html.escape(plan.tree)}</b> tree over the "
                      f"{plan.threads} thread aggregates in {len(plan.sweeps)} "
                      f"<code>scan.sweep</code> levels ("
                      + ("shuffles inside each warp, one barrier to join the warps"
                         if plan.tree == "warp_shuffle" else
                         f"the {sum(sw.via == 'shuffle' for sw in plan.sweeps)} inside a warp "
                         "by shuffles in registers, the others in shared memory with a barrier "
                         "after each" if plan.shuffled else "a barrier after each")
                      + "); grid "
                      f"<code>{html.escape(grid.scheme)}</code>{direction}")
            if plan.lookback is not None:
                window = plan.lookback.lanes * plan.lookback.tiles_per_lane
                layout += (f": sequences too few to fill the GPU are cut into tiles of "
                           f"{grid.tile} steps ({plan.lookback.threads} threads x "
                           f"{plan.lookback.elements} elements, tiles "
                           f"{html.escape(plan.lookback.layout)}), one a block, in one pass; "
                           "each block looks "
                           f"back over the tiles before it, {window} a round trip "
                           f"(<code>scan.lookback</code>: {plan.lookback.lanes} lanes x "
                           f"{plan.lookback.tiles_per_lane} tiles)")
                if plan.lookback.threads != plan.threads or plan.shuffled:
                    levels = len(plan.lookback.sweeps(plan.tree))
                    layout += (f"; a look-back block runs the same {html.escape(plan.tree)} "
                               f"tree over its {plan.lookback.threads} threads ({levels} levels"
                               + (", all in shared memory" if plan.shuffled else "")
                               + "; the picture is the plain block's)")
            elif grid.scheme == "chunked":
                layout += (": sequences too few to fill the GPU are cut into chunks of whole "
                           f"tiles of {grid.tile} steps (reduce, carry, rescan)")
            if plan.short is not None:
                layout += f"; {html.escape(short_text(plan))}"
            rest = ""
            if picture.n < plan.threads:
                rest = (f"; the sweeps with a stride of {picture.n} or more join them to the "
                        f"other {plan.threads - picture.n} threads and are not drawn")
            drawn = (f"The picture: the tree over the first {picture.n} of the {plan.threads} "
                     f"thread aggregates (work = {picture.work} combines, depth = "
                     f"{picture.depth} levels{rest})")
        timing = (f"; the pass took {seconds_text(plan_seconds)}" if plan_seconds else "")
        from explorer.passes.outputs import outputs_text

        # what the kernels write (the outputs option, as scan.store holds it), and where a
        # readout sums the lanes (scan.lane_sum)
        chosen = repr(outputs) if isinstance(outputs, str) else repr(list(outputs))
        default = " (the default)" if outputs == "readouts" else ""
        store = ", ".join(f'"{name}"' for name in plan.stored)
        skipped = [r for r in readouts if r not in plan.stored]
        stored = (f"<div class='sw-tree-outputs'>the <code>outputs</code> option: "
                  f"<code>{html.escape(chosen)}</code>{default} &rarr; "
                  f"<code>{html.escape(f'scan.store {{outputs = [{store}]}}')}</code>"
                  + (f"; the readouts {html.escape(', '.join(skipped))} are not computed"
                     if skipped else "") + "</div>"
                  + "<br>".join(html.escape(line.strip())
                                for line in outputs_text(plan, states).splitlines()))
        reads = ""
        if plan.reads:   # inputs read in place at another time (scan.read)
            moved = ", ".join(f"<code>{html.escape(n)}</code> at t {'+' if k > 0 else '-'} "
                              f"{abs(k)}" for n, k in plan.reads)
            reads = (f"<div class='sw-tree-reads'>read in place at another time "
                     f"(<code>scan.read</code>, zero outside the sequence): {moved}</div>")
        return ("<div><b>Read from the IR of the <code>scan-plan</code> pass</b> "
                f"(<code>compiled.scan_plan</code>){timing}: {layout}.</div>"
                f"<div style='color:#444'>{drawn}.</div><div>{stored}</div>{reads}")

    # -- levels ------------------------------------------------------------------------------
    def _sweep_index(self, level: Level) -> int | None:
        """Which ``scan.sweep`` of the plan a level of the picture draws (None: no tree)."""
        assert self._compiled is not None
        plan = self._compiled.scan_plan
        if plan.tree == "none" or not level.steps:
            return None
        stride = level.steps[0].right - level.steps[0].left
        phases = {"scan": ("scan",), "up": ("up", "up_root"), "down": ("down",),
                  "shuffle": ("shuffle",), "warps": ("warps",)}[level.phase]
        for index, sweep in enumerate(plan.sweeps):
            # a join of warps draws one level per later warp, all of the one "warps" sweep
            if sweep.phase in phases and (sweep.stride == stride or sweep.phase == "warps"):
                return index
        if level.phase == "down":
            # the root of the whole block: the up-sweep's last level sets the total aside and
            # starts the down-sweep
            for index, sweep in enumerate(plan.sweeps):
                if sweep.phase == "up_root":
                    return index
        return None

    def _level_html(self, position: int) -> tuple[str, str]:
        """The line naming level ``position`` (0: all of them) and the list of its steps."""
        assert self._picture is not None and self._compiled is not None
        levels = self._picture.levels
        if position == 0 or position > len(levels):
            return (f"all {len(levels)} levels (move the slider or press play to step through "
                    "them)", "")
        level = levels[position - 1]
        phase = {"up": "up-sweep", "down": "down-sweep", "scan": "scan",
                 "shuffle": "shuffle inside each warp", "warps": "warps joined"}[level.phase]
        kind = "swaps" if level.steps and level.steps[0].kind == "swap" else "combines"
        count = len(level.steps)
        head = (f"level {position} of {len(levels)}: <b>{phase}</b>, {count} "
                f"{kind if count != 1 else kind[:-1]} in the picture")
        index = self._sweep_index(level)
        if index is not None:
            sweep = self._compiled.scan_plan.sweeps[index]
            op = self._sweep_ops[index] if index < len(self._sweep_ops) else ""
            head += (f"; in the block, {sweep.active} threads work at stride {sweep.stride}"
                     + (" (inside a warp, by shuffles)" if sweep.via == "shuffle" else "")
                     + f": sweep {index + 1} of {len(self._compiled.scan_plan.sweeps)}, "
                     f"<code>{html.escape(op)}</code>")
        shown = level.steps[:self.MAX_LISTED]
        arrow = "⇄" if kind == "swaps" else "→"
        pairs = " ".join(f"{s.left}{arrow}{s.right}" for s in shown)
        more = (f" … and {len(level.steps) - len(shown)} more"
                if len(level.steps) > len(shown) else "")
        meaning = ("x[l], x[r] = x[r], x[l] ∘ x[r]" if kind == "swaps"
                   else "x[r] = x[r] ∘ x[l]")
        steps = (f"<div style='font-family:var(--jp-code-font-family,monospace);font-size:12px;"
                 f"color:#333'>{kind} l{arrow}r ({html.escape(meaning)}): "
                 f"{html.escape(pairs)}{html.escape(more)}</div>")
        return head, steps

    def _render(self, position: int) -> None:
        assert self._picture is not None
        head, steps = self._level_html(position)
        self.level_label.value = f"<div>{head}</div>"
        self.steps.value = steps
        if position not in self._svg:
            highlight_level = None if position == 0 else position - 1
            try:
                dot = self._picture.to_dot(highlight_level=highlight_level)
            except ValueError as err:
                self._svg[position] = _message(str(err))
            else:
                self._svg[position] = svg_or_message(dot, shrink=False)
        self.picture.value = self._svg[position]

    def _on_step(self, change: dict[str, Any]) -> None:
        if self._picture is not None and not self._syncing:
            self._render(int(change["new"]))

    def _on_drawn(self, change: dict[str, Any]) -> None:
        if self._compiled is not None and not self._syncing:
            self._draw_picture(self._compiled.stages["plan"].seconds)
