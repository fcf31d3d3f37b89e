"""One view per compiler stage, each a small ipywidgets panel that draws what the compiler recorded.

A view has a ``widget`` to place in the explorer's tabs and a ``show(compiled)`` method; views are
drawn lazily (the first time their tab is opened for a compilation) and keep their rendered HTML,
so reopening a tab or switching back to a pass costs no lexing. No view recomputes a stage: the
texts, timings, graphs and plans all come from the compiled record (a :class:`Compiled`, made
here or read back with ``load_compiled``), whose fields are read as they are.

Here: the recurrence, affine, LLVM IR and PTX views and the line of stage times; the scan tree
and the MLIR passes have modules of their own (:mod:`explorer.widget.tree_view`,
:mod:`explorer.widget.mlir_view`), and the base :class:`View` is in
:mod:`explorer.widget.stage_view`. All of them are importable from here.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import ipywidgets as widgets

from explorer.widget.graphs import dependence_dot, svg_or_message
from explorer.widget.highlight import highlight, plain_html
from explorer.widget.mlir_view import MlirView
from explorer.widget.report import seconds_text
from explorer.widget.stage_view import View, _message, stage
from explorer.widget.tree_view import TreeView

if TYPE_CHECKING:
    from explorer.compiler import Compiled, Stage

__all__ = [
    "AffineView", "MlirView", "PassTimesView", "PtxView", "RecurrenceView", "TextStageView",
    "TreeView", "View", "stage",
]


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
