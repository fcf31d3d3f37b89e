"""The backward toggle on the Mamba preset in a real JupyterLab and a real (headless) Chromium:
the box shows the adjoint as the language spells it (``softplus``, ``sigmoid``: functions of
their own, no ``exp(x) / (exp(x) + 1)``), its gradient of ``dt`` reading the saved states at
their own step (``fwd_h``), the formulas under the toggle say so, and the tile controls show the
adjoint's own tile (``adjoint_options.ADJOINT_TILE``) on the GPU target, and the Affine tab
typesets its readouts without a MathJax error. A screenshot goes to ``test-output/browser/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from explorer.adjoint_options import ADJOINT_TILE
from tests.browser.conftest import one_cell_notebook
from tests.browser.test_scan_tree_browser import CLEAN_UP_JS, EXPLORER, open_notebook

pytestmark = pytest.mark.timeout(600)

NOTEBOOK = "backward_selective.ipynb"
SETUP = """\
import explorer as ex

w = ex.Explorer(ex.PRESETS["Mamba selective scan"])
w.backward.button.value = True
w.show_tab("Affine")
print("ERROR", w.error)
w
"""


def test_the_backward_of_the_mamba_preset_reads_as_its_math(lab: str, browser: Any,
                                                          output_dir: Path) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    page = context.new_page()
    try:
        open_notebook(page, lab, NOTEBOOK, one_cell_notebook("backward-mamba", SETUP))
        page.wait_for_selector(f"{EXPLORER} textarea", timeout=240_000)
        page.wait_for_function(
            "sel => [...document.querySelectorAll(sel + ' textarea')]"
            ".some(t => t.value.includes('lam_h'))", arg=EXPLORER, timeout=240_000)
        page.wait_for_timeout(1500)
        printed = page.locator(".jp-OutputArea-output", has_text="ERROR").first.inner_text()
        assert "ERROR None" in printed
        box = page.locator(f"{EXPLORER} textarea").first.input_value()
        assert "softplus(dt_bias + dt_next[t])" in box and "sigmoid(z[t])" in box
        assert "fwd_h[t, n]" in box and "exp(dt" not in box
        text = page.locator(EXPLORER).inner_text()
        assert "read at their own step: fwd_h[t] = h[t]" in text
        chosen = [s.evaluate("e => e.options[e.selectedIndex] ? e.options[e.selectedIndex].text"
                             " : ''") for s in page.locator(f"{EXPLORER} select").all()]
        assert str(ADJOINT_TILE["block_size"]) in chosen, chosen
        assert str(ADJOINT_TILE["elements_per_thread"]) in chosen, chosen
        # the Affine tab typesets the adjoint's readouts (grad_sum_dt: a name with
        # underscores) without a MathJax error (it showed the TeX source in red)
        page.wait_for_selector(f"{EXPLORER} mjx-container", timeout=60_000)
        errors = page.evaluate("sel => [...document.querySelectorAll(sel + ' mjx-merror')]"
                               ".map(e => e.getAttribute('data-mjx-error'))", EXPLORER)
        assert errors == [], errors
        assert page.locator(EXPLORER).get_by_text("Readouts, computed").count() == 1
        page.locator(EXPLORER).screenshot(path=str(output_dir / "41-backward-selective.png"))
    finally:
        page.evaluate(CLEAN_UP_JS, NOTEBOOK)
        context.close()
