"""One view per compiler stage, each a small ipywidgets panel that draws what the compiler recorded.

A view has a ``widget`` to place in the explorer's tabs and a ``show(compiled)`` method; views are
drawn lazily (the first time their tab is opened for a compilation) and keep their rendered HTML,
so reopening a tab or switching back to a pass costs no lexing. No view recomputes a stage: the
texts, timings, graphs and plans all come from the compiled object.
"""

from __future__ import annotations

import html
import time
from typing import Any

import ipywidgets as widgets

from explorer.widget.graphs import dependence_dot, svg_or_message
from explorer.widget.highlight import highlight, plain_html, unified_diff


def _message(text: str, color: str = "#666") -> str:
    return f'<div style="color:{color};padding:4px 0">{html.escape(text)}</div>'


def _seconds(seconds: float | None) -> str:
    if not seconds:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def stage(compiled: Any, name: str) -> Any | None:
    """The recorded stage ``name`` of ``compiled``, or ``None`` when it was not recorded."""
    stages = getattr(compiled, "stages", None) or {}
    return stages.get(name)


class View:
    """Base of the stage views: remembers which compilation it drew."""

    title = ""

    def __init__(self) -> None:
        self.widget: widgets.Widget = widgets.VBox()
        self._drawn_for: int | None = None

    def show(self, compiled: Any) -> None:
        """Draw ``compiled`` unless this very compilation is already drawn."""
        if self._drawn_for == id(compiled):
            return
        self._drawn_for = id(compiled)
        self.draw(compiled)

    def reset(self) -> None:
        self._drawn_for = None

    def draw(self, compiled: Any) -> None:  # pragma: no cover - overridden
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

    def header_html(self, compiled: Any, recorded: Any) -> str:
        lines = len(recorded.text.splitlines())
        timing = (f", stage time {_seconds(recorded.seconds)}" if recorded.seconds
                  else " (its time is counted in the MLIR passes that produced it)")
        return _message(f"{self.title}: {lines} lines{timing}")

    def draw(self, compiled: Any) -> None:
        recorded = stage(compiled, self.stage_name)
        if recorded is None or not recorded.text:
            target = getattr(compiled, "target", None) or getattr(compiled, "device", "")
            self.header.value = _message(
                f"No {self.title} was recorded for this compilation (target {target}).")
            self.code.value = ""
            return
        self.header.value = self.header_html(compiled, recorded)
        self.code.value = highlight(recorded.text, self.language)


class PtxView(TextStageView):
    """PTX, with the register, spill and shared-memory counts reported by ``ptxas``."""

    def __init__(self) -> None:
        super().__init__("ptx", "ptx", "PTX")

    def header_html(self, compiled: Any, recorded: Any) -> str:
        base = super().header_html(compiled, recorded)
        info = getattr(compiled, "ptx_info", None)
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
        chip = (getattr(compiled, "options", {}) or {}).get("chip", "")
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

    def draw(self, compiled: Any) -> None:
        rec = compiled.recurrence
        recorded = stage(compiled, "recurrence")
        text = recorded.text if recorded is not None and recorded.text else rec.text
        self.summary.value = plain_html(text)
        dot = getattr(recorded, "dot", None) if recorded is not None else None
        self.graph.value = ("<div style='margin-top:6px'><b>Dependence graph</b> "
                            "(red edges read the past)</div>" + svg_or_message(dot))


class AffineView(View):
    """``s_t = A_t s_{t-1} + b_t`` typeset with LaTeX, the combine, and the transition graph."""

    title = "Affine"

    def __init__(self) -> None:
        super().__init__()
        self.math = widgets.HTMLMath()
        self.graph = widgets.HTML()
        self.widget = widgets.VBox([self.math, self.graph])

    def draw(self, compiled: Any) -> None:
        form = compiled.form
        pieces: dict[str, str] = form.to_latex()
        kind = getattr(form, "kind", "")
        lane = " per lane $n$" if getattr(form, "vector", False) else ""
        rows = [f"<p>State of size {form.size} ({html.escape(str(kind))}){lane}: "
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
    """The scan plan as a tree, stepping through its up-sweep and down-sweep levels."""

    title = "Scan tree"
    MAX_DRAWN = 64

    def __init__(self) -> None:
        super().__init__()
        self.info = widgets.HTML()
        self.step = widgets.IntSlider(description="level", min=0, max=0, value=0,
                                      continuous_update=True,
                                      layout=widgets.Layout(width="420px"))
        self.play = widgets.Play(min=0, max=0, interval=900, description="play")
        widgets.jslink((self.play, "value"), (self.step, "value"))
        self.level_label = widgets.HTML()
        self.picture = widgets.HTML()
        self.picture.add_class("sw-tree-picture")
        self.widget = widgets.VBox([
            self.info,
            widgets.HBox([self.play, self.step, self.level_label]),
            self.picture,
        ])
        self._plan: Any = None
        self._svg: dict[int, str] = {}
        self.step.observe(self._on_step, names="value")

    def draw(self, compiled: Any) -> None:
        plan = compiled.plan
        recorded = stage(compiled, "plan")
        facts = [f"strategy <b>{html.escape(str(plan.strategy))}</b>", f"n = {plan.n}",
                 f"work = {plan.work} combines", f"depth = {plan.depth} levels"]
        if recorded is not None:
            facts.append(f"plan stage time {_seconds(recorded.seconds)}")
        note = ""
        if plan.size > self.MAX_DRAWN:
            # Too many positions to draw legibly: draw the same strategy on a few positions.
            from explorer.compiler import PLAN_PICTURE_N
            from explorer.passes.plans import make_plan

            plan = make_plan(plan.strategy, PLAN_PICTURE_N)
            note = (f"<div style='color:#666'>The compiled plan has {compiled.plan.size} "
                    f"positions, too many to draw; the picture shows the same strategy on "
                    f"n = {plan.n} (work {plan.work}, depth {plan.depth}).</div>")
        self._plan = plan
        self._svg = {}
        levels = list(plan.levels)
        self.info.value = "<div>Compiled plan: " + ", ".join(facts) + "</div>" + note
        # position 0 shows the whole plan; position k highlights level k-1
        self.step.max = len(levels)
        self.play.max = len(levels)
        self.step.value = 0
        self._render(0)

    def _level_text(self, position: int) -> str:
        levels = list(getattr(self._plan, "levels", ()))
        if position == 0 or position > len(levels):
            return "all levels (move the slider or press play to step through them)"
        level = levels[position - 1]
        phase = {"up": "up-sweep", "down": "down-sweep"}.get(level.phase, str(level.phase))
        steps = len(getattr(level, "steps", ()))
        return f"level {position} of {len(levels)}: <b>{html.escape(phase)}</b>, {steps} combines"

    def _render(self, position: int) -> None:
        self.level_label.value = self._level_text(position)
        if position not in self._svg:
            highlight_level = None if position == 0 else position - 1
            try:
                dot = self._plan.to_dot(highlight_level=highlight_level)
            except ValueError as err:
                self._svg[position] = _message(str(err))
            else:
                self._svg[position] = svg_or_message(dot)
        self.picture.value = self._svg[position]

    def _on_step(self, change: dict[str, Any]) -> None:
        if self._plan is not None:
            self._render(int(change["new"]))


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
        self._compiled: Any = None
        self._passes: list[Any] = []
        self._visible: list[int] = []
        self._cache: dict[tuple[int, str], str] = {}
        self._syncing = False
        self.last_render_seconds = 0.0
        self.selector.observe(self._on_selector, names="value")
        self.slider.observe(self._on_slider, names="value")
        self.mode.observe(lambda _change: self._render(), names="value")
        self.hide_unchanged.observe(lambda _change: self._refilter(), names="value")

    # -- drawing -----------------------------------------------------------------------------
    def draw(self, compiled: Any) -> None:
        self._compiled = compiled
        self._passes = list(getattr(compiled, "passes", ()) or ())
        self._cache = {}
        self._refilter(select_last=True)

    def _label(self, index: int) -> str:
        record = self._passes[index]
        mark = "" if record.changed else ", unchanged"
        return f"{index + 1:>2}. {record.name} ({_seconds(record.seconds)}{mark})"

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
        recorded = stage(self._compiled, "mlir")
        return (recorded.text if recorded is not None else ""), "generated MLIR"

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
            f"{_seconds(record.seconds)}; {lines} lines after it")
        self.code.value = self.rendered(index, self.mode.value)
        self.last_render_seconds = time.perf_counter() - start


class PassTimesView:
    """Not a tab: one line of stage times (the MLIR passes summed) under the controls."""

    def __init__(self) -> None:
        self.widget = widgets.HTML()

    def show(self, compiled: Any) -> None:
        stages = getattr(compiled, "stages", {}) or {}
        passes = list(getattr(compiled, "passes", ()) or ())
        pass_stages = {p.name for p in passes}
        cells: list[tuple[str, float]] = []
        for name, recorded in stages.items():
            # the compiler keeps one stage per pass after "mlir": summed below, not listed
            if name != "mlir" and (getattr(recorded, "kind", "") == "mlir"
                                   or name.split(" #")[0] in pass_stages):
                continue
            cells.append((str(name), recorded.seconds))
            if name == "mlir" and passes:
                cells.append((f"{len(passes)} passes", sum(p.seconds for p in passes)))
        spans = "".join(f"<span style='margin-right:12px'>{html.escape(name)} "
                        f"<span style='color:#888'>{_seconds(seconds)}</span></span>"
                        for name, seconds in cells)
        cached = " (from the compile cache)" if getattr(compiled, "from_cache", False) else ""
        self.widget.value = (f"<div style='font-size:12px;color:#444'>stage times{cached}: "
                             f"{spans}</div>")
