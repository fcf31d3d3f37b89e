"""The run panel: run the compiled kernel, check it against the float64 reference, and sweep
sizes while a live plot fills in point by point.

The kernel runs where the compiled object runs it (``compiled.device``: the GPU when there is
one, otherwise the CPU path), and the panel says which. A sweep runs in a background thread so
that the Stop button (handled by the kernel's main thread) can end it between two measurements.
"""

from __future__ import annotations

import functools
import html
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import numpy as np

from explorer.widget.data import bounded_inputs, compare, length_argument, sample_inputs

if TYPE_CHECKING:
    from explorer.compiler import Compiled

RELATIVE_TOLERANCE = 1e-3
"""A run passes when every output's max relative error (float32 against float64) is below this."""

SIZES = [2 ** k for k in range(6, 23)]


@dataclass
class Measurement:
    """One point of a sweep: an implementation timed at one length ``L``."""

    name: str
    length: int
    channels: int
    seconds: float
    bytes_moved: int
    device: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gigabytes_per_second(self) -> float:
        return self.bytes_moved / self.seconds / 1e9 if self.seconds > 0 else float("nan")

    @property
    def elements_per_second(self) -> float:
        steps = self.channels * self.length
        return steps / self.seconds if self.seconds > 0 else float("nan")


def device_label(device: str) -> str:
    """A sentence saying where runs happen."""
    if device == "cuda":
        name = ""
        try:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        except Exception:  # noqa: BLE001 - the name is decoration only
            name = ""
        return f"GPU (CUDA{', ' + name if name else ''}): the compiled PTX runs on the device"
    return ("CPU: no GPU here, so the kernel runs through the CPU path (MLIR ExecutionEngine) "
            "and is timed with time.perf_counter")


def _total_bytes(arrays: dict[str, np.ndarray], result: Any) -> int:
    outputs = result.values() if isinstance(result, dict) else [result]
    return int(sum(a.nbytes for a in arrays.values())
               + sum(np.asarray(o).nbytes for o in outputs))


def time_call(fn: Callable[[], Any], min_seconds: float = 0.2, max_repeats: int = 25
              ) -> float:
    """Median wall time of ``fn()`` after one warm-up call, with ``time.perf_counter``."""
    fn()
    times: list[float] = []
    total = 0.0
    while len(times) < max_repeats and (total < min_seconds or len(times) < 3):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return float(np.median(times))


def cpu_sweep(compiled: Compiled, reference: Callable[..., Any], sizes: list[int], channels: int,
              state_size: int, stop: threading.Event, reference_limit: int = 1 << 16
              ) -> Iterator[Measurement]:
    """Time the compiled kernel on the CPU path at each length, and the float64 NumPy reference
    (the sequential baseline) up to ``reference_limit`` steps."""
    rec = compiled.recurrence
    for length in sizes:
        if stop.is_set():
            return
        arrays = sample_inputs(rec, channels, length, state_size)
        given: dict[str, Any] = {**length_argument(rec, length), **arrays}
        result = compiled(**given)
        seconds = time_call(functools.partial(compiled, **given))
        yield Measurement(f"compiled {compiled.strategy} (CPU)", length, channels, seconds,
                          _total_bytes(arrays, result), "cpu")
        if stop.is_set():
            return
        if length <= reference_limit:
            seconds = time_call(functools.partial(reference, rec, **given), max_repeats=3)
            yield Measurement("explorer.reference, NumPy float64 (CPU)", length, channels, seconds,
                              _total_bytes(arrays, result), "cpu")


#: baselines quick to set up, for sweeps started from the notebook
INTERACTIVE_BASELINES = "cuda-sequential,cub-inclusive-scan,torch-associative-scan"


def gpu_sweep(compiled: Compiled, sizes: list[int], channels: int, state_size: int,
              stop: threading.Event) -> Iterator[Measurement]:
    """Time on the GPU with :func:`explorer.bench.sweep`: CUDA events, L2 flushed, every method
    checked against float64 first, the copy roofline beside the kernel.

    The baselines (CUDA C sequential, CUB, torch's associative_scan) compute the scalar affine
    scan ``h[t] = a[t] * h[t-1] + b[t]`` forwards in time, so they run beside a compile whose
    affine form is that scan (:func:`explorer.bench.affine.form_roles`) only; any other
    recurrence is timed on its own inputs against the copy of the same bytes.  Baselines that
    take minutes to build (accelerated-scan) are left to ``scanweaver bench``.
    """
    from explorer import bench
    from explorer.bench.affine import form_roles

    alike = form_roles(compiled.form) is not None and not compiled.options["reverse"]
    names = INTERACTIVE_BASELINES if alike else "none"
    with tempfile.TemporaryDirectory(prefix="explorer-sweep-") as folder:
        compiled.save(folder)
        label = f"compiled {compiled.strategy}"
        for record in bench.sweep([(channels, length) for length in sizes], artifacts=[folder],
                                  baseline_names=names, state_size=state_size, stop=stop):
            name = label if record.kind == "generated" else record.method
            extra = {"kind": record.kind, "status": record.status, "reason": record.reason,
                     "max_rel_err": record.max_rel_err}
            seconds = (record.time_ms or 0.0) / 1e3
            yield Measurement(name, record.L, record.C, seconds, record.bytes, "cuda", extra)


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
            widgets.HBox([self.sizes, self.sweep_button, self.stop_button]),
            widgets.HBox([self.progress, self.status]),
            self.figure,
        ])
        self.widget.add_class("sw-run-panel")
        self._compiled: Compiled | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.measurements: list[Measurement] = []
        self.last_check: list[dict[str, Any]] = []
        self.run_button.on_click(lambda _b: self.run_and_check())
        self.sweep_button.on_click(lambda _b: self.sweep(wait=False))
        self.stop_button.on_click(lambda _b: self.stop())

    @staticmethod
    def _make_figure() -> Any:
        import plotly.graph_objects as go

        figure = go.FigureWidget()
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
        self._compiled = compiled
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
        self.run_button.disabled = compiled is None
        self.sweep_button.disabled = compiled is None or self.running

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- run and check -----------------------------------------------------------------------
    def run_and_check(self) -> list[dict[str, Any]]:
        """Run once at the chosen size and compare with ``explorer.reference``."""
        import explorer

        compiled = self._compiled
        if compiled is None:
            return []
        try:
            arrays, expected = bounded_inputs(compiled.recurrence, explorer.reference,
                                              self.channels.value, self.length.value,
                                              self.state_size.value,
                                              reverse=compiled.options["reverse"])
            given: dict[str, Any] = {
                **length_argument(compiled.recurrence, self.length.value), **arrays}
            start = time.perf_counter()
            result = compiled(**given)
            seconds = time.perf_counter() - start
            rows = compare(result, expected, compiled.form.outputs)
        except Exception as err:  # noqa: BLE001 - shown in the panel, never raised into the cell
            self.check.value = ("<pre style='color:#a00;white-space:pre-wrap'>"
                                f"{html.escape(type(err).__name__ + ': ' + str(err))}</pre>")
            self.last_check = []
            return []
        self.last_check = rows
        self.check.value = self._check_html(rows, seconds, compiled.device)
        return rows

    @staticmethod
    def passed(rows: list[dict[str, Any]]) -> bool:
        return bool(rows) and all(np.isfinite(r["max_rel"]) and r["max_rel"] <= RELATIVE_TOLERANCE
                                  for r in rows)

    def _check_html(self, rows: list[dict[str, Any]], seconds: float, device: str) -> str:
        ok = self.passed(rows)
        verdict = ("<span style='color:#0a0;font-weight:bold'>PASS</span>" if ok
                   else "<span style='color:#c00;font-weight:bold'>FAIL</span>")
        body = "".join(
            f"<tr><td>{html.escape(r['output'] or 'output')}</td>"
            f"<td>{html.escape(str(r['shape']))}</td>"
            f"<td>{r['max_abs']:.3g}</td><td>{r['max_rel']:.3g}</td></tr>"
            for r in rows
        )
        where = "GPU" if device == "cuda" else "CPU"
        return (f"<div>{verdict} against explorer.reference (float64), tolerance "
                f"{RELATIVE_TOLERANCE:g} relative; one call on the {where} took "
                f"{seconds * 1e3:.2f} ms (includes transfers and the first-call setup)</div>"
                "<table style='border-collapse:collapse' cellpadding='3'>"
                "<tr><th align='left'>output</th><th align='left'>shape</th>"
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
        traces = {trace.name: trace for trace in self.figure.data}
        with self.figure.batch_update():
            if record.name not in traces:
                roofline = record.extra.get("kind") == "roofline"
                self.figure.add_scatter(
                    x=[record.length], y=[record.gigabytes_per_second],
                    mode="lines" if roofline else "lines+markers", name=record.name,
                    line={"dash": "dash", "color": "#555"} if roofline else None)
            else:
                trace = traces[record.name]
                trace.x = (*trace.x, record.length)
                trace.y = (*trace.y, record.gigabytes_per_second)

    def sweep(self, sizes: list[int] | None = None, wait: bool = False) -> None:
        """Time every length in ``sizes`` (default: the slider's range) and plot as points arrive.

        ``wait=False`` (the Sweep button) runs in a background thread; ``wait=True`` returns when
        the sweep is done (for scripts and notebooks run top to bottom).
        """
        compiled = self._compiled
        if compiled is None or self.running:
            return
        if sizes is None:
            low, high = self.sizes.value
            sizes = [s for s in SIZES if low <= s <= high]
        try:
            # build the runner here, on the kernel's thread: on the CPU path that compiles the
            # host module, which must not race with a compile started from the controls
            compiled.runner(compiled.device)
        except Exception as err:  # noqa: BLE001 - shown in the panel, never raised into the cell
            self.status.value = ("<span style='color:#a00'>"
                                 f"{html.escape(type(err).__name__ + ': ' + str(err))}</span>")
            return
        self._stop.clear()
        self.measurements = []
        with self.figure.batch_update():
            self.figure.data = ()
            device = "GPU" if compiled.device == "cuda" else "CPU"
            self.figure.layout.title.text = (f"throughput against L on the {device}, "
                                             f"{self.channels.value} channels")
        self.progress.max = len(sizes)
        self.progress.value = 0
        self.progress.bar_style = "info"
        self.sweep_button.disabled = True
        self.stop_button.disabled = False
        self.status.value = "starting"
        if wait:
            self._sweep(compiled, sizes)
        else:
            self._thread = threading.Thread(target=self._sweep, args=(compiled, sizes),
                                            daemon=True, name="explorer-sweep")
            self._thread.start()

    def _sweep(self, compiled: Compiled, sizes: list[int]) -> None:
        finished = False
        try:
            for record in self._records(compiled, sizes):
                self.measurements.append(record)
                self._add_point(record)
                done = len({m.length for m in self.measurements})
                self.progress.value = min(done, len(sizes))
                if record.extra.get("status", "ok") != "ok":
                    self.status.value = html.escape(
                        f"{record.name}: L={record.length:,}: {record.extra.get('reason')}")
                else:
                    self.status.value = html.escape(
                        f"{record.name}: L={record.length:,}: {record.seconds * 1e3:.3f} ms, "
                        f"{record.gigabytes_per_second:.2f} GB/s")
                if self._stop.is_set():
                    break
            finished = not self._stop.is_set()
        except Exception as err:  # noqa: BLE001 - shown in the panel, never raised into the cell
            self.status.value = ("<span style='color:#a00'>"
                                 f"{html.escape(type(err).__name__ + ': ' + str(err))}</span>")
            self.progress.bar_style = "danger"
            return
        finally:
            self.sweep_button.disabled = False
            self.stop_button.disabled = True
        self.progress.bar_style = "success" if finished else "warning"
        if not finished:
            self.status.value = f"stopped after {len(self.measurements)} measurements"
        else:
            self.status.value = f"done: {len(self.measurements)} measurements"

    def stop(self) -> None:
        """Ask a running sweep to end after the measurement in progress."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background sweep to end."""
        if self._thread is not None:
            self._thread.join(timeout)
