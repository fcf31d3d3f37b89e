"""The MLIR tab: the IR after every pass, chosen with a selector or a slider, shown whole or as
the diff against the pass before, with each pass's time. Each rendering is kept, so stepping
back costs no lexing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from explorer.widget.highlight import highlight, unified_diff
from explorer.widget.report import seconds_text
from explorer.widget.stage_view import View, _message

if TYPE_CHECKING:
    from explorer.codegen.records import PassRecord
    from explorer.compiler import Compiled


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
