"""The HTML snapshot, opened from disk in Chromium: no server, no network.

Two files: ``Explorer.snapshot(path)`` of an explorer that ran a short CPU sweep (its
measurements are the timing plot), and ``scanweaver report --snapshot`` run from the wheel's
environment (so the script the wheel carries draws it) on the selective scan with the timings of
a bench JSON. Each opens with ``file://`` in a browser context that is offline and refuses any
request that is not a file; the extension's view draws it: the stage tabs, the MLIR passes
stepped with prev/next and shown as diffs, the PTX resources, and the timing plot. With scripts
off, the page shows the script-free copy (every stage and pass diff, the plot as SVG).
Screenshots go to ``test-output/browser/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import WheelEnv

pytestmark = pytest.mark.timeout(600)

SWEEP = [64, 128, 256]
TABS = {"Recurrence", "Affine", "Scan tree", "MLIR", "LLVM IR", "PTX", "Timing"}


@pytest.fixture(scope="module")
def explorer_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``Explorer.snapshot`` after a sweep of three lengths on the CPU."""
    pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")
    import explorer as ex

    widget = ex.Explorer(ex.PRESETS["affine scan"])
    widget.run.channels.value = 8
    widget.run.sweep(SWEEP, wait=True)
    assert "done" in widget.run.status.value, widget.run.status.value
    return Path(widget.snapshot(tmp_path_factory.mktemp("snapshot") / "affine.html"))


@pytest.fixture(scope="module")
def cli_snapshot(wheel_env: WheelEnv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``scanweaver report --snapshot`` of the selective scan, with a bench JSON's timings,
    run by the wheel's environment."""
    import explorer as ex
    from explorer.bench.results import Record, save_json

    folder = tmp_path_factory.mktemp("report")
    records = [Record("compiled blelloch", "generated", 4096, 2 ** k, "ok",
                      time_ms=0.002 * 2 ** (k - 10)) for k in range(10, 16)]
    records += [Record("copy (roofline)", "roofline", 4096, 2 ** k, "ok",
                       time_ms=0.001 * 2 ** (k - 10)) for k in range(10, 16)]
    save_json(folder / "bench.json", records, {"gpu": "a GPU of the test"})
    out = folder / "selective.html"
    done = wheel_env.run("-m", "explorer.cli", "report", str(folder / "bench.json"),
                         "--snapshot", str(out), "--recurrence", ex.PRESETS["selective scan"],
                         "--block-size", "64")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"wrote {out}" in done.stdout and "12 timings" in done.stdout, done.stdout
    # the script the wheel carries drew it (the page holds it whole)
    script = wheel_env.run("-c", "from explorer.widget.bundle import SNAPSHOT_SCRIPTS as s; "
                                 "print(s[0].read_text())")
    assert script.returncode == 0, script.stderr[-2000:]
    assert script.stdout.strip()[:200] in out.read_text()
    return out


@pytest.fixture
def offline(browser: Any) -> Iterator[tuple[Any, list[str]]]:
    """A page with no network: offline, and every request that is not a file refused (and
    noted)."""
    context = browser.new_context(viewport={"width": 1300, "height": 1200}, offline=True)
    asked: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            request_route.continue_()
        else:
            asked.append(url)
            request_route.abort()

    context.route("**/*", route)
    try:
        yield context.new_page(), asked
    finally:
        context.close()


def _open(page: Any, path: Path) -> Any:
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(path.as_uri())
    page.wait_for_function(
        "document.querySelector('#sw-snapshot') && document.querySelector('#sw-snapshot')"
        ".dataset.ready", timeout=60_000)
    ready = page.evaluate("document.querySelector('#sw-snapshot').dataset.ready")
    problems = page.locator("#sw-snapshot .sw-error").all_inner_texts()
    assert ready == "true", (ready, errors, problems)
    assert not errors, errors
    return page.locator("#sw-snapshot .sw-compile")


def _tab(page: Any, title: str) -> Any:
    page.locator(f".sw-compile .sw-tab[data-tab='{title}']").click()
    return page.locator(f".sw-compile .sw-panel[data-tab='{title}']")


def _step_passes(page: Any) -> None:
    """Next through the passes until one changed the IR, in diff mode; then the last pass."""
    panel = _tab(page, "MLIR")
    info, code = panel.locator(".sw-pass-info"), panel.locator(".sw-pass-code")
    count = panel.locator(".sw-pass-select option").count() - 1
    assert count >= 10, count
    assert panel.locator(".sw-pass-prev").is_disabled()
    panel.locator(".sw-mode[data-mode='diff']").click()
    for _ in range(count):
        panel.locator(".sw-pass-next").click()
        if code.locator(".sw-diff-add, .sw-diff-del").count():
            break
    assert code.locator(".sw-diff-hunk").count() >= 1, info.inner_text()
    assert info.inner_text().startswith("pass ") and f" of {count}:" in info.inner_text()
    panel.locator(".sw-mode[data-mode='ir']").click()
    panel.locator(".sw-pass-select").select_option(str(count - 1))
    assert info.inner_text().startswith(f"pass {count} of {count}:")
    assert panel.locator(".sw-pass-next").is_disabled()
    assert code.locator(".sw-t-keyword").count() > 10


def _timing(page: Any, measurements: int) -> Any:
    panel = _tab(page, "Timing")
    plot = panel.locator("img.sw-graph")
    plot.wait_for(timeout=30_000)
    assert page.evaluate("(img) => img.complete && img.naturalWidth", plot.element_handle()) >= 600
    assert panel.inner_text().startswith(f"{measurements} measurements on "), panel.inner_text()
    assert panel.locator("table.sw-pass-times tr").count() > 10
    return panel


def test_explorer_snapshot_opens_from_disk(explorer_snapshot: Path, offline: Any,
                                           output_dir: Path) -> None:
    page, asked = offline
    view = _open(page, explorer_snapshot)
    tabs = {t.strip() for t in view.locator(".sw-tab").all_inner_texts()}
    assert TABS <= tabs, tabs
    assert "h[t] = a[t] * h[t-1] + b[t]" in view.locator(".sw-header").inner_text()
    graph = _tab(page, "Recurrence").locator("img.sw-graph")
    assert page.evaluate("(img) => img.complete && img.naturalWidth", graph.element_handle()) > 0
    view.screenshot(path=str(output_dir / "44-snapshot-recurrence.png"))
    _step_passes(page)
    view.screenshot(path=str(output_dir / "45-snapshot-last-pass.png"))
    ptx = _tab(page, "PTX")
    assert ".entry" in ptx.locator("pre.sw-code").inner_text()
    assert ptx.locator(".sw-ptx-info").inner_text().strip()   # resources, or why there are none
    panel = _timing(page, 2 * len(SWEEP))   # the compiled kernel and the float64 reference
    assert "on cpu" in panel.inner_text()
    panel.locator("img.sw-graph").scroll_into_view_if_needed()
    view.screenshot(path=str(output_dir / "46-snapshot-timing.png"))
    assert asked == [], asked


def test_report_snapshot_from_the_wheel(cli_snapshot: Path, offline: Any,
                                        output_dir: Path) -> None:
    page, asked = offline
    view = _open(page, cli_snapshot)
    assert "h[t, n] = exp(dt[t] * A[n])" in view.locator(".sw-header").inner_text()
    assert "block_size 64" in view.locator(".sw-facts").inner_text()
    assert TABS <= {t.strip() for t in view.locator(".sw-tab").all_inner_texts()}
    _step_passes(page)
    panel = _timing(page, 12)
    assert "on cuda" in panel.inner_text()
    view.screenshot(path=str(output_dir / "47-report-snapshot-timing.png"))
    assert asked == [], asked


def test_a_snapshot_without_scripts_shows_its_static_copy(explorer_snapshot: Path,
                                                          browser: Any) -> None:
    context = browser.new_context(java_script_enabled=False, offline=True)
    try:
        page = context.new_page()
        page.goto(explorer_snapshot.as_uri())
        report = page.locator(".sw-report")
        assert report.locator("h2").inner_text() == "ScanWeaver Explorer"
        assert report.locator("details").count() > 10   # a diff per pass
        assert report.locator("polyline").count() == 2  # the timing plot's two methods
        record = json.loads(page.locator("#sw-record").text_content()
                            .replace("<\\/", "</"))
        assert record["format"] == "scanweaver-compile/2"
        assert len(record["measurements"]) == 2 * len(SWEEP)
    finally:
        context.close()
