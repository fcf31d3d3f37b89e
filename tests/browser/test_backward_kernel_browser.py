"""The *backward kernel* toggle in a real JupyterLab and a real (headless) Chromium: on the
selective scan (CUDA target) it shows ``compile(text, backward="readouts")``, the fused kernel
the torch operator's backward runs for a loss of the readouts: the derived kernel under the
box, the plan's ``scan.recompute`` and ``scan.adjoint`` ops and the forward's tree in the Scan
tree tab, and the Run tab's buttons off (it runs as the operator's backward). A screenshot goes
to ``test-output/browser/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import one_cell_notebook
from tests.browser.test_scan_tree_browser import CLEAN_UP_JS, EXPLORER, open_notebook

pytestmark = pytest.mark.timeout(600)

NOTEBOOK = "backward_kernel.ipynb"
SETUP = """\
import explorer as ex

w = ex.Explorer(ex.PRESETS["selective scan"], target="cuda")
w.backward.kernel_button.value = True
w.show_tab("Scan tree")
print("ERROR", w.error, w.compiled.options["backward"])
w
"""


def test_the_backward_kernel_toggle_shows_the_fused_kernel(lab: str, browser: Any,
                                                           output_dir: Path) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    page = context.new_page()
    try:
        open_notebook(page, lab, NOTEBOOK, one_cell_notebook("backward-kernel", SETUP))
        page.wait_for_selector(f"{EXPLORER} .sw-tree-ops", timeout=240_000)
        page.wait_for_function(
            "sel => document.querySelector(sel).innerText.includes('scan.recompute')",
            arg=EXPLORER, timeout=240_000)
        page.wait_for_timeout(1500)
        printed = page.locator(".jp-OutputArea-output", has_text="ERROR").first.inner_text()
        assert "ERROR None readouts" in printed
        text = page.locator(EXPLORER).inner_text()
        assert "the fused backward kernel, derived" in text
        assert "scan.adjoint" in text and "tree = \"suffix\"" in text
        assert "grad_A = dt*h[t-1]*lam[t]*exp(A*dt)" in text
        assert page.locator(f"{EXPLORER} .sw-tree-picture svg").count() == 1
        pressed = page.locator(f"{EXPLORER} .sw-backward-kernel")
        assert "mod-active" in (pressed.get_attribute("class") or "")
        page.locator(EXPLORER).screenshot(path=str(output_dir / "42-backward-kernel.png"))
    finally:
        page.evaluate(CLEAN_UP_JS, NOTEBOOK)
        context.close()
