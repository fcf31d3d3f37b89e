"""The explorer widget: one recurrence, every lowering stage, a run panel.

``Explorer(text)`` compiles the recurrence with the options chosen in its controls and shows what
the compiler recorded: the parsed recurrence, its affine form, the scan tree, the MLIR after every
pass, LLVM IR, PTX, and a panel that runs the kernel. Python owns all state; the browser only
draws. Errors (a recurrence that does not parse, a pass that fails) are shown inside the widget,
under the text box; nothing raises into the notebook cell.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from explorer.widget.backward import BackwardToggle
from explorer.widget.controls import (
    BLOCK_SIZES,
    CONTROLLED,
    ELEMENTS_PER_THREAD,
    FAST_MATH_CHOICES,
    LOOKBACK_LAYOUT_CHOICES,
    OUTPUTS_TOOLTIP,
    TILE_LAYOUT_CHOICES,
    choices,
    error_html,
    kept_html,
    outputs_choices,
    short_tile_choices,
)
from explorer.widget.highlight import style_sheet
from explorer.widget.run import RunPanel
from explorer.widget.views import (
    AffineView,
    MlirView,
    PassTimesView,
    PtxView,
    RecurrenceView,
    TextStageView,
    TreeView,
    View,
)

if TYPE_CHECKING:
    from explorer.compiler import Compiled

_WIDGET_CSS = """
<style>
.sw-error pre { color: #a00000; background: #fff2f2; border: 1px solid #f0c0c0;
  padding: 6px 8px; margin: 2px 0; white-space: pre; overflow-x: auto; font-size: 12px; }
.sw-recurrence textarea { font-family: var(--jp-code-font-family, monospace); font-size: 13px; }
.sw-title { font-size: 15px; font-weight: 600; margin-bottom: 2px; }
/* an HTML widget is a flex box: without this its content grows to the longest line of IR and
   runs past the tab; with it, long lines scroll inside their frame */
.sw-explorer .widget-html > .widget-html-content { min-width: 0; }
</style>
"""


def presets() -> dict[str, str]:
    """Named example recurrences, from :mod:`explorer.presets`."""
    from explorer import presets as preset_module

    table: dict[str, str] = dict(preset_module.PRESETS)
    return table


class Explorer(widgets.VBox):
    """Interactive compiler explorer for one affine recurrence.

    >>> Explorer("h[t] = a[t] * h[t-1] + b[t]")    # doctest: +SKIP
    >>> Explorer(explorer.compile(rec, block_size=64))   # doctest: +SKIP

    Given a compiled result (from ``explorer.compile`` or ``explorer.compiler.load_compiled``)
    it shows that result as it is, without compiling; edits in the box compile anew.

    The keywords set the controls of the options row; ``outputs`` is the compile option of that
    name (``"readouts"``, the default, ``"states"``, ``"all"``, or output names, which the
    outputs box offers as one more choice).

    Attributes worth reading from code: ``compiled`` (the last successful compilation, or None),
    ``error`` (the last error, or None), ``mlir`` (the pass view: ``mlir.select(i)``),
    ``tree_view`` (the plan read from the ``scan-plan`` pass's IR), ``run`` (the run panel:
    ``run.run_and_check()``, ``run.sweep(wait=True)``), ``backward`` (the *backward* toggle,
    :mod:`explorer.widget.backward`: ``backward.button.value = True`` shows the adjoint
    recurrence of the text as its own compile, ``False`` the forward again).
    """

    TAB_TITLES = ("Recurrence", "Affine", "Scan tree", "MLIR", "LLVM IR", "PTX", "Run")

    def __init__(self, recurrence: Any = None, *, target: str = "cuda",
                 strategy: str = "blelloch", block_size: int | str | None = None,
                 elements_per_thread: int | str | None = None, chip: str = "sm_90",
                 dtype: str = "float32", reverse: bool = False, grid: str | None = None,
                 outputs: str | tuple[str, ...] | None = None,
                 fast_math: str | None = None, tile_layout: str | None = None,
                 short_tile: str | None = None, lookback_layout: str | None = None) -> None:
        from explorer.codegen.options import GRIDS, Options, layout_choice, validate
        from explorer.compiler import Compiled
        from explorer.frontend.recurrence import Recurrence

        table = presets()
        if recurrence is None:
            recurrence = next(iter(table.values()))
        given = recurrence if isinstance(recurrence, Compiled) else None
        if given is not None:
            # a compiled record: its options are complete (checked when it was made or read)
            opts = given.options
            recurrence = given.recurrence
            target, strategy = given.target, given.strategy
            chip, dtype, reverse = opts["chip"], opts["dtype"], opts["reverse"]
            grid = opts.get("grid", "chunked")
            outputs = opts.get("outputs", "readouts")
            fast_math = opts.get("fast_math", "contract")
            tile_layout = opts.get("tile_layout", "auto")
            short_tile = opts.get("short_tile", "auto")
            lookback_layout = opts.get("lookback_layout", "auto")
            block_size, elements_per_thread = opts["block_size"], opts["elements_per_thread"]
        defaults = Options()
        #: options of a given record that no control sets (``varlen``, ``out_dtype``,
        #: ``chunk_tiles``, ...), where they differ from the defaults: every compile made from
        #: the controls keeps them, and the options row says so
        default_values = defaults.as_dict()
        self.kept_options: dict[str, Any] = {} if given is None else {
            k: v for k, v in given.options.items()
            if k not in CONTROLLED and k in default_values and v != default_values[k]}
        if grid is None:
            grid = defaults.grid
        if outputs is None:
            outputs = defaults.outputs
        if fast_math is None:
            fast_math = defaults.fast_math
        if tile_layout is None:
            tile_layout = defaults.tile_layout
        if short_tile is None:
            short_tile = defaults.short_tile
        if lookback_layout is None:
            lookback_layout = defaults.lookback_layout
        if block_size is None:
            block_size = defaults.block_size
        if elements_per_thread is None:
            elements_per_thread = defaults.elements_per_thread
        # checked before any control is built: a bad value raises OptionError naming it and
        # what is accepted (the controls offer exactly the accepted values)
        # (``outputs`` comes back as the compiler holds it: a keyword or a tuple of names)
        outputs = validate(strategy, target, block_size=block_size,
                           elements_per_thread=elements_per_thread, chip=chip, dtype=dtype,
                           reverse=reverse, grid=grid, outputs=outputs,
                           fast_math=fast_math, tile_layout=tile_layout,
                           short_tile=short_tile, lookback_layout=lookback_layout).outputs
        if isinstance(recurrence, Recurrence):
            recurrence = recurrence.text
        if not isinstance(recurrence, str):
            raise TypeError("Explorer takes recurrence text, an explorer.Recurrence or a "
                            "compiled result")
        text = recurrence

        self.compiled: Compiled | None = None
        self.error: BaseException | None = None

        # -- the recurrence box --------------------------------------------------------------
        self.preset = widgets.Dropdown(options=[("choose a preset…", "")] + [
            (name, body) for name, body in table.items()], value="", description="preset",
            layout=widgets.Layout(width="320px"))
        self.text = widgets.Textarea(value=text, continuous_update=False, rows=3,
                                     placeholder="h[t] = a[t] * h[t-1] + b[t]",
                                     layout=widgets.Layout(width="100%"))
        self.text.add_class("sw-recurrence")
        self.compile_button = widgets.Button(description="Compile", icon="cogs",
                                             button_style="primary")
        self.error_box = widgets.HTML()
        self.error_box.add_class("sw-error-box")
        self._held = False
        self.backward = BackwardToggle(self)
        self.status = widgets.HTML()

        # -- options -------------------------------------------------------------------------
        strategies, chips, dtypes = choices()
        narrow = widgets.Layout(width="210px")
        style = {"description_width": "initial"}
        self.target = widgets.Dropdown(options=[("CUDA (PTX)", "cuda"), ("CPU", "cpu")],
                                       value=target, description="target", layout=narrow,
                                       style=style)
        self.strategy = widgets.Dropdown(options=strategies, value=strategy,
                                         description="strategy",
                                         layout=widgets.Layout(width="280px"), style=style)
        self.block_size = widgets.Dropdown(options=BLOCK_SIZES, value=block_size,
                                           description="block size", layout=narrow, style=style)
        self.elements_per_thread = widgets.Dropdown(options=ELEMENTS_PER_THREAD,
                                                    value=elements_per_thread,
                                                    description="elements/thread",
                                                    layout=narrow, style=style)
        self.dtype = widgets.Dropdown(options=dtypes, value=dtype, description="dtype",
                                      layout=widgets.Layout(width="170px"), style=style)
        self.chip = widgets.Dropdown(options=chips, value=chip, description="chip",
                                     layout=widgets.Layout(width="150px"), style=style)
        self.reverse = widgets.Checkbox(value=reverse, description="reverse in time",
                                        indent=False,
                                        tooltip="scan backwards: h[t] = A_t h[t+1] + b_t, the "
                                                "initial state after the last step",
                                        layout=widgets.Layout(width="150px"))
        self.reverse.add_class("sw-reverse")
        # the grid level of a tree plan: how few long sequences are spread over blocks
        self.grid = widgets.Dropdown(
            options=[(label, g) for label, g in
                     (("auto (look-back for a scalar state)", "auto"),
                      ("chunked (reduce, carry, rescan)", "chunked"),
                      ("look-back (one pass)", "lookback")) if g in GRIDS], value=grid,
            description="grid", layout=widgets.Layout(width="290px"), style=style,
            disabled=strategy == "sequential",
            tooltip="how a tree plan spreads few long sequences over blocks (scan.grid)")
        self.grid.add_class("sw-grid")
        # which outputs the kernels store (scan.store): the readouts alone by default
        self.outputs = widgets.Dropdown(options=outputs_choices(outputs), value=outputs,
                                        description="outputs", tooltip=OUTPUTS_TOOLTIP,
                                        layout=widgets.Layout(width="250px"), style=style)
        self.outputs.add_class("sw-outputs")
        # the float ops' freedoms (pass scan-fastmath): switch FMA contraction or approximate
        # functions off or on and see the IR, the PTX and the time change
        self.fast_math = widgets.Dropdown(
            options=list(FAST_MATH_CHOICES), value=fast_math, description="fast math",
            layout=widgets.Layout(width="300px"), style=style,
            tooltip="fastmath flags on the float ops (pass scan-fastmath): FMA contraction, "
                    "approximate exp/log/division, or neither")
        self.fast_math.add_class("sw-fast-math")
        # how a tree plan's tiles meet its threads on the GPU (scan.thread {layout})
        self.tile_layout = widgets.Dropdown(
            options=list(TILE_LAYOUT_CHOICES), value=tile_layout, description="tiles",
            layout=widgets.Layout(width="240px"), style=style,
            disabled=not layout_choice(target, strategy),
            tooltip="how a tile reaches the threads on the GPU (scan.thread {layout}): through "
                    "the shared-memory stage, or each thread's own elements in registers")
        self.tile_layout.add_class("sw-tile-layout")
        # the tree plan's kernel of its own for short sequences (scan.short): off, or a tile
        self.short_tile = widgets.Dropdown(
            options=short_tile_choices(short_tile), value=short_tile,
            description="short kernel", disabled=strategy == "sequential",
            layout=widgets.Layout(width="210px"), style=style,
            tooltip="sequences of at most 4096 steps in a kernel of their own (scan.short): "
                    "auto, off, or its threads x elements")
        self.short_tile.add_class("sw-short-tile")
        # how the look-back kernel meets its tile (scan.lookback {layout}), on its own
        self.lookback_layout = widgets.Dropdown(
            options=list(LOOKBACK_LAYOUT_CHOICES), value=lookback_layout,
            description="look-back tiles", disabled=strategy == "sequential",
            layout=widgets.Layout(width="300px"), style=style,
            tooltip="how the look-back kernel of few long sequences meets its tile "
                    "(scan.lookback {layout}): staged as float32 scalars, packed as loaded "
                    "(read back in 16-byte vectors; float32 copied in by cp.async), or direct "
                    "in registers (GPU)")
        self.lookback_layout.add_class("sw-lookback-layout")
        if len(dtypes) == 1:
            self.dtype.disabled = True
            self.dtype.tooltip = f"the compiler generates {dtypes[0]} kernels"
        else:
            self.dtype.tooltip = ("the inputs' dtype in memory: 16-bit inputs are extended to "
                                  "float32 where loaded (arith.extf), the outputs rounded to "
                                  "the same dtype (arith.truncf); see the scan-narrow pass")

        # -- stage views ---------------------------------------------------------------------
        self.recurrence_view = RecurrenceView()
        self.affine_view = AffineView()
        self.tree_view = TreeView()
        self.mlir = MlirView()
        self.llvm_view = TextStageView("llvm", "llvm", "LLVM IR")
        self.ptx_view = PtxView()
        self.run = RunPanel()
        self.times = PassTimesView()
        self._views: list[View | None] = [self.recurrence_view, self.affine_view,
                                          self.tree_view, self.mlir, self.llvm_view,
                                          self.ptx_view, None]
        self.tabs = widgets.Tab(children=[v.widget if v is not None else self.run.widget
                                          for v in self._views],
                                titles=self.TAB_TITLES)

        self.kept = widgets.HTML(kept_html(self.kept_options))
        self.kept.add_class("sw-kept-options")
        header = widgets.HTML(_WIDGET_CSS + style_sheet()
                              + "<div class='sw-title'>ScanWeaver Explorer</div>")
        super().__init__([
            header,
            widgets.HBox([self.preset, self.compile_button, self.backward.button,
                          self.backward.kernel_button, self.status]),
            self.text,
            self.backward.formulas,
            self.error_box,
            widgets.HBox([self.target, self.strategy, self.block_size,
                          self.elements_per_thread, self.grid, self.outputs, self.dtype,
                          self.fast_math, self.tile_layout, self.short_tile,
                          self.lookback_layout, self.chip, self.reverse],
                         layout=widgets.Layout(flex_flow="row wrap")),
            self.kept,
            self.times.widget,
            self.tabs,
        ])
        self.add_class("sw-explorer")

        self.preset.observe(self._on_preset, names="value")
        self.text.observe(lambda _c: self.recompile(), names="value")
        self.compile_button.on_click(lambda _b: self.recompile())
        for control in (self.target, self.strategy, self.block_size, self.elements_per_thread,
                        self.grid, self.outputs, self.dtype, self.fast_math, self.tile_layout,
                        self.short_tile, self.lookback_layout, self.chip, self.reverse):
            control.observe(lambda _c: self.recompile(), names="value")
        self.tabs.observe(lambda _c: self._show_selected(), names="selected_index")
        if given is not None:
            self._show_compiled(given)
        else:
            self.recompile()

    # -- compiling ---------------------------------------------------------------------------
    def options(self) -> dict[str, Any]:
        """The compile options chosen in the controls (keywords of ``explorer.compile``)."""
        return {
            "target": self.target.value,
            "strategy": self.strategy.value,
            "block_size": self.block_size.value,
            "elements_per_thread": self.elements_per_thread.value,
            "chip": self.chip.value,
            "dtype": self.dtype.value,
            "reverse": bool(self.reverse.value),
            "grid": self.grid.value,
            "outputs": self.outputs.value,
            "fast_math": self.fast_math.value,
            # the direct layout is a GPU tree plan's: elsewhere the box is off, its value kept
            "tile_layout": "auto" if self.tile_layout.disabled else self.tile_layout.value,
            # a short kernel is a tree plan's: for the sequential plan the box is off
            "short_tile": "auto" if self.short_tile.disabled else self.short_tile.value,
            # a look-back kernel is a tree plan's: for the sequential plan the box is off
            "lookback_layout": ("auto" if self.lookback_layout.disabled
                                else self.lookback_layout.value),
            **self.kept_options,
        }

    def recompile(self) -> bool:
        """Compile the text in the box with the chosen options; True on success.

        On failure the error is shown under the box and the stage views keep the last good
        compilation (marked as stale), so the person can compare.
        """
        import explorer
        from explorer.codegen.options import layout_choice

        if self._held:   # several controls change at once: one compile after (holding)
            return self.error is None
        # the sequential plan has no grid of blocks to choose
        self.grid.disabled = self.short_tile.disabled = self.strategy.value == "sequential"
        self.lookback_layout.disabled = self.strategy.value == "sequential"
        self.tile_layout.disabled = not layout_choice(self.target.value, self.strategy.value)
        self.status.value = "<i>compiling…</i>"
        start = time.perf_counter()
        try:
            compiled = explorer.compile(self.text.value, **self.options())
        except Exception as err:  # noqa: BLE001 - every error is shown in the widget
            self.error = err
            self.error_box.value = error_html(err)
            stale = " (the tabs show the last compilation that worked)" if self.compiled else ""
            self.status.value = f"<span style='color:#a00000'>error{stale}</span>"
            return False
        self._show_compiled(compiled, time.perf_counter() - start)
        return True

    def _show_compiled(self, compiled: Compiled, seconds: float | None = None) -> None:
        """Show what ``compiled`` recorded in every view (``seconds``: how long the compile
        that made it took here; None for a record given to the explorer)."""
        self.error = None
        self.error_box.value = ""
        self.compiled = compiled
        if seconds is None:
            done = "shown as recorded"
        elif compiled.from_cache:
            done = f"loaded from the compile cache in {seconds:.2f} s"
        else:
            done = f"compiled in {seconds:.2f} s"
        self.status.value = (f"<span style='color:#0a6a0a'>{done}: {len(compiled.stages)} "
                             f"stages, {len(compiled.passes)} MLIR passes</span>")
        for view in self._views:
            if view is not None:
                view.reset()
        self.times.show(compiled)
        self.run.set_compiled(compiled)
        self._show_selected()

    def _show_selected(self) -> None:
        index = self.tabs.selected_index
        if self.compiled is None or index is None:
            return
        view = self._views[index]
        if view is None:
            return
        try:
            view.show(self.compiled)
        except Exception as err:  # noqa: BLE001 - a view that cannot draw says why, in place
            self.error_box.value = error_html(err)

    def _on_preset(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.text.value = change["new"]

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Change several controls without a compile after each (the caller compiles once)."""
        self._held = True
        try:
            yield
        finally:
            self._held = False

    # -- conveniences for code -----------------------------------------------------------------
    def set_text(self, text: str) -> bool:
        """Put ``text`` in the box and compile it; True on success."""
        if self.text.value == text:
            return self.recompile()
        self.text.value = text
        return self.error is None

    def show_tab(self, title: str) -> None:
        """Open the tab called ``title`` (one of :attr:`TAB_TITLES`)."""
        self.tabs.selected_index = self.TAB_TITLES.index(title)

    def snapshot(self, path: Any) -> Any:
        """Write the last good compile (every stage, each pass's diff, the pictures, the last
        sweep's timings) to one self-contained HTML file; returns its path."""
        from explorer.widget.bundle import snapshot

        if self.compiled is None:
            raise ValueError("nothing is compiled yet: the recurrence in the box has an error")
        return snapshot(self.compiled, path, self.run.measurements or None)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The live widget, plus the compile as saved output (explorer.widget.bundle) that the
        JupyterLab extension draws without a kernel, and HTML for GitHub and nbviewer. The saved
        output is built once per compile (and its timing part once per set of measurements), so
        displaying the explorer again costs nothing."""
        data = super()._repr_mimebundle_(**kwargs)
        if self.compiled is None or not isinstance(data, dict):
            return data
        from explorer.widget.bundle import mime_bundle

        try:
            saved = mime_bundle(self.compiled, self.run.measurements or None)
        except Exception:  # noqa: BLE001 - the live widget shows whatever happens here
            return data
        return {**saved, **{k: v for k, v in data.items() if k != "text/plain"}}
