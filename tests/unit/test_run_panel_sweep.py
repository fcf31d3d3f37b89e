"""The run panel's sweep against a kernel that is also listening to the browser.

In a notebook the Sweep button starts a background thread, while the kernel's own thread keeps
handling messages from the browser; plotly's front end answers every change of the figure (the
trace and layout deltas), and ipywidgets applies each answer holding the figure's trait
notifications. A change made by another thread inside that window is merged away: plotly's
``_py2js_addTraces`` message is set and reset to None, so only the None is sent and the trace
never reaches the browser (the CI failure of the quickstart's sweep test). The panel now sends
the figure whole, as a new widget's state, at every point. These tests run the
sweep under an event loop the way ipykernel does and check that every widget change is made on
the loop's thread, that no trace is lost, and that the panel says why whenever it does not
sweep.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")
pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")

import explorer as ex  # noqa: E402
from explorer.widget import run  # noqa: E402
from explorer.widget.run import RunPanel  # noqa: E402

AFFINE = ex.PRESETS["affine scan"]


@pytest.fixture(scope="module")
def compiled() -> Any:
    return ex.compile(AFFINE, target="cpu")


def _panel(compiled: Any) -> RunPanel:
    panel = RunPanel()
    panel.set_compiled(compiled)
    panel.channels.value = 4
    return panel


KERNEL_THREAD = "kernel-loop"
REAL_IN_KERNEL = run._in_kernel


@pytest.fixture(autouse=True)
def _a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests play the kernel: the panel takes their loop for the kernel's."""
    monkeypatch.setattr(run, "_in_kernel", lambda: True)


def _run_like_a_kernel(panel: RunPanel, start: Any, answer_browser: bool = True) -> list[str]:
    """Call ``start()`` inside a running event loop (as ipykernel calls a button's handler),
    then keep the loop's thread busy the way the kernel is while a sweep runs: applying the
    front end's answers to the figure, each inside ``hold_trait_notifications``. The loop runs
    in a thread of its own (the test's thread may run another loop: Playwright's). Returns the
    names of the threads that changed the figure."""
    threads: list[str] = []
    add_point = panel._add_point

    def recording(record: Any) -> None:
        threads.append(threading.current_thread().name)
        add_point(record)

    panel._add_point = recording  # type: ignore[method-assign]

    async def kernel() -> None:
        start()
        deadline = time.monotonic() + 120
        while (panel.running or panel.sweep_button.disabled) and time.monotonic() < deadline:
            if answer_browser:
                with panel.figure.hold_trait_notifications():
                    time.sleep(0.002)   # a layout delta being applied
            await asyncio.sleep(0.001)

    failed: list[BaseException] = []

    def loop() -> None:
        try:
            asyncio.run(kernel())
        except BaseException as err:  # noqa: BLE001 - raised again in the test's thread
            failed.append(err)

    thread = threading.Thread(target=loop, name=KERNEL_THREAD)
    thread.start()
    thread.join(180)
    if failed:
        raise failed[0]
    return threads


def test_outside_a_kernel_the_sweep_changes_the_widgets_itself(
        compiled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "_in_kernel", lambda: False)
    panel = _panel(compiled)

    async def start() -> None:   # a loop runs this thread, but it is not a kernel's
        panel.sweep([64, 128], wait=False)

    thread = threading.Thread(target=lambda: asyncio.run(start()))
    thread.start()
    thread.join(60)
    panel.join(120)
    assert "done: 4 measurements" in panel.status.value


def test_a_test_process_is_not_a_kernel() -> None:
    assert REAL_IN_KERNEL() is False


def test_no_trace_is_lost_while_the_kernel_handles_the_browser(compiled: Any) -> None:
    panel = _panel(compiled)
    first = panel.figure
    threads = _run_like_a_kernel(panel, lambda: panel.sweep([64, 128, 256, 512], wait=False))
    assert not panel.running
    names = {m.name for m in panel.measurements}
    assert len(names) == 2, names   # the compiled kernel and the float64 reference
    # the figure in the panel is a new widget holding every point in its state (no delta to
    # lose), and the figures it replaced are closed
    assert panel.figure is not first and first.comm is None
    assert panel.widget.children[-1] is panel.figure
    assert sorted(t.name for t in panel.figure.data) == sorted(names)
    for trace in panel.figure.data:
        assert list(trace.x) == [64, 128, 256, 512]
    assert "on the CPU, 4 channels" in panel.figure.layout.title.text
    # every change of the figure was made on the loop's (the kernel's) thread
    assert threads and set(threads) == {KERNEL_THREAD}
    assert "done: 8 measurements" in panel.status.value
    assert panel.progress.value == 4 and panel.progress.bar_style == "success"
    assert not panel.sweep_button.disabled and panel.stop_button.disabled


def test_stop_from_the_kernel_thread(compiled: Any) -> None:
    panel = _panel(compiled)
    sizes = [2 ** k for k in range(6, 22)]

    def start_then_stop() -> None:
        panel.sweep(sizes, wait=False)
        panel.stop()

    _run_like_a_kernel(panel, start_then_stop, answer_browser=False)
    assert len({m.length for m in panel.measurements}) < len(sizes)
    assert "stopped after" in panel.status.value
    assert panel.progress.bar_style == "warning"


def test_nothing_compiled_says_why() -> None:
    panel = RunPanel()
    panel.sweep([64], wait=True)
    assert "nothing is compiled" in panel.status.value
    assert "sw-sweep-refused" in panel.status.value
    assert panel.run_and_check() == []
    assert "nothing is compiled" in panel.check.value


def test_stop_with_no_sweep_says_so(compiled: Any) -> None:
    panel = _panel(compiled)
    panel.stop()
    assert "no sweep is running" in panel.status.value
    panel.sweep([64], wait=True)
    panel.stop()
    assert "no sweep is running (the last one: done: 2 measurements)" in panel.status.value
    panel.sweep([64], wait=True)   # a stop asked with no sweep running does not stop the next
    assert "done: 2 measurements" in panel.status.value


def test_a_second_sweep_while_one_runs_says_why(compiled: Any) -> None:
    panel = _panel(compiled)
    messages: list[str] = []

    def start_twice() -> None:
        panel.sweep([2 ** k for k in range(10, 22)], wait=False)
        panel.sweep([64], wait=False)
        messages.append(panel.status.value)
        panel.stop()

    _run_like_a_kernel(panel, start_twice, answer_browser=False)
    assert "already running" in messages[0]


def test_an_empty_range_says_why(compiled: Any) -> None:
    panel = _panel(compiled)
    panel.sweep([], wait=True)
    assert "no length" in panel.status.value
    assert panel.measurements == []


def test_the_panel_says_what_the_next_sweep_covers(compiled: Any) -> None:
    panel = _panel(compiled)
    panel.sizes.index = (0, 2)
    assert "L = 64 … 256 (3 lengths) on the CPU" in panel.range_info.value
    panel.sweep(wait=True)
    assert {m.length for m in panel.measurements} == {64, 128, 256}
    assert "done: 6 measurements" in panel.status.value
    # each step said where it was
    assert "(3 of 3 lengths)" in panel.last_progress


def test_a_new_compile_clears_the_check(compiled: Any) -> None:
    panel = _panel(compiled)
    panel.length.value = 64
    rows = panel.run_and_check()
    assert panel.passed(rows) and "PASS" in panel.check.value
    panel.set_compiled(compiled)   # the same compile again: the check still holds
    assert "PASS" in panel.check.value
    panel.set_compiled(ex.compile(ex.PRESETS["affine scan"], target="cpu", block_size=64))
    assert panel.check.value == ""


def test_a_point_says_which_kernel_ran_its_length(compiled: Any) -> None:
    """On the GPU a sweep's records name the kernels each length launched (the short kernel up
    to its longest, then the plain or look-back one): the plot's hover text says so, where the
    line bends."""
    from explorer.widget.measure import Measurement

    panel = _panel(compiled)
    for L, ran in ((4096, ("blelloch_short",)), (8192, ("blelloch_lookback",))):
        panel._add_point(Measurement("compiled blelloch", L, 4, 1e-5, 12 * 4 * L, "cuda",
                                     {"kind": "generated", "status": "ok", "kernels": ran}))
    panel._add_point(Measurement("copy (roofline)", 4096, 4, 1e-5, 12 * 4 * 4096, "cuda",
                                 {"kind": "roofline", "status": "ok"}))
    traces = {t.name: t for t in panel.figure.data}
    assert list(traces["compiled blelloch"].text) == ["ran blelloch_short",
                                                      "ran blelloch_lookback"]
    assert list(traces["copy (roofline)"].text) == [""]
    assert "%{text}" in traces["compiled blelloch"].hovertemplate
