"""The quickstart in Jupyter Notebook 7 (the same server, the /notebooks/ front end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)


def test_explorer_renders_in_notebook_7(lab: str, browser: Any, output_dir: Path) -> None:
    pytest.importorskip("notebook", reason="Jupyter Notebook 7 is not installed")
    context = browser.new_context(viewport={"width": 1300, "height": 1600})
    page = context.new_page()
    try:
        page.goto(lab + "notebooks/quickstart.ipynb", wait_until="domcontentloaded")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
        # wait for the kernel, then run the first code cell (the explorer) with Shift+Enter
        page.wait_for_function(
            "!document.body.innerText.includes('Connecting') && "
            "document.querySelector('.jp-Notebook .jp-CodeCell') !== null", timeout=120_000)
        page.wait_for_timeout(2000)
        page.locator(".jp-Notebook .jp-CodeCell .cm-content").first.click()
        page.keyboard.press("Shift+Enter")
        page.wait_for_selector(".sw-explorer .lm-TabBar-tab", timeout=240_000)
        tabs = page.locator(".sw-explorer .lm-TabBar-tab").all_inner_texts()
        assert {"Recurrence", "MLIR", "PTX", "Run"} <= {t.strip() for t in tabs}
        page.wait_for_selector(".sw-explorer .widget-tab-contents svg", timeout=60_000)
        page.screenshot(path=str(output_dir / "20-notebook7.png"))
    finally:
        context.close()
