"""The backward toggle in a real JupyterLab and a real (headless) Chromium: the adjoint of the
affine scan, compiled as ``ex.grad(text).compile()`` compiles it, reads the forward's arrays in
place (``read_offsets``), and the person sees it: the options row names the kept option, the
Scan tree tab lists the inputs read at another time, and its IR has one ``scan.read`` per
input. A screenshot goes to ``test-output/browser/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import one_cell_notebook
from tests.browser.test_scan_tree_browser import CLEAN_UP_JS, EXPLORER, _panel, open_notebook

pytestmark = pytest.mark.timeout(600)

NOTEBOOK = "backward_reads.ipynb"
SETUP = """\
import explorer as ex

w = ex.Explorer(ex.PRESETS["affine scan"], target="cpu")
w.backward.button.value = True
w.show_tab("Scan tree")
print("OFFSETS", dict(w.compiled.options["read_offsets"]))
w
"""


def test_the_backward_shows_its_in_place_reads(lab: str, browser: Any,
                                                output_dir: Path) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    page = context.new_page()
    try:
        open_notebook(page, lab, NOTEBOOK, one_cell_notebook("backward-reads", SETUP))
        page.wait_for_selector(f"{EXPLORER} .sw-tree-reads", timeout=240_000)
        page.wait_for_timeout(1000)
        printed = page.locator(".jp-OutputArea-output", has_text="OFFSETS").first.inner_text()
        assert "'a_next': 1" in printed and "'fwd_h_prev': -1" in printed
        # the box holds the adjoint, its readout the gradient of a
        box = page.locator(f"{EXPLORER} textarea").first.input_value()
        assert "grad_sum_a[t] = lam_h[t] * fwd_h_prev[t]" in box
        # the options row says what is kept without a control
        assert "read_offsets" in page.locator(EXPLORER).inner_text()
        # the Scan tree tab: the reads, and the plan's ops with one scan.read each
        reads = page.locator(f"{EXPLORER} .sw-tree-reads").inner_text()
        assert "a_next at t + 1" in reads and "fwd_h_prev at t - 1" in reads
        assert _panel(page).locator(".sw-tree-reads").count() == 1
        ops = page.locator(f"{EXPLORER} .sw-tree-ops").inner_text()
        assert ops.count('"scan.read"') == 2
        page.locator(EXPLORER).screenshot(path=str(output_dir / "40-backward-reads.png"))
    finally:
        page.evaluate(CLEAN_UP_JS, NOTEBOOK)
        context.close()
