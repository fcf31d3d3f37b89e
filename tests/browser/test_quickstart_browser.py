"""The quickstart notebook in a real JupyterLab and a real (headless) Chromium.

Opens ``quickstart.ipynb``, runs every cell, then checks what a person would see: every stage tab
draws, the scan tree is an SVG, moving the pass selector changes the IR shown (and how long that
takes), a bad recurrence typed into the box shows its error inside the widget, the backward
toggle shows the adjoint recurrence and gives the forward back, and the throughput plot receives
points. Screenshots go to ``test-output/browser/``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)

EXPLORER = ".sw-explorer"
SWITCH_PASS_JS = """
async ([index]) => {
  const root = document.querySelector('.sw-explorer');
  const select = root.querySelector('.sw-pass-selector select');
  const code = root.querySelector('.sw-mlir-code');
  const before = code.innerHTML;
  const start = performance.now();
  const changed = new Promise((resolve) => {
    const observer = new MutationObserver(() => {
      if (code.innerHTML !== before) {
        observer.disconnect();
        requestAnimationFrame(() => resolve(performance.now() - start));
      }
    });
    observer.observe(code, {childList: true, subtree: true, characterData: true});
    setTimeout(() => { observer.disconnect(); resolve(-1); }, 20000);
  });
  select.selectedIndex = index;
  select.dispatchEvent(new Event('change', {bubbles: true}));
  return await changed;
}
"""


KERNEL_IDLE_JS = """
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session
    && panel.sessionContext.session.kernel;
  return Boolean(kernel) && kernel.status === 'idle';
}
"""


def run_all_cells(page: Any) -> None:
    """Run every cell of the open notebook once its kernel is up: asked earlier (while the
    kernel still starts), JupyterLab may queue the request and never run it."""
    page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def _tab(page: Any, title: str) -> None:
    page.locator(f"{EXPLORER} .lm-TabBar-tab", has_text=title).first.click()


def _panel(page: Any) -> Any:
    """The visible panel of the explorer's tabs."""
    return page.locator(f"{EXPLORER} .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)").first


@pytest.fixture(scope="module")
def page(lab: str, browser: Any, output_dir: Path) -> Iterator[Any]:
    """The quickstart notebook, open, with every cell run and the explorer on screen."""
    context = browser.new_context(viewport={"width": 1400, "height": 1900})
    page = context.new_page()
    PAGE_ERRORS.clear()
    page.on("pageerror", lambda err: PAGE_ERRORS.append(f"uncaught {err}"[:400]))
    page.on("console", lambda msg: PAGE_ERRORS.append(f"console: {msg.text}"[:400])
            if msg.type == "error" else None)
    # ?reset: the notebooks another test left open in the lab's workspace stay closed
    page.goto(lab + "lab/tree/quickstart.ipynb?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    run_all_cells(page)
    page.wait_for_selector(EXPLORER, timeout=240_000)
    page.wait_for_selector(f"{EXPLORER} .lm-TabBar-tab", timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(output_dir / "01-quickstart-opened.png"))
    yield page
    context.close()


def test_every_stage_view_draws(page: Any, output_dir: Path) -> None:
    _tab(page, "Recurrence")
    page.wait_for_selector(f"{EXPLORER} .widget-tab-contents svg", timeout=60_000)
    assert _panel(page).locator("svg").count() >= 1
    page.locator(EXPLORER).screenshot(path=str(output_dir / "02-recurrence.png"))

    _tab(page, "Affine")
    # MathJax typesets A_t and b_t
    _panel(page).locator("mjx-container").first.wait_for(timeout=60_000)
    # two typeset blocks (the update with A_t and b_t, then the combine); no raw TeX left over
    assert _panel(page).locator("mjx-container").count() >= 2
    assert "$$" not in _panel(page).inner_text()
    page.locator(EXPLORER).screenshot(path=str(output_dir / "03-affine.png"))

    for title, needle in (("LLVM IR", "define"), ("PTX", ".entry")):
        _tab(page, title)
        code = _panel(page).locator(".sw-hl").first
        code.wait_for(timeout=60_000)
        assert needle in code.inner_text()
        page.locator(EXPLORER).screenshot(
            path=str(output_dir / f"04-{title.lower().replace(' ', '-')}.png"))


def test_scan_tree_is_an_svg(page: Any, output_dir: Path) -> None:
    _tab(page, "Scan tree")
    picture = page.locator(f"{EXPLORER} .sw-tree-picture svg").first
    picture.wait_for(timeout=60_000)
    assert picture.locator("g.node").count() > 4
    assert "blelloch" in _panel(page).inner_text().lower()
    before = page.locator(f"{EXPLORER} .sw-tree-picture").inner_html()
    # step to the first level: the picture highlights it
    slider = _panel(page).locator(".widget-slider .noUi-handle, .widget-slider input").first
    slider.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "(before) => document.querySelector('.sw-explorer .sw-tree-picture').innerHTML !== before",
        arg=before, timeout=30_000)
    assert "up-sweep" in _panel(page).inner_text()
    page.locator(EXPLORER).screenshot(path=str(output_dir / "05-scan-tree.png"))


def test_moving_the_pass_selector_changes_the_ir(page: Any, output_dir: Path) -> None:
    _tab(page, "MLIR")
    select = page.locator(f"{EXPLORER} .sw-pass-selector select")
    select.wait_for(timeout=60_000)
    labels = select.locator("option").all_inner_texts()
    assert len(labels) >= 2, labels
    code = page.locator(f"{EXPLORER} .sw-mlir-code")
    first_text = code.inner_text()
    timings = []
    for index in [len(labels) - 1, 0] * 4:
        elapsed = page.evaluate(SWITCH_PASS_JS, [index])
        assert elapsed >= 0, "the IR did not change after moving the pass selector"
        timings.append(elapsed)
    last = len(labels) - 1
    page.evaluate(SWITCH_PASS_JS, [last])
    assert code.inner_text() != first_text
    print(f"\nswitching a pass in the browser ({len(labels)} passes): median "
          f"{statistics.median(timings):.0f} ms, min {min(timings):.0f} ms, "
          f"max {max(timings):.0f} ms over {len(timings)} switches")
    page.locator(EXPLORER).screenshot(path=str(output_dir / "06-mlir-last-pass.png"))
    # the diff view against the pass before
    page.locator(f"{EXPLORER} .widget-toggle-button", has_text="diff").first.click()
    page.wait_for_function(
        "document.querySelector('.sw-explorer .sw-mlir-code').innerText.includes('@@')"
        " || document.querySelector('.sw-explorer .sw-mlir-code').innerText.includes('nothing')",
        timeout=30_000)
    page.locator(EXPLORER).screenshot(path=str(output_dir / "07-mlir-diff.png"))
    page.locator(f"{EXPLORER} .widget-toggle-button", has_text="IR after").first.click()


def test_a_bad_recurrence_shows_its_error_in_the_widget(page: Any, output_dir: Path) -> None:
    box = page.locator(f"{EXPLORER} .sw-recurrence textarea")
    good = box.input_value()
    # the box sends its value on "change" (continuous_update=False): send it before the click,
    # not on the click's blur, so that the kernel sees the text before the button's message
    box.fill("h[t] = a[t] * h[t-1] + * b[t]")
    box.dispatch_event("change")
    page.locator(f"{EXPLORER} button", has_text="Compile").first.click()
    error = page.locator(f"{EXPLORER} .sw-error")
    error.wait_for(timeout=60_000)
    text = error.inner_text()
    assert "^" in text, text
    assert "Traceback" not in page.locator(".jp-OutputArea").first.inner_text()
    page.locator(EXPLORER).screenshot(path=str(output_dir / "08-bad-recurrence.png"))
    # put the good text back: the error goes away
    box.fill(good)
    box.dispatch_event("change")
    page.locator(f"{EXPLORER} button", has_text="Compile").first.click()
    page.wait_for_function("document.querySelector('.sw-explorer .sw-error') === null",
                           timeout=60_000)


def test_the_backward_toggle_shows_the_adjoint_then_the_forward(page: Any,
                                                               output_dir: Path) -> None:
    box = page.locator(f"{EXPLORER} .sw-recurrence textarea")
    forward = box.input_value()
    toggle = page.locator(f"{EXPLORER} .sw-backward").first
    toggle.click()
    # the box shows the adjoint recurrence (lam_...), compiled backwards in time
    page.wait_for_function(
        "document.querySelector('.sw-explorer .sw-recurrence textarea').value.includes('lam_')",
        timeout=60_000)
    # the stage views show the adjoint's compile (its states are named lam_...)
    _tab(page, "Recurrence")
    page.wait_for_function(
        "document.querySelector('.sw-explorer .widget-tab-contents').innerHTML.includes('lam_')",
        timeout=120_000)
    assert page.locator(f"{EXPLORER} .sw-error").count() == 0
    # the gradient formulas under the box
    assert "dL/d" in page.locator(f"{EXPLORER} .sw-backward-formulas").inner_text()
    page.locator(EXPLORER).screenshot(path=str(output_dir / "08b-backward.png"))
    toggle.click()
    page.wait_for_function(
        "(text) => document.querySelector('.sw-explorer .sw-recurrence textarea').value === text",
        arg=forward, timeout=60_000)
    page.wait_for_function(
        "document.querySelector('.sw-explorer .sw-backward-formulas').innerText.trim() === ''",
        timeout=60_000)


RUN_PANEL_STATE_JS = """
() => {
  const panel = document.querySelector('.sw-explorer .sw-run-panel');
  if (!panel) { return {points: 0, state: 'missing', status: 'no run panel on the page'}; }
  const status = panel.querySelector('.sw-sweep-state');
  const state = status ? [...status.classList].find(
    (c) => c.startsWith('sw-sweep-') && c !== 'sw-sweep-state').slice('sw-sweep-'.length) : null;
  const bar = panel.querySelector('.widget-progress progress, .widget-progress .progress-bar');
  const plot = panel.querySelector('.js-plotly-plot');
  const shell = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const context = shell && shell.sessionContext;
  const kernel = context && context.session && context.session.kernel;
  const check = panel.querySelector('.sw-check-error, table');
  return {
    points: panel.querySelectorAll('.js-plotly-plot .scatterlayer .trace .points path').length,
    state,
    status: status ? status.innerText : '(no status line)',
    progress: !bar ? '(no progress bar)'
      : bar.tagName === 'PROGRESS' ? `${bar.value} of ${bar.max}` : bar.style.width,
    check: check ? check.innerText : '(no check shown)',
    kernel: kernel ? kernel.status : 'no kernel',
    plot: !plot ? 'no plotly plot' : `${(plot.data || []).length} traces in plotly (`
      + (plot.data || []).map((t) => `${t.name}: ${(t.x || []).length} x`).join(', ')
      + `), ${plot.querySelectorAll('.scatterlayer .trace').length} drawn, `
      + `${plot.offsetWidth}x${plot.offsetHeight} px`,
    explorers: document.querySelectorAll('.sw-explorer').length,
  };
}
"""

SWEEP_ENDED_JS = f"""
(points) => {{
  const s = ({RUN_PANEL_STATE_JS})();
  return s.points >= points || ['done', 'stopped', 'error', 'refused', 'missing'].includes(s.state)
    || ['dead', 'autorestarting', 'restarting', 'no kernel'].includes(s.kernel);
}}
"""


def _run_panel_state(page: Any) -> dict[str, Any]:
    return dict(page.evaluate(RUN_PANEL_STATE_JS))


#: errors the page logged (its console and uncaught exceptions), said by :func:`_describe`
PAGE_ERRORS: list[str] = []


def _describe(state: dict[str, Any]) -> str:
    errors = "; ".join(PAGE_ERRORS[-8:]) or "none"
    return (f"sweep {state.get('state')}: status {state.get('status')!r}, progress "
            f"{state.get('progress')}, {state.get('points')} points on the plot "
            f"({state.get('plot')}), {state.get('explorers')} explorer(s) on the page, kernel "
            f"{state.get('kernel')}, check table {state.get('check')!r}; errors in the page: "
            f"{errors}")


STATUS_CHANGED_JS = f"""
(before) => {{
  const s = ({RUN_PANEL_STATE_JS})();
  return s.status !== before || ['dead', 'no kernel'].includes(s.kernel);
}}
"""


def _start_sweep(page: Any) -> None:
    """Press Sweep and wait until the panel's status line leaves what it said before: the
    kernel may be busy with earlier messages, and until it takes the click the status line
    still shows the last sweep's end, which the waits below would take for this one's."""
    before = _run_panel_state(page)["status"]
    page.locator(f"{EXPLORER} .sw-run-panel button", has_text="Sweep").click()
    try:
        page.wait_for_function(STATUS_CHANGED_JS, arg=before, timeout=120_000)
    except Exception as err:  # noqa: BLE001 - the panel's state says more
        raise AssertionError(f"the sweep did not start: {_describe(_run_panel_state(page))}"
                             ) from err


def _wait_for_sweep(page: Any, points: int, timeout_ms: int = 240_000) -> dict[str, Any]:
    """Wait until the plot shows ``points`` points or the sweep has ended (done, stopped, an
    error, refused, or the kernel died), and return what the panel shows; a timeout says the
    same in its message."""
    try:
        page.wait_for_function(SWEEP_ENDED_JS, arg=points, timeout=timeout_ms)
    except Exception as err:  # noqa: BLE001 - the panel's state says more than the timeout
        raise AssertionError(f"the sweep neither plotted {points} points nor ended within "
                             f"{timeout_ms / 1000:.0f} s: {_describe(_run_panel_state(page))}"
                             ) from err
    return _run_panel_state(page)


LENGTHS_IN_STATUS_JS = """
() => {
  const range = document.querySelector('.sw-explorer .sw-run-panel .sw-sweep-range');
  const found = range && /\\((\\d+) lengths?\\)/.exec(range.innerText);
  return found ? Number(found[1]) : -1;
}
"""


def _set_sweep_range(page: Any, lengths: int) -> None:
    """Move the upper handle of 'sweep L' with the keyboard, a step at a time, until the
    kernel says (beside the slider) that the next sweep covers ``lengths`` lengths: the range
    the Sweep button uses is the kernel's, so each step waits for the kernel to have it."""
    panel = page.locator(f"{EXPLORER} .sw-run-panel")
    handle = panel.locator(".widget-hslider .noUi-handle").last
    for _ in range(len(SWEEP_SIZES)):
        now = page.evaluate(LENGTHS_IN_STATUS_JS)
        if now == lengths:
            return
        if now < 0:
            break
        handle.focus()
        page.keyboard.press("ArrowLeft" if now > lengths else "ArrowRight")
        try:
            page.wait_for_function(f"({LENGTHS_IN_STATUS_JS})() !== {now}", timeout=30_000)
        except Exception:  # noqa: BLE001 - said below
            break
    raise AssertionError(f"could not set the sweep to {lengths} lengths: "
                         f"{_describe(_run_panel_state(page))}")


SWEEP_SIZES = [2 ** k for k in range(6, 23)]   # explorer.widget.run.SIZES


def test_the_plot_receives_points(page: Any, output_dir: Path) -> None:
    _tab(page, "Run")
    panel = page.locator(f"{EXPLORER} .sw-run-panel")
    # whatever the test before left running (a compile) ends first
    page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
    panel.locator("button", has_text="Run and check").click()
    page.wait_for_function(
        "/PASS|FAIL/.test(document.querySelector('.sw-explorer .sw-run-panel').innerText)"
        " || document.querySelector('.sw-explorer .sw-run-panel .sw-check-error') !== null",
        timeout=120_000)
    state = _run_panel_state(page)
    assert "PASS" in panel.inner_text(), _describe(state)
    assert "CPU" in panel.inner_text() or "GPU" in panel.inner_text()
    # a short sweep: three lengths from L = 64; on the CPU two methods (the compiled kernel and
    # the float64 reference), so six points
    _set_sweep_range(page, 3)
    _start_sweep(page)
    state = _wait_for_sweep(page, points=3)
    assert state["points"] >= 3 or state["state"] == "done", _describe(state)
    state = _wait_for_sweep(page, points=10 ** 6)   # to its end
    assert state["state"] == "done", _describe(state)
    measured = int(state["status"].split("done: ")[1].split()[0])
    assert measured >= 3, _describe(state)
    if "CPU" in page.locator(f"{EXPLORER} .sw-run-panel").inner_text():
        expected = measured   # every CPU measurement is a point
    else:
        expected = 3          # the GPU's roofline is a line without markers
    try:   # the plot may draw its last points after the status line changed
        page.wait_for_function(
            "(n) => document.querySelectorAll('.sw-explorer .sw-run-panel .js-plotly-plot "
            ".scatterlayer .trace .points path').length >= n", arg=expected, timeout=30_000)
    except Exception as err:  # noqa: BLE001 - the panel's state says more
        raise AssertionError(f"{expected} points expected on the plot: "
                             f"{_describe(_run_panel_state(page))}") from err
    page.locator(EXPLORER).screenshot(path=str(output_dir / "09-run-sweep.png"))


def test_stop_ends_a_sweep(page: Any) -> None:
    panel = page.locator(f"{EXPLORER} .sw-run-panel")
    # L = 64 ... 524,288 (14 lengths), each timed for at least 0.2 s: seconds of work. Stop is
    # pressed as soon as the kernel says the sweep runs (not after its first point: a point
    # reaches the page through the kernel's event loop, which a busy machine may serve late
    # enough for the whole sweep to end first).
    _set_sweep_range(page, 14)
    _start_sweep(page)
    state = _run_panel_state(page)
    assert state["state"] == "running", _describe(state)
    panel.locator("button", has_text="Stop").click()
    page.wait_for_function(SWEEP_ENDED_JS, arg=10 ** 6, timeout=240_000)
    state = _run_panel_state(page)
    assert state["state"] == "stopped", _describe(state)
    assert "stopped after" in state["status"], _describe(state)


def test_switching_passes_of_a_larger_recurrence(page: Any, output_dir: Path) -> None:
    """The Mamba preset: longer IR per pass; the time to switch is printed."""
    page.locator(f"{EXPLORER} .widget-dropdown select").first.select_option(
        label="selective scan")
    page.wait_for_function(
        "document.querySelector('.sw-explorer .sw-recurrence textarea').value.includes('exp(')",
        timeout=60_000)
    _tab(page, "MLIR")
    # the new compile is drawn once the selector is back on the first pass (a new compile
    # starts there; the test before left it on the last) and the IR holds the input dt: text
    # alone could be the old IR's ('dt' is in 'width')
    page.wait_for_function(
        "document.querySelector('.sw-explorer .sw-pass-selector select').selectedIndex === 0"
        " && /%dt\\b|\\bdt\\[/.test(document.querySelector('.sw-explorer .sw-mlir-code')"
        ".innerText)", timeout=120_000)
    select = page.locator(f"{EXPLORER} .sw-pass-selector select")
    count = select.locator("option").count()
    characters = []
    timings = []
    for index in [count - 1, 0] * 4:
        elapsed = page.evaluate(SWITCH_PASS_JS, [index])
        assert elapsed >= 0, "the IR did not change after moving the pass selector"
        timings.append(elapsed)
        characters.append(len(page.locator(f"{EXPLORER} .sw-mlir-code").inner_text()))
    print(f"\nswitching a pass of the selective scan ({count} passes, up to {max(characters):,} "
          f"characters of IR): median {statistics.median(timings):.0f} ms, "
          f"max {max(timings):.0f} ms over {len(timings)} switches")
    page.locator(EXPLORER).screenshot(path=str(output_dir / "10-selective-scan-mlir.png"))
