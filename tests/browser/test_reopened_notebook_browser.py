"""A notebook saved with the live explorer in it, opened again: one copy of the explorer, always.

The explorer's output holds the live widget and, beside it, the compile as saved output
(``application/vnd.scanweaver.compile+json``, drawn by the extension). The notebook is run and
saved in JupyterLab (so it is trusted), then:

* while the widget is live, only the widget shows (the saved view is not drawn under it);
* opened again with a fresh kernel, before any cell runs (the widget's model is gone), the saved
  view shows, not "Error displaying widget: model not found";
* run again, the live widget replaces the saved view;
* opened where no kernel can start, the saved view shows, not "Loading widget...".

Screenshots go to ``test-output/browser/``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import WheelEnv, one_cell_notebook, running_lab
from tests.browser.test_extension_browser import _dismiss_kernel_dialog
from tests.browser.test_quickstart_browser import KERNEL_IDLE_JS, run_all_cells

pytestmark = pytest.mark.timeout(600)

NOTEBOOK = "reopened.ipynb"
MIME_TYPE = "application/vnd.scanweaver.compile+json"
WIDGET_MIME_TYPE = "application/vnd.jupyter.widget-view+json"
SOURCE = 'import explorer as ex\n\nex.Explorer(ex.PRESETS["affine scan"])'

#: what the page shows of the explorer: live widgets, saved views, and the widget manager's
#: placeholders
SHOWN_JS = """
() => {
  const visible = (el) => el.offsetParent !== null && el.getClientRects().length > 0;
  const all = (sel) => [...document.querySelectorAll('.jp-Notebook ' + sel)];
  const outputs = all('.jp-OutputArea-output');
  return {
    live: all('.sw-explorer').filter(visible).length,
    saved: all('.sw-compile').filter(visible).length,
    placeholders: outputs.filter(visible).map((o) => o.innerText.trim())
      .filter((t) => /Error displaying widget|Loading widget/.test(t)),
    outputs: outputs.length,
  };
}
"""


def _shown(page: Any) -> dict[str, Any]:
    return dict(page.evaluate(SHOWN_JS))


def _wait_for(page: Any, condition: str, what: str, timeout: int = 120_000) -> dict[str, Any]:
    """Wait until ``condition`` (JS over the SHOWN_JS record ``s``) holds."""
    try:
        page.wait_for_function(f"() => {{ const s = ({SHOWN_JS})(); return {condition}; }}",
                               timeout=timeout)
    except Exception as err:  # noqa: BLE001 - what is shown says more than the timeout
        raise AssertionError(f"{what}: the page shows {_shown(page)}") from err
    return _shown(page)


def _open(page: Any, url: str) -> None:
    page.goto(url + f"lab/tree/{NOTEBOOK}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)


@pytest.fixture(scope="module")
def saved(lab: str, lab_folder: Path, browser: Any, output_dir: Path
          ) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The notebook run and saved in JupyterLab; the page stays open on it, kernel running."""
    (lab_folder / NOTEBOOK).write_text(json.dumps(one_cell_notebook("explorer", SOURCE)))
    context = browser.new_context(viewport={"width": 1400, "height": 1500})
    page = context.new_page()
    _open(page, lab)
    run_all_cells(page)
    page.wait_for_selector(".sw-explorer .lm-TabBar-tab", timeout=240_000)
    page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(
        "!window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=60_000)
    notebook = json.loads((lab_folder / NOTEBOOK).read_text())
    yield page, notebook
    context.close()


def test_the_saved_file_holds_both(saved: tuple[Any, dict[str, Any]]) -> None:
    _, notebook = saved
    outputs = notebook["cells"][0]["outputs"]
    assert len(outputs) == 1, [list(o.get("data", {})) for o in outputs]
    data = outputs[0]["data"]
    assert {MIME_TYPE, WIDGET_MIME_TYPE, "text/html"} <= set(data), list(data)


def test_live_widget_alone(saved: tuple[Any, dict[str, Any]], output_dir: Path) -> None:
    page, _ = saved
    shown = _wait_for(page, "s.live === 1", "the live explorer is on the page")
    page.wait_for_timeout(1000)   # a saved view drawn late would show by now
    shown = _shown(page)
    assert shown["live"] == 1 and shown["saved"] == 0, shown
    assert not shown["placeholders"], shown
    page.screenshot(path=str(output_dir / "40-live-widget-alone.png"))


def test_reopened_with_a_fresh_kernel(saved: tuple[Any, dict[str, Any]], lab: str,
                                      output_dir: Path) -> None:
    page, _ = saved
    # end the kernel, then open the notebook again: JupyterLab starts a new kernel for it
    page.evaluate("async () => { await window.jupyterapp.serviceManager.sessions"
                  ".shutdownAll(); }")
    _open(page, lab)
    page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
    # saved in this lab, so opened trusted: a live widget could show, were its model there
    assert page.evaluate("window.jupyterapp.shell.currentWidget.content.widgets[0].model"
                         ".trusted") is True
    shown = _wait_for(page, "s.saved === 1", "the saved view shows when the widget's model is "
                                             "gone")
    page.wait_for_timeout(1500)   # the widget manager has answered by now
    shown = _shown(page)
    assert shown["saved"] == 1 and shown["live"] == 0, shown
    assert not shown["placeholders"], shown
    page.screenshot(path=str(output_dir / "41-reopened-fresh-kernel.png"))

    # run it: the live widget takes the saved view's place
    run_all_cells(page)
    shown = _wait_for(page, "s.live === 1 && s.saved === 0",
                      "the live explorer replaces the saved view", timeout=240_000)
    page.wait_for_timeout(1000)
    shown = _shown(page)
    assert shown["live"] == 1 and shown["saved"] == 0, shown
    page.screenshot(path=str(output_dir / "42-reopened-run-again.png"))


def test_reopened_without_a_kernel(saved: tuple[Any, dict[str, Any]], lab_folder: Path,
                                   wheel_env: WheelEnv, browser: Any, output_dir: Path,
                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("no-kernel-root")
    shutil.copy(lab_folder / NOTEBOOK, root / NOTEBOOK)
    with running_lab(wheel_env, root, tmp_path_factory,
                     ["--KernelSpecManager.allowed_kernelspecs=no-kernel-here"]) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1500})
        page = context.new_page()
        try:
            _open(page, url)
            _dismiss_kernel_dialog(page)
            shown = _wait_for(page, "s.saved === 1", "the saved view shows with no kernel")
            page.wait_for_timeout(1500)
            shown = _shown(page)
            assert shown["saved"] == 1 and shown["live"] == 0, shown
            assert not shown["placeholders"], shown
            tabs = page.locator(".sw-compile .sw-tab").all_inner_texts()
            assert {"Recurrence", "MLIR", "PTX", "Timing"} <= {t.strip() for t in tabs}
            page.screenshot(path=str(output_dir / "43-reopened-no-kernel.png"))
        finally:
            context.close()
