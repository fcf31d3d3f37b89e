"""The HTML snapshot's page and ``scanweaver report --snapshot`` (the browser draws the page in
``tests/browser/test_snapshot_browser.py``).

The page carries the packed record in a JSON script element, the extension's view as an inline
script, and the script-free report in ``<noscript>``; text that would end a script element is
escaped. The command writes it for a recurrence it compiles or a record ``Compiled.dump`` wrote,
with a bench JSON's timings; every wrong combination or path is one line on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from explorer.cli import main
from explorer.widget import bundle as B

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
needs_compiler = pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                                    reason="needs the MLIR bindings")
pytestmark = pytest.mark.timeout(300)   # a FIFO named on the command line must never block


def _record() -> dict[str, Any]:
    return {
        "format": B.FORMAT, "explorer_version": "0", "recurrence": AFFINE,
        "strategy": "blelloch", "target": "cuda", "options": {"chip": "sm_90"},
        "stages": [{"name": "recurrence", "kind": "text", "seconds": 0.0,
                    "text": "a line with </script> and <!-- in it"}],
        "pass_input": None, "passes": [], "ptx_info": None, "graphs": {},
        "measurements": None, "locations": None, "terms": [],
    }


def _elements(page: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}\b[^>]*>(.*?)</{tag}>", page, flags=re.S)


def test_without_the_script_the_page_is_the_static_report() -> None:
    page = B.snapshot_html(_record(), None)
    assert "<script" not in page and "<noscript" not in page
    assert "<div class='sw-report'>" in page
    assert "&lt;/script&gt;" in page


def test_the_record_and_the_script_cannot_end_their_elements() -> None:
    script = 'console.log("</script><script>alert(1)</SCRIPT>");'
    page = B.snapshot_html(_record(), script)
    scripts = _elements(page, "script")
    assert len(scripts) == 2, scripts   # the record, then the view's script
    data, code = scripts
    assert "</" not in data and "<!--" not in data
    assert json.loads(data) == json.loads(json.dumps(B.pack(_record())))
    assert "</script" not in code.lower() and "alert(1)" in code
    assert B.unpack(json.loads(data))["stages"][0]["text"] == _record()["stages"][0]["text"]
    # the static copy, for browsers without scripts (and shown should the view fail)
    assert page.index("<noscript id='sw-static'>") < page.index("<script")
    assert "<div class='sw-report'>" in _elements(page, "noscript")[0]


def test_the_page_uses_the_extension_build_when_there_is_one() -> None:
    script = B.snapshot_script()
    if script is None:
        pytest.skip("the extension was not built here (pip install -e . builds it)")
    assert "sw-snapshot" in script and "<!--" not in script


@needs_compiler
def test_report_snapshot_of_a_recurrence_and_a_record(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    import explorer as ex
    from explorer.bench.results import Record, save_json

    if B.snapshot_script() is None:
        pytest.skip("the extension was not built here (pip install -e . builds it): the page "
                    "then holds the static copy alone")
    save_json(tmp_path / "bench.json", [Record("compiled blelloch", "generated", 64, 2 ** k, "ok",
                                               time_ms=0.01 * k) for k in range(8, 12)])
    out = tmp_path / "out" / "scan.html"
    assert main(["report", str(tmp_path / "bench.json"), "--snapshot", str(out),
                 "--recurrence", AFFINE, "--strategy", "sequential", "--block-size", "64"]) == 0
    said = capsys.readouterr().out
    assert "compiled blelloch" in said   # the table, as before
    assert f"wrote {out} (" in said and "4 timings" in said
    page = out.read_text()
    record = B.unpack(json.loads(_elements(page, "script")[0].replace("<\\/", "</")))
    assert record["strategy"] == "sequential" and record["options"]["block_size"] == 64
    assert [m["length"] for m in record["measurements"]] == [256, 512, 1024, 2048]
    assert {s["name"] for s in record["stages"]} >= {"recurrence", "ptx"}
    assert len(record["passes"]) > 10

    # a record written by Compiled.dump, with no JSON
    compiled = ex.compile(AFFINE)
    dumped = compiled.dump(tmp_path / "scan.json.gz")
    again = tmp_path / "again.html"
    assert main(["report", "--snapshot", str(again), "--record", str(dumped)]) == 0
    assert "timings" not in capsys.readouterr().out
    record = B.unpack(json.loads(_elements(again.read_text(), "script")[0]
                                 .replace("<\\/", "</")))
    assert record["recurrence"] == AFFINE and record["measurements"] is None
    assert len(record["passes"]) == len(compiled.passes)


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    err = capsys.readouterr().err
    assert status not in (0, None), err
    assert err.startswith("scanweaver report: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


@pytest.mark.parametrize("argv, expect", [
    (["report"], "give a JSON file written by scanweaver bench --json, or --snapshot"),
    (["report", "--snapshot", "x.html"], "--snapshot needs the compile to show"),
    (["report", "--recurrence", AFFINE], "--recurrence and --record are for --snapshot"),
    (["report", "--snapshot", "x.html", "--recurrence", AFFINE, "--record", "r"],
     "not allowed with argument"),
    (["report", "--snapshot", "x.html", "--record", "missing.json"], "missing.json"),
    (["report", "--snapshot", "x.html", "--record", "directory"], "is a directory"),
    (["report", "--snapshot", "x.html", "--record", "fifo"], "is a FIFO"),
    (["report", "--snapshot", "x.html", "--record", "text"], "--record text"),
    (["report", "--snapshot", "x.html", "--record", "empty"], "--record empty"),
    (["report", "--snapshot", "directory", "--recurrence", AFFINE], "is a directory, not a file"),
    (["report", "--snapshot", "fifo", "--recurrence", AFFINE], "is a FIFO, not a file"),
    (["report", "--snapshot", "text/x.html", "--recurrence", AFFINE], "is not a directory"),
    (["report", "--snapshot", "x.html", "--recurrence", AFFINE, "--block-size", "3"],
     "block_size must be a power of two"),
    (["report", "--snapshot", "x.html", "--recurrence", "fifo"], "is a FIFO"),
    (["report", "--html", "x.html", "--snapshot", "y.html", "--recurrence", AFFINE],
     "--html and --table write the results of a JSON file"),
])
def test_report_snapshot_errors(argv: list[str], expect: str, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCANWEAVER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "directory").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "text").write_text("x\n")
    (tmp_path / "empty").write_bytes(b"")
    assert expect in _fails(argv, capsys)
    assert not (tmp_path / "x.html").exists() and not (tmp_path / "y.html").exists()
