"""One view per compiler stage, each a small ipywidgets panel that draws what the compiler recorded.

A view has a ``widget`` to place in the explorer's tabs and a ``show(compiled)`` method; views are
drawn lazily (the first time their tab is opened for a compilation) and keep their rendered HTML,
so reopening a tab or switching back to a pass costs no lexing. No view recomputes a stage: the
texts, timings, graphs and plans all come from the compiled record (a :class:`Compiled`, made
here or read back with ``load_compiled``), whose fields are read as they are.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from explorer.compiler import PLAN_PICTURE_N
from explorer.passes.plans import MAX_DOT_POSITIONS
from explorer.widget.bundle import seconds_text
from explorer.widget.graphs import dependence_dot, svg_or_message
from explorer.widget.highlight import highlight, plain_html, unified_diff

if TYPE_CHECKING:
    from explorer.codegen.records import PassRecord
    from explorer.compiler import Compiled, Stage
    from explorer.passes.plan import Plan
    from explorer.passes.plans import Level, ScanPlan


def _message(text: str, color: str = "#666") -> str:
    return f'<div style="color:{color};padding:4px 0">{html.escape(text)}</div>'


def stage(compiled: Compiled, name: str) -> Stage | None:
    """The recorded stage ``name`` of ``compiled``, or ``None`` when it was not recorded (no
    PTX for the CPU target)."""
    return compiled.stages.get(name)


class View:
    """Base of the stage views: remembers which compilation it drew."""

    title = ""

    def __init__(self) -> None:
        self.widget: widgets.Widget = widgets.VBox()
        self._drawn_for: int | None = None

    def show(self, compiled: Compiled) -> None:
        """Draw ``compiled`` unless this very compilation is already drawn."""
        if self._drawn_for == id(compiled):
            return
        self._drawn_for = id(compiled)
        self.draw(compiled)

    def reset(self) -> None:
        self._drawn_for = None

    def draw(self, compiled: Compiled) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class TextStageView(View):
    """A stage shown as highlighted text (LLVM IR, PTX), with its compile time."""

    def __init__(self, stage_name: str, language: str, title: str) -> None:
        super().__init__()
        self.stage_name = stage_name
        self.language = language
        self.title = title
        self.header = widgets.HTML()
        self.code = widgets.HTML()
        self.widget = widgets.VBox([self.header, self.code])

    def header_html(self, compiled: Compiled, recorded: Stage) -> str:
        lines = len(recorded.text.splitlines())
        timing = (f", stage time {seconds_text(recorded.seconds)}" if recorded.seconds
                  else " (its time is counted in the MLIR passes that produced it)")
        return _message(f"{self.title}: {lines} lines{timing}")

    def draw(self, compiled: Compiled) -> None:
        recorded = stage(compiled, self.stage_name)
        if recorded is None or not recorded.text:
            self.header.value = _message(
                f"No {self.title} was recorded for this compilation (target "
                f"{compiled.target}).")
            self.code.value = ""
            return
        self.header.value = self.header_html(compiled, recorded)
        self.code.value = highlight(recorded.text, self.language)


class PtxView(TextStageView):
    """PTX, with the register, spill and shared-memory counts reported by ``ptxas``."""

    def __init__(self) -> None:
        super().__init__("ptx", "ptx", "PTX")

    def header_html(self, compiled: Compiled, recorded: Stage) -> str:
        base = super().header_html(compiled, recorded)
        info = compiled.ptx_info
        if not info or "unavailable" in info:
            why = (f" ({info['unavailable']})" if info else "")
            return base + _message(f"No ptxas report{why}: register, spill and shared-memory "
                                   "counts are unknown. The PTX below is complete.")
        labels = {"registers": "registers / thread", "spills_stores": "spill stores",
                  "spills_loads": "spill loads", "shared_bytes": "shared memory (bytes)",
                  "stack_bytes": "stack (bytes)", "barriers": "barriers"}
        badges = []
        for key, label in labels.items():
            if key in info:
                value = info[key]
                alarm = key.startswith("spills") and value not in (0, "0", None)
                color = "#fde8e8" if alarm else "#eef4ff"
                badges.append(f"<span style='display:inline-block;margin:2px 6px 2px 0;"
                              f"padding:2px 8px;border-radius:10px;background:{color}'>"
                              f"{html.escape(label)}: <b>{html.escape(str(value))}</b></span>")
        kernel = info.get("kernel")
        chip = compiled.options["chip"]
        title = f"ptxas {html.escape(str(chip))}" + (
            f", kernel <code>{html.escape(str(kernel))}</code>" if kernel else "")
        return base + f"<div>{title}: {''.join(badges)}</div>"


class RecurrenceView(View):
    """The parsed recurrence (names and their roles) and its dependence graph."""

    title = "Recurrence"

    def __init__(self) -> None:
        super().__init__()
        self.summary = widgets.HTML()
        self.graph = widgets.HTML()
        self.widget = widgets.VBox([self.summary, self.graph])

    def draw(self, compiled: Compiled) -> None:
        recorded = compiled.stages["recurrence"]
        self.summary.value = plain_html(recorded.text)
        self.graph.value = ("<div style='margin-top:6px'><b>Dependence graph</b> "
                            "(red edges read the past)</div>" + svg_or_message(recorded.dot))


class AffineView(View):
    """``s_t = A_t s_{t-1} + b_t`` typeset with LaTeX, the combine, and the transition graph."""

    title = "Affine"

    def __init__(self) -> None:
        super().__init__()
        self.math = widgets.HTMLMath()
        self.graph = widgets.HTML()
        self.widget = widgets.VBox([self.math, self.graph])

    def draw(self, compiled: Compiled) -> None:
        form = compiled.form
        pieces: dict[str, str] = form.to_latex()
        lane = " per lane $n$" if form.vector else ""
        rows = [f"<p>State of size {form.size} ({html.escape(form.kind)}){lane}: "
                "each step is an affine map of the previous state.</p>"]
        rows.append(_aligned([pieces[k] for k in ("state", "update", "A", "b") if k in pieces]))
        readouts = [value for key, value in pieces.items() if key.startswith("readout")]
        if readouts:
            rows.append("<p>Readouts, computed from the state at each step:</p>")
            rows.append(_aligned(readouts))
        rows.append("<p>Two steps compose into one step of the same form; this combine is "
                    "associative, with an identity, so the steps can be scanned in any "
                    "grouping:</p>")
        rows.append(_aligned([pieces[k] for k in ("combine", "identity") if k in pieces]))
        self.math.value = "".join(rows)
        self.graph.value = ("<div><b>State transition</b>: an edge per nonzero entry of "
                            "A<sub>t</sub>; dashed edges bring inputs in</div>"
                            + svg_or_message(dependence_dot(form)))


def _aligned(equations: list[str]) -> str:
    """Display equations one per line, aligned on their first ``=``."""
    lines = []
    for equation in equations:
        left, sep, right = equation.partition("=")
        lines.append(f"{left} &= {right}" if sep else equation)
    body = r" \\[4pt] ".join(lines)
    return f"<div style='margin:2px 0 8px 0'>$$\\begin{{aligned}} {body} \\end{{aligned}}$$</div>"


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
        self.info.value = self._info_html(plan, picture, plan_seconds)
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
    def _info_html(plan: Plan, picture: ScanPlan, plan_seconds: float | None) -> str:
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
                      f"thread, then the <b>{html.escape(plan.tree)}</b> tree over the "
                      f"{plan.threads} thread aggregates in {len(plan.sweeps)} "
                      f"<code>scan.sweep</code> levels (a barrier after each); grid "
                      f"<code>{html.escape(grid.scheme)}</code>{direction}")
            if plan.lookback is not None:
                window = plan.lookback.lanes * plan.lookback.tiles_per_lane
                layout += (f": sequences too few to fill the GPU are cut into tiles of "
                           f"{grid.tile} steps, one a block, in one pass; each block looks "
                           f"back over the tiles before it, {window} a round trip "
                           f"(<code>scan.lookback</code>: {plan.lookback.lanes} lanes x "
                           f"{plan.lookback.tiles_per_lane} tiles)")
            elif grid.scheme == "chunked":
                layout += (": sequences too few to fill the GPU are cut into chunks of whole "
                           f"tiles of {grid.tile} steps (reduce, carry, rescan)")
            rest = ""
            if picture.n < plan.threads:
                rest = (f"; the sweeps with a stride of {picture.n} or more join them to the "
                        f"other {plan.threads - picture.n} threads and are not drawn")
            drawn = (f"The picture: the tree over the first {picture.n} of the {plan.threads} "
                     f"thread aggregates (work = {picture.work} combines, depth = "
                     f"{picture.depth} levels{rest})")
        timing = (f"; the pass took {seconds_text(plan_seconds)}" if plan_seconds else "")
        return ("<div><b>Read from the IR of the <code>scan-plan</code> pass</b> "
                f"(<code>compiled.scan_plan</code>){timing}: {layout}.</div>"
                f"<div style='color:#444'>{drawn}.</div>")

    # -- levels ------------------------------------------------------------------------------
    def _sweep_index(self, level: Level) -> int | None:
        """Which ``scan.sweep`` of the plan a level of the picture draws (None: no tree)."""
        assert self._compiled is not None
        plan = self._compiled.scan_plan
        if plan.tree == "none" or not level.steps:
            return None
        stride = level.steps[0].right - level.steps[0].left
        phases = {"scan": ("scan",), "up": ("up", "up_root"), "down": ("down",)}[level.phase]
        for index, sweep in enumerate(plan.sweeps):
            if sweep.phase in phases and sweep.stride == stride:
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
        phase = {"up": "up-sweep", "down": "down-sweep", "scan": "scan"}[level.phase]
        kind = "swaps" if level.steps and level.steps[0].kind == "swap" else "combines"
        count = len(level.steps)
        head = (f"level {position} of {len(levels)}: <b>{phase}</b>, {count} "
                f"{kind if count != 1 else kind[:-1]} in the picture")
        index = self._sweep_index(level)
        if index is not None:
            sweep = self._compiled.scan_plan.sweeps[index]
            op = self._sweep_ops[index] if index < len(self._sweep_ops) else ""
            head += (f"; in the block, {sweep.active} threads work at stride {sweep.stride}: "
                     f"sweep {index + 1} of {len(self._compiled.scan_plan.sweeps)}, "
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


class MlirView(View):
    """The MLIR after every pass: pass selector, IR or diff against the pass before, timings."""

    title = "MLIR"

    def __init__(self) -> None:
        super().__init__()
        self.hide_unchanged = widgets.Checkbox(value=False, description="hide passes that "
                                               "changed nothing", indent=False)
        self.mode = widgets.ToggleButtons(options=[("IR after pass", "ir"),
                                                   ("diff vs. pass before", "diff")],
                                          value="ir")
        self.selector = widgets.Dropdown(description="pass", options=[],
                                         layout=widgets.Layout(width="520px"))
        self.slider = widgets.IntSlider(min=0, max=0, value=0, readout=False,
                                        continuous_update=True,
                                        layout=widgets.Layout(width="320px"))
        self.info = widgets.HTML()
        self.code = widgets.HTML()
        self.selector.add_class("sw-pass-selector")
        self.slider.add_class("sw-pass-slider")
        self.code.add_class("sw-mlir-code")
        self.widget = widgets.VBox([
            widgets.HBox([self.selector, self.slider]),
            widgets.HBox([self.mode, self.hide_unchanged]),
            self.info,
            self.code,
        ])
        self._compiled: Compiled | None = None
        self._passes: list[PassRecord] = []
        self._visible: list[int] = []
        self._cache: dict[tuple[int, str], str] = {}
        self._syncing = False
        self.last_render_seconds = 0.0
        self.selector.observe(self._on_selector, names="value")
        self.slider.observe(self._on_slider, names="value")
        self.mode.observe(lambda _change: self._render(), names="value")
        self.hide_unchanged.observe(lambda _change: self._refilter(), names="value")

    # -- drawing -----------------------------------------------------------------------------
    def draw(self, compiled: Compiled) -> None:
        self._compiled = compiled
        self._passes = list(compiled.passes)
        self._cache = {}
        self._refilter(select_last=True)

    def _label(self, index: int) -> str:
        record = self._passes[index]
        mark = "" if record.changed else ", unchanged"
        return f"{index + 1:>2}. {record.name} ({seconds_text(record.seconds)}{mark})"

    def _refilter(self, select_last: bool = False) -> None:
        keep_hidden = self.hide_unchanged.value
        self._visible = [i for i, record in enumerate(self._passes)
                         if record.changed or not keep_hidden]
        current = self.selector.value
        self._syncing = True
        try:
            self.selector.options = [(self._label(i), i) for i in self._visible]
            self.slider.max = max(0, len(self._visible) - 1)
            if not self._visible:
                self.selector.value = None
            elif select_last or current not in self._visible:
                # after a new compilation, start on the first pass
                self.selector.value = self._visible[0]
            else:
                self.selector.value = current
            if self._visible:
                self.slider.value = self._visible.index(self.selector.value)
        finally:
            self._syncing = False
        self._render()

    def _on_selector(self, change: dict[str, Any]) -> None:
        if self._syncing or change["new"] is None:
            return
        self._syncing = True
        try:
            self.slider.value = self._visible.index(change["new"])
        finally:
            self._syncing = False
        self._render()

    def _on_slider(self, change: dict[str, Any]) -> None:
        if self._syncing or not self._visible:
            return
        self._syncing = True
        try:
            self.selector.value = self._visible[int(change["new"])]
        finally:
            self._syncing = False
        self._render()

    # -- public ------------------------------------------------------------------------------
    def select(self, index: int) -> None:
        """Show the IR after pass ``index`` (position in ``compiled.passes``)."""
        if index not in self._visible:
            raise ValueError(f"pass {index} is not shown (hidden because it changed nothing?)")
        self.selector.value = index

    @property
    def selected(self) -> int | None:
        value = self.selector.value
        return None if value is None else int(value)

    def _before(self, index: int) -> tuple[str, str]:
        if index > 0:
            previous = self._passes[index - 1]
            return previous.ir, f"after {previous.name}"
        assert self._compiled is not None
        return self._compiled.stages["mlir"].text, "generated MLIR"

    def rendered(self, index: int, mode: str) -> str:
        """HTML for pass ``index`` in ``mode`` ("ir" or "diff"), rendered once then cached."""
        key = (index, mode)
        if key not in self._cache:
            record = self._passes[index]
            if mode == "diff":
                before, before_name = self._before(index)
                diff = unified_diff(before, record.ir, before_name, f"after {record.name}")
                self._cache[key] = (highlight(diff, "diff") if diff
                                    else _message("This pass changed nothing."))
            else:
                self._cache[key] = highlight(record.ir, "mlir")
        return self._cache[key]

    def _render(self) -> None:
        start = time.perf_counter()
        index = self.selected
        if index is None or not self._passes:
            self.info.value = _message("No MLIR passes were recorded." if not self._passes
                                       else "Every pass is hidden.")
            self.code.value = ""
            return
        record = self._passes[index]
        changed = "changed the IR" if record.changed else "changed nothing"
        lines = len(record.ir.splitlines())
        self.info.value = _message(
            f"pass {index + 1} of {len(self._passes)}: {record.name}: {changed}; "
            f"{seconds_text(record.seconds)}; {lines} lines after it")
        self.code.value = self.rendered(index, self.mode.value)
        self.last_render_seconds = time.perf_counter() - start


class PassTimesView:
    """Not a tab: one line of stage times (the MLIR passes summed) under the controls."""

    def __init__(self) -> None:
        self.widget = widgets.HTML()

    def show(self, compiled: Compiled) -> None:
        passes = compiled.passes
        pass_stages = {p.name for p in passes}
        cells: list[tuple[str, float]] = []
        for name, recorded in compiled.stages.items():
            # a stage per pass (a view of its record, named as the pass): summed below
            if name in pass_stages:
                continue
            cells.append((name, recorded.seconds))
            if name == "mlir" and passes:
                cells.append((f"{len(passes)} passes", sum(p.seconds for p in passes)))
        spans = "".join(f"<span style='margin-right:12px'>{html.escape(name)} "
                        f"<span style='color:#888'>{seconds_text(seconds)}</span></span>"
                        for name, seconds in cells)
        cached = " (from the compile cache)" if compiled.from_cache else ""
        self.widget.value = (f"<div style='font-size:12px;color:#444'>stage times{cached}: "
                             f"{spans}</div>")
