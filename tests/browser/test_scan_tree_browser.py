"""The Scan tree tab in a real JupyterLab and a real (headless) Chromium: it draws the plan read
back from the ``scan-plan`` pass's IR.

A notebook (saved into the server's root through JupyterLab's contents service) opens the
explorer on the selective scan with the Kogge-Stone tree and prints the plan the compiler
recorded. The test then checks what a person sees against that record: the tab says where the
picture comes from and lists the plan's ``scan.sweep`` ops, the picture has one row of nodes per
drawn thread and level, stepping a level names its sweep, choosing 64 threads redraws the tree
over 64 threads (at a readable size, scrolling sideways), long lines of IR scroll inside the tab,
and the MLIR tab at the ``scan-plan`` pass shows the same ops. Screenshots go to
``test-output/browser/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import one_cell_notebook
from tests.browser.test_quickstart_browser import run_all_cells

pytestmark = pytest.mark.timeout(600)

EXPLORER = ".sw-explorer"
NOTEBOOK = "scan_tree.ipynb"
SETUP = """\
import json
import explorer as ex

w = ex.Explorer(ex.PRESETS["selective scan"], strategy="kogge_stone")
w.show_tab("Scan tree")
plan = w.compiled.scan_plan
print("PLAN " + json.dumps({"threads": plan.threads, "tree": plan.tree,
                            "sweeps": [[s.phase, s.stride, s.active] for s in plan.sweeps],
                            "passes": [p.name for p in w.compiled.passes]}))
w
"""


CLEAN_UP_JS = """
async (name) => {
  const app = window.jupyterapp;
  const done = (async () => {
    await app.serviceManager.sessions.shutdownAll();
    for (const panel of Array.from(app.shell.widgets('main'))) {
      if (panel.context) { panel.context.model.dirty = false; }
      panel.dispose();
    }
    await app.serviceManager.contents.delete(name);
  })();
  // never wait on a dialog: the next test resets the workspace anyway
  await Promise.race([done, new Promise((resolve) => setTimeout(resolve, 20000))]);
}
"""


def _put(page: Any, name: str, content: dict[str, Any]) -> None:
    """Save a notebook into the server's root through JupyterLab's own contents service."""
    page.evaluate(
        "async ([name, content]) => { await window.jupyterapp.serviceManager.contents.save("
        "name, {type: 'notebook', format: 'json', content}); }", [name, content])


def open_notebook(page: Any, lab: str, name: str, content: dict[str, Any]) -> None:
    """Save ``content`` as notebook ``name`` into the server's root, open it in JupyterLab and
    run all its cells."""
    page.goto(lab + "lab?reset", wait_until="domcontentloaded")
    page.wait_for_function("window.jupyterapp !== undefined", timeout=120_000)
    page.wait_for_function("window.jupyterapp.serviceManager.isReady", timeout=60_000)
    _put(page, name, content)
    page.goto(lab + f"lab/tree/{name}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
    run_all_cells(page)


def _tab(page: Any, title: str) -> None:
    page.locator(f"{EXPLORER} .lm-TabBar-tab", has_text=title).first.click()


def _panel(page: Any) -> Any:
    return page.locator(f"{EXPLORER} .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)").first


def _changed(page: Any, selector: str, before: str) -> None:
    page.wait_for_function(
        "([sel, before]) => document.querySelector(sel).innerHTML !== before",
        arg=[selector, before], timeout=60_000)


def _fits_in_the_tab(page: Any, selector: str) -> None:
    """Long lines of IR scroll inside their frame: the frame ends inside the tab."""
    right = page.evaluate(
        "(sel) => [document.querySelector('.sw-explorer ' + sel + ' pre')"
        ".getBoundingClientRect().right, document.querySelector('.sw-explorer "
        ".widget-tab-contents').getBoundingClientRect().right]", selector)
    assert right[0] <= right[1], right


@pytest.fixture(scope="module")
def opened(lab: str, browser: Any, output_dir: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The notebook run, the explorer on the Scan tree tab, and the plan it printed."""
    context = browser.new_context(viewport={"width": 1400, "height": 1900})
    page = context.new_page()
    open_notebook(page, lab, NOTEBOOK, one_cell_notebook("scan-tree", SETUP))
    page.wait_for_selector(f"{EXPLORER} .sw-tree-picture svg", timeout=240_000)
    page.wait_for_timeout(1000)
    printed = page.locator(".jp-OutputArea-output", has_text="PLAN ").first.inner_text()
    plan = json.loads(printed.split("PLAN ", 1)[1].strip().splitlines()[0])
    yield page, plan
    # leave the lab as it was: the notebook closed, its kernel shut down, the file gone
    page.evaluate(CLEAN_UP_JS, NOTEBOOK)
    context.close()


def test_the_scan_tree_tab_draws_the_plan_of_the_ir(opened: tuple[Any, dict[str, Any]],
                                                    output_dir: Path) -> None:
    page, plan = opened
    assert plan["tree"] == "kogge_stone" and plan["threads"] == 128
    panel = _panel(page)
    text = panel.inner_text()
    assert "Read from the IR of the scan-plan pass" in text
    assert "kogge_stone" in text and "first 16 of the 128 thread aggregates" in text
    # the plan's ops, as the pass wrote them: one scan.sweep per level of the block's tree
    ops = page.locator(f"{EXPLORER} .sw-tree-ops").inner_text()
    assert ops.count('"scan.sweep"') == len(plan["sweeps"])
    for phase, stride, active in plan["sweeps"]:
        assert f'active = {active} : i64, phase = "{phase}", stride = {stride} : i64' in ops
    # the picture: a row of 16 nodes for the inputs and for each level with a stride below 16
    drawn = [s for s in plan["sweeps"] if s[1] < 16]
    picture = page.locator(f"{EXPLORER} .sw-tree-picture svg").first
    assert picture.locator("g.node").count() == 16 * (len(drawn) + 1)
    assert "kogge_stone: n=16" in (picture.text_content() or "")
    _fits_in_the_tab(page, ".sw-tree-ops")
    page.locator(EXPLORER).screenshot(path=str(output_dir / "11-scan-tree-kogge-stone.png"))

    # stepping: each level names the scan.sweep it draws
    slider = panel.locator(".sw-tree-step .noUi-handle, .sw-tree-step input").first
    slider.focus()
    for _phase, stride, active in drawn:
        before = page.locator(f"{EXPLORER} .sw-tree-picture").inner_html()
        page.keyboard.press("ArrowRight")
        _changed(page, f"{EXPLORER} .sw-tree-picture", before)
        page.wait_for_function(
            "(s) => document.querySelector('.sw-explorer .sw-tree-level').innerText"
            ".includes(s)", arg=f"stride = {stride} : i64", timeout=30_000)
        label = page.locator(f"{EXPLORER} .sw-tree-level").inner_text()
        assert f"{active} threads work at stride {stride}" in label
        steps = page.locator(f"{EXPLORER} .sw-tree-steps").inner_text()
        assert f"0→{stride}" in steps and f"{15 - stride}→15" in steps
    page.locator(EXPLORER).screenshot(path=str(output_dir / "12-scan-tree-last-level.png"))


def test_choosing_64_threads_redraws_the_tree(opened: tuple[Any, dict[str, Any]],
                                              output_dir: Path) -> None:
    page, plan = opened
    _tab(page, "Scan tree")
    select = page.locator(f"{EXPLORER} .sw-tree-drawn select")
    assert select.locator("option").all_inner_texts() == ["2", "4", "8", "16", "32", "64"]
    before = page.locator(f"{EXPLORER} .sw-tree-picture").inner_html()
    select.select_option("64")
    _changed(page, f"{EXPLORER} .sw-tree-picture", before)
    drawn = [s for s in plan["sweeps"] if s[1] < 64]
    picture = page.locator(f"{EXPLORER} .sw-tree-picture svg").first
    assert picture.locator("g.node").count() == 64 * (len(drawn) + 1)
    assert "first 64 of the 128" in _panel(page).inner_text()
    # drawn at its natural size (readable), in a box that scrolls sideways
    sizes = page.evaluate(
        "() => { const box = document.querySelector('.sw-explorer .sw-tree-picture svg')"
        ".parentElement; return [box.scrollWidth, box.clientWidth]; }")
    assert sizes[0] > sizes[1], sizes
    page.locator(EXPLORER).screenshot(path=str(output_dir / "13-scan-tree-64-threads.png"))


def test_the_mlir_tab_at_the_scan_plan_pass_shows_the_same_ops(
        opened: tuple[Any, dict[str, Any]], output_dir: Path) -> None:
    page, plan = opened
    _tab(page, "MLIR")
    select = page.locator(f"{EXPLORER} .sw-pass-selector select")
    select.wait_for(timeout=60_000)
    code = page.locator(f"{EXPLORER} .sw-mlir-code")
    before = code.inner_html()
    select.select_option(index=plan["passes"].index("scan-plan"))
    _changed(page, f"{EXPLORER} .sw-mlir-code", before)
    text = code.inner_text()
    assert text.count('"scan.sweep"') == len(plan["sweeps"])
    assert 'tree = "kogge_stone"' in text
    # the op names are coloured as names, not as strings
    assert code.locator("span.nb", has_text='"scan.sweep"').count() == len(plan["sweeps"])
    _fits_in_the_tab(page, ".sw-mlir-code")
    page.locator(EXPLORER).screenshot(path=str(output_dir / "14-mlir-scan-plan.png"))
