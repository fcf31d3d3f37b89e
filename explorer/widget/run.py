"""The run panel: run the compiled kernel, check it against the float64 reference, and sweep
sizes while a live plot fills in point by point.

The kernel runs where the compiled object runs it (``compiled.device``: the GPU when there is
one, otherwise the CPU path), and the panel says which. A sweep runs in a background thread so
that the Stop button (handled by the kernel's main thread) can end it between two measurements.

Only the kernel's thread touches the widgets. The front end answers every change of the plotly
figure (trace and layout deltas), and ipywidgets applies each answer on the kernel's thread
holding the figure's trait notifications; a change made by another thread inside that window is
merged away (plotly sets ``_py2js_addTraces`` and resets it to None, so only the None is sent and
the trace never reaches the browser). So the sweep thread measures, and hands each widget change
to the kernel's event loop (``call_soon_threadsafe``); outside a kernel (a script, a test) it
changes them itself. The panel never ignores a request silently: a sweep it cannot start says
why in the status line.

What a sweep measures, and how, is in :mod:`explorer.widget.measure` (its names are importable
from here too).
"""

from __future__ import annotations

import asyncio
import functools
import html
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import numpy as np

from explorer.widget.data import bounded_inputs, compare, length_argument
from explorer.widget.measure import (
    INTERACTIVE_BASELINES,
    Measurement,
    cpu_sweep,
    device_label,
    gpu_sweep,
    time_call,
)

__all__ = [
    "INTERACTIVE_BASELINES", "RELATIVE_TOLERANCE", "SIZES", "SWEEP_STATES", "Measurement",
    "RunPanel", "cpu_sweep", "device_label", "gpu_sweep", "status_html", "time_call",
]

if TYPE_CHECKING:
    from explorer.compiler import Compiled

RELATIVE_TOLERANCE = 1e-3


def tolerance_of(options: dict[str, Any]) -> float:
    """The run check's tolerance for a compile's options: :data:`RELATIVE_TOLERANCE`, plus
    the unit roundoff of 16-bit outputs (their inputs are rounded before the reference)."""
    from explorer.runtime.dtypes import UNIT_ROUNDOFF

    out = options.get("out_dtype") or options.get("dtype", "float32")
    return RELATIVE_TOLERANCE + (UNIT_ROUNDOFF.get(out, 0.0) if out != "float32" else 0.0)
"""A run passes when every output's max relative error (float32 against float64) is below this."""

SIZES = [2 ** k for k in range(6, 23)]

#: the states a sweep's status line is in, each marked by a class ``sw-sweep-<state>`` (a reader
#: of the page, such as the browser tests, can tell them apart)
SWEEP_STATES = ("ready", "running", "done", "stopped", "error", "refused")


def status_html(state: str, text: str, color: str | None = None) -> str:
    """The status line's markup: ``text`` in a span marked with the sweep's ``state``."""
    if state not in SWEEP_STATES:
        raise ValueError(f"unknown sweep state {state!r}")
    style = f" style='color:{color}'" if color else ""
    return f"<span class='sw-sweep-state sw-sweep-{state}'{style}>{html.escape(text)}</span>"


def _in_kernel() -> bool:
    """Whether this process is an IPython kernel (whose loop handles the front end's messages)."""
    kernelbase = sys.modules.get("ipykernel.kernelbase")
    return kernelbase is not None and bool(kernelbase.Kernel.initialized())


def _kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The kernel's event loop when this thread runs it (a button's handler, a cell), else None.
    Another loop running this thread (a test driving a browser, say) is not the kernel's: it may
    not run again for a long time, so the sweep changes the widgets itself there."""
    if not _in_kernel():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _lengths_text(sizes: list[int]) -> str:
    if not sizes:
        return "no length"
    if len(sizes) == 1:
        return f"L = {sizes[0]:,} (1 length)"
    return f"L = {sizes[0]:,} … {sizes[-1]:,} ({len(sizes)} lengths)"


class RunPanel:
    """Controls, correctness table and live throughput plot for one compiled recurrence."""

    def __init__(self) -> None:
        self.device = widgets.HTML()
        style = {"description_width": "initial"}
        self.length = widgets.BoundedIntText(value=4096, min=1, max=1 << 26, description="L",
                                             tooltip="time steps of the sequence",
                                             layout=widgets.Layout(width="160px"), style=style)
        self.channels = widgets.BoundedIntText(value=64, min=1, max=1 << 20,
                                               description="channels",
                                               layout=widgets.Layout(width="190px"), style=style)
        self.state_size = widgets.BoundedIntText(value=16, min=1, max=256,
                                                 description="state size N",
                                                 layout=widgets.Layout(width="200px"),
                                                 style=style)
        self.run_button = widgets.Button(description="Run and check", icon="play",
                                         button_style="primary")
        self.check = widgets.HTML()
        self.sizes = widgets.SelectionRangeSlider(options=[(f"{s:,}", s) for s in SIZES],
                                                  index=(0, 10), description="sweep L",
                                                  layout=widgets.Layout(width="480px"),
                                                  style=style)
        #: what the next sweep measures, as the kernel has the slider's range
        self.range_info = widgets.HTML()
        self.range_info.add_class("sw-sweep-range")
        self.sweep_button = widgets.Button(description="Sweep", icon="line-chart")
        self.stop_button = widgets.Button(description="Stop", icon="stop", button_style="danger",
                                          disabled=True)
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="progress",
                                            layout=widgets.Layout(width="360px"))
        self.status = widgets.HTML()
        self.figure = self._make_figure()
        self.widget = widgets.VBox([
            self.device,
            widgets.HBox([self.length, self.channels, self.state_size, self.run_button]),
            self.check,
            widgets.HBox([self.sizes, self.sweep_button, self.stop_button, self.range_info]),
            widgets.HBox([self.progress, self.status]),
            self.figure,
        ])
        self.widget.add_class("sw-run-panel")
        self._compiled: Compiled | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: counts sweeps: a change handed to the loop by an earlier sweep's thread is dropped
        self._generation = 0
        self.measurements: list[Measurement] = []
        #: the plotted points: trace name -> (lengths, GB/s, drawn as the roofline's line, the
        #: hover text of each point: which of the compile's kernels ran that length)
        self._points: dict[str, tuple[list[int], list[float], bool, list[str]]] = {}
        self.last_check: list[dict[str, Any]] = []
        #: the last progress line a sweep showed (also for code reading the panel)
        self.last_progress = ""
        self._last_end = ""
        self.run_button.on_click(lambda _b: self.run_and_check())
        self.sweep_button.on_click(lambda _b: self.sweep(wait=False))
        self.stop_button.on_click(lambda _b: self.stop())
        self.sizes.observe(lambda _c: self._show_range(), names="value")
        self._show_range()
        self.status.value = status_html("ready", "compile a recurrence to sweep")

    @staticmethod
    def _make_figure(data: list[Any] | None = None) -> Any:
        import plotly.graph_objects as go

        figure = go.FigureWidget(data=data or [])
        figure.update_layout(
            height=360, margin={"l": 60, "r": 20, "t": 40, "b": 50},
            title={"text": "throughput against sequence length", "font": {"size": 14}},
            xaxis={"title": {"text": "L (time steps)"}, "type": "log"},
            yaxis={"title": {"text": "GB/s (bytes read + written)"}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": -0.25},
        )
        return figure

    # -- state -------------------------------------------------------------------------------
    def set_compiled(self, compiled: Compiled | None) -> None:
        previous = self._compiled
        self._compiled = compiled
        if compiled is None or previous is None or compiled.key != previous.key:
            # the check table is about the kernel it ran: a new compile clears it
            self.check.value = ""
            self.last_check = []
        device = compiled.device if compiled is not None else "cpu"
        self.device.value = ("<div style='padding:4px 6px;background:#eef4ff;border-radius:3px'>"
                             f"<b>Runs on:</b> {html.escape(device_label(device))}</div>")
        rec = compiled.recurrence if compiled is not None else None
        self.state_size.layout.display = "" if rec is not None and rec.vector else "none"
        # channels only where there are arrays to give them; L always (with no input indexed
        # by time, this box is the only place the length comes from)
        arrays = rec is None or bool(rec.inputs or rec.params)
        self.channels.layout.display = "" if arrays else "none"
        timed = rec is None or bool(rec.inputs)
        self.length.description = "L" if timed else "L (no input is indexed by time)"
        self.length.layout.width = "160px" if timed else "330px"
        # the fused backward kernel runs as a torch operator's backward, not here
        backward = compiled is not None and bool(compiled.options.get("backward"))
        self.run_button.disabled = compiled is None or backward
        self.sweep_button.disabled = compiled is None or self.running or backward
        self._show_range()
        if not self.running:
            self.status.value = status_html(
                "ready", "press Sweep to time the kernel" if compiled is not None
                else "compile a recurrence to sweep")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def chosen_sizes(self) -> list[int]:
        """The lengths in the slider's range."""
        low, high = self.sizes.value
        return [s for s in SIZES if low <= s <= high]

    def _show_range(self) -> None:
        """Beside the slider: what the Sweep button would measure, as the kernel has it (the
        page's slider may be ahead of the kernel while its change is on the way)."""
        where = ""
        if self._compiled is not None:
            where = " on the GPU" if self._compiled.device == "cuda" else " on the CPU"
        self.range_info.value = (f"<span style='color:#555'>"
                                 f"{html.escape(_lengths_text(self.chosen_sizes()))}{where}"
                                 "</span>")

    def _refuse(self, why: str) -> None:
        self.status.value = status_html("refused", why, "#a00")

    # -- run and check -----------------------------------------------------------------------
    def run_and_check(self) -> list[dict[str, Any]]:
        """Run once at the chosen size and compare with ``explorer.reference``."""
        import explorer

        compiled = self._compiled
        if compiled is None:
            self.check.value = ("<pre class='sw-check-error' style='color:#a00'>nothing is "
                                "compiled: fix the recurrence above, then run</pre>")
            self.last_check = []
            return []
        if compiled.options.get("backward"):
            self.check.value = (
                "<pre class='sw-check-error' style='color:#a00;white-space:pre-wrap'>the fused "
                "backward kernel runs as the backward of the torch operator: "
                "ex.compile(text, target='cuda').torch(), then loss.backward() on CUDA "
                "tensors (checked against torch autograd in float64 by "
                "tests/gpu/test_autodiff_gpu.py, timed by bench/grad_speed.py)</pre>")
            self.last_check = []
            return []
        try:
            arrays, expected = bounded_inputs(compiled.recurrence, explorer.reference,
                                              self.channels.value, self.length.value,
                                              self.state_size.value,
                                              reverse=compiled.options["reverse"],
                                              dtype=compiled.options.get("dtype", "float32"),
                                              offsets=compiled.options.get("read_offsets"))
            given: dict[str, Any] = {
                **length_argument(compiled.recurrence, self.length.value), **arrays}
            start = time.perf_counter()
            result = compiled(**given)
            seconds = time.perf_counter() - start
            # every output the compile stores (its outputs option: a call returns the lone
            # output bare, several by name), each against the reference's same output
            stored = compiled.outputs
            from explorer.groundtruth import stored_reference

            expected, about = stored_reference(compiled.recurrence, expected, stored,
                                                reverse=compiled.options["reverse"])
            if not isinstance(result, dict):
                result = {stored[0]: result}
            rows = compare(result, expected, stored)
            for row in rows:
                row["reference"] = about[row["output"]]
            self.tolerance = tolerance_of(compiled.options)
        except Exception as err:  # noqa: BLE001 - shown in the panel, never raised into the cell
            self.check.value = ("<pre class='sw-check-error' style='color:#a00;"
                                "white-space:pre-wrap'>"
                                f"{html.escape(type(err).__name__ + ': ' + str(err))}</pre>")
            self.last_check = []
            return []
        self.last_check = rows
        self.check.value = self._check_html(rows, seconds, compiled.device,
                                            compiled.options.get("outputs", "readouts"))
        return rows

    def passed(self, rows: list[dict[str, Any]]) -> bool:
        tol = getattr(self, "tolerance", RELATIVE_TOLERANCE)
        return bool(rows) and all(np.isfinite(r["max_rel"]) and r["max_rel"] <= tol
                                  for r in rows)

    def _check_html(self, rows: list[dict[str, Any]], seconds: float, device: str,
                    outputs: Any = "readouts") -> str:
        ok = self.passed(rows)
        verdict = ("<span style='color:#0a0;font-weight:bold'>PASS</span>" if ok
                   else "<span style='color:#c00;font-weight:bold'>FAIL</span>")
        body = "".join(
            f"<tr class='sw-check-row'><td>{html.escape(r['output'] or 'output')}</td>"
            f"<td>{html.escape(str(r['shape']) if not r.get('missing') else 'not returned')}"
            f"</td><td>{html.escape(r.get('reference', 'reference'))}</td>"
            f"<td>{r['max_abs']:.3g}</td><td>{r['max_rel']:.3g}</td></tr>"
            for r in rows
        )
        where = "GPU" if device == "cuda" else "CPU"
        chosen = repr(outputs) if isinstance(outputs, str) else repr(list(outputs))
        names = ", ".join(r["output"] for r in rows)
        return (f"<div>{verdict} against explorer.reference (float64), tolerance "
                f"{getattr(self, 'tolerance', RELATIVE_TOLERANCE):.3g} relative; one call on "
                f"the {where} took "
                f"{seconds * 1e3:.2f} ms (includes transfers and the first-call setup)</div>"
                f"<div class='sw-check-outputs' style='color:#444'>outputs="
                f"{html.escape(chosen)}: the compile stores {html.escape(names)}, each checked "
                "against the same output of the reference</div>"
                "<table style='border-collapse:collapse' cellpadding='3'>"
                "<tr><th align='left'>output</th><th align='left'>shape</th>"
                "<th align='left'>compared with</th>"
                "<th align='left'>max abs error</th><th align='left'>max rel error</th></tr>"
                f"{body}</table>")

    # -- sweep -------------------------------------------------------------------------------
    def _records(self, compiled: Compiled, sizes: list[int]) -> Iterator[Measurement]:
        import explorer

        if compiled.device == "cuda":
            return gpu_sweep(compiled, sizes, self.channels.value, self.state_size.value,
                             self._stop)
        return cpu_sweep(compiled, explorer.reference, sizes, self.channels.value,
                         self.state_size.value, self._stop)

    def _add_point(self, record: Measurement) -> None:
        if record.extra.get("status", "ok") != "ok" or record.seconds <= 0:
            return  # skipped, failed or wrong: reported in the status line, never plotted
        xs, ys, _, texts = self._points.setdefault(
            record.name, ([], [], record.extra.get("kind") == "roofline", []))
        xs.append(record.length)
        ys.append(record.gigabytes_per_second)
        from explorer.bench.results import kernels_text  # the bench only where it measured

        texts.append(kernels_text(record.extra.get("kernels")))
        self._redraw()

    def _redraw(self, title: str | None = None) -> None:
        """Put a new figure holding every point in the panel, in place of the old one.

        A figure is sent whole, as the new widget's state: plotly's incremental messages
        (addTraces, restyle) are deltas, and one lost on the way (merged inside ipywidgets'
        hold of the figure's notifications, or sent before the browser's view of it exists)
        would leave the plot short of points for good."""
        import plotly.graph_objects as go

        traces = [go.Scatter(x=list(xs), y=list(ys), name=name, text=list(texts),
                             mode="lines" if roofline else "lines+markers",
                             line={"dash": "dash", "color": "#555"} if roofline else None,
                             hovertemplate="L=%{x}: %{y:.0f} GB/s<br>%{text}")
                  for name, (xs, ys, roofline, texts) in self._points.items()]
        old = self.figure
        figure = self._make_figure(data=traces)
        figure.layout.title.text = title if title is not None else old.layout.title.text
        self.figure = figure
        self.widget.children = tuple(figure if child is old else child
                                     for child in self.widget.children)
        old.close()

    def sweep(self, sizes: list[int] | None = None, wait: bool = False) -> None:
        """Time every length in ``sizes`` (default: the slider's range) and plot as points arrive.

        ``wait=False`` (the Sweep button) runs in a background thread; ``wait=True`` returns when
        the sweep is done (for scripts and notebooks run top to bottom). A sweep that cannot
        start (nothing compiled, one already running, no length chosen) says why in the status
        line.
        """
        compiled = self._compiled
        if compiled is None:
            self._refuse("nothing is compiled: fix the recurrence above, then press Sweep")
            return
        if self.running:
            self._refuse("a sweep is already running: press Stop to end it, then Sweep again")
            return
        if sizes is None:
            sizes = self.chosen_sizes()
        sizes = list(sizes)
        if not sizes:
            self._refuse("no length to sweep: widen the range of sweep L")
            return
        try:
            # build the runner here, on the kernel's thread: on the CPU path that compiles the
            # host module, which must not race with a compile started from the controls
            compiled.runner(compiled.device)
        except Exception as err:  # noqa: BLE001 - shown in the panel, never raised into the cell
            self.status.value = status_html("error", f"{type(err).__name__}: {err}", "#a00")
            self.progress.bar_style = "danger"
            return
        self._generation += 1
        self._stop.clear()
        self.measurements = []
        self.last_progress = ""
        self._points = {}
        device = "GPU" if compiled.device == "cuda" else "CPU"
        self._redraw(f"throughput against L on the {device}, {self.channels.value} channels")
        self.progress.max = len(sizes)
        self.progress.value = 0
        self.progress.bar_style = "info"
        self.sweep_button.disabled = True
        self.stop_button.disabled = False
        self.status.value = status_html("running", f"starting: {_lengths_text(sizes)}")
        post = self._poster(self._generation, None if wait else _kernel_loop())
        if wait:
            self._sweep(compiled, sizes, post)
        else:
            self._thread = threading.Thread(target=self._sweep, args=(compiled, sizes, post),
                                            daemon=True, name="explorer-sweep")
            self._thread.start()

    def _poster(self, generation: int, loop: asyncio.AbstractEventLoop | None
                ) -> Callable[[Callable[[], None]], None]:
        """How the sweep changes the widgets: on ``loop``'s thread (the kernel's) when there is
        one, else right away; changes of an earlier sweep are dropped."""
        def apply(change: Callable[[], None]) -> None:
            if generation == self._generation:
                change()

        def post(change: Callable[[], None]) -> None:
            if loop is None or loop.is_closed():
                apply(change)
                return
            try:
                loop.call_soon_threadsafe(apply, change)
            except RuntimeError:   # the loop closed meanwhile (the kernel is shutting down)
                apply(change)

        return post

    def _show_measurement(self, record: Measurement, done: int, total: int) -> None:
        self._add_point(record)
        self.progress.value = min(done, total)
        where = f"L = {record.length:,} ({min(done, total)} of {total} lengths)"
        if record.extra.get("status", "ok") != "ok":
            line = f"{where}: {record.name}: {record.extra.get('reason')}"
        else:
            line = (f"{where}: {record.name}: {record.seconds * 1e3:.3f} ms, "
                    f"{record.gigabytes_per_second:.2f} GB/s")
        self.last_progress = line
        self.status.value = status_html("running", line)

    def _show_end(self, state: str, text: str) -> None:
        self.sweep_button.disabled = self._compiled is None
        self.stop_button.disabled = True
        self.progress.bar_style = {"done": "success", "stopped": "warning"}.get(state, "danger")
        self.status.value = status_html(state, text, "#a00" if state == "error" else None)
        self._last_end = text

    def _sweep(self, compiled: Compiled, sizes: list[int],
               post: Callable[[Callable[[], None]], None]) -> None:
        state, text = "error", "the sweep ended unexpectedly"
        try:
            lengths: set[int] = set()
            for record in self._records(compiled, sizes):
                self.measurements.append(record)
                lengths.add(record.length)
                post(functools.partial(self._show_measurement, record, len(lengths),
                                       len(sizes)))
                if self._stop.is_set():
                    break
            if self._stop.is_set():
                state, text = "stopped", f"stopped after {len(self.measurements)} measurements"
            else:
                state, text = "done", f"done: {len(self.measurements)} measurements"
        except Exception as err:  # noqa: BLE001 - shown in the panel, never raised into the cell
            state, text = "error", (f"{type(err).__name__}: {err} (after "
                                    f"{len(self.measurements)} measurements)")
        finally:
            post(functools.partial(self._show_end, state, text))

    def stop(self) -> None:
        """Ask a running sweep to end after the measurement in progress."""
        if not self.running:
            last = f" (the last one: {self._last_end})" if self._last_end else ""
            self._refuse(f"no sweep is running{last}")
            return
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background sweep to end. (In a notebook its last changes to the widgets
        reach them when the kernel's loop runs again, after the cell that waits.)"""
        if self._thread is not None:
            self._thread.join(timeout)
