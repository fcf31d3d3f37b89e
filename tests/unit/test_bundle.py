"""The saved explorer output: the compile bundle, its HTML fallback and the snapshot file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from explorer.widget import bundle as B

LINES = st.lists(st.sampled_from(["a", "b", "c", "%0 = arith.addf", "}", ""]), max_size=12)


@given(LINES, LINES)
def test_line_edits_rebuild_the_text_after(before: list[str], after: list[str]) -> None:
    old, new = "\n".join(before), "\n".join(after)
    edits = B.line_edits(old, new)
    assert B.apply_edits(old, edits) == new
    assert (edits == []) == (old == new)


@given(LINES, LINES)
def test_diffs_read_from_the_edits_hold_both_texts(before: list[str], after: list[str]) -> None:
    edits = B.line_edits("\n".join(before), "\n".join(after))
    old = "\n".join(before).split("\n")
    whole = B.edits_diff(old, edits, "a", "b", context=10 ** 6).splitlines()
    if not edits:
        assert whole == []
        return
    body = [line for line in whole[2:] if not line.startswith("@@")]
    assert [line[1:] for line in body if line[0] in " -"] == old
    assert [line[1:] for line in body if line[0] in " +"] == "\n".join(after).split("\n")


def test_diffs_read_from_the_edits_are_unified_diffs() -> None:
    from explorer.widget.highlight import unified_diff

    old = "\n".join(f"line {i}" for i in range(40))
    new = old.replace("line 3\n", "line three\n").replace("line 30\n", "")
    edits = B.line_edits(old, new)
    assert B.edits_diff(old.split("\n"), edits, "before", "after") == unified_diff(
        old, new, "before", "after")
    assert len(B.edits_diff(old.split("\n"), edits, "a", "b", limit=5).splitlines()) < 14


def test_measurements_from_the_run_panel_the_bench_and_dicts() -> None:
    from explorer.widget.run import Measurement

    panel = Measurement("compiled blelloch", 1024, 64, 2e-5, 786432, "cuda",
                        {"kind": "generated", "status": "ok"})
    bench = {"method": "copy", "L": 1024, "C": 64, "time_ms": 0.01, "bytes": 786432,
             "kind": "roofline", "status": "ok"}
    records = B.measurement_records([panel, bench])
    assert records is not None
    assert records[0] == {"name": "compiled blelloch", "length": 1024, "channels": 64,
                          "seconds": 2e-5, "bytes": 786432, "device": "cuda",
                          "kind": "generated", "status": "ok"}
    assert records[1]["name"] == "copy" and records[1]["kind"] == "roofline"
    assert records[1]["seconds"] == pytest.approx(1e-5)
    assert B.measurement_records(None) is None
    # a record of `scanweaver bench`, as an object and as its JSON dict
    from explorer.bench.results import Record

    result = Record("torch associative_scan", "baseline", 64, 1024, "ok", time_ms=0.02,
                    gbps=39.3216)
    as_object, as_dict = B.measurement_records([result, result.as_dict()]) or []
    assert as_object["bytes"] == result.bytes and as_object["kind"] == "baseline"
    assert as_dict["bytes"] == result.bytes and as_dict["seconds"] == pytest.approx(2e-5)


def test_plot_draws_a_line_per_method_and_skips_failures() -> None:
    records = [
        {"name": "compiled", "length": 2 ** k, "channels": 4, "seconds": 1e-5, "bytes": 12 * 2 ** k,
         "device": "cpu", "kind": "generated", "status": "ok"} for k in range(6, 10)]
    records.append({"name": "CUB <x>", "length": 64, "channels": 4, "seconds": 0.0, "bytes": 1,
                    "device": "cuda", "kind": "baseline", "status": "skipped"})
    svg = B.plot_svg(records)
    assert svg is not None and svg.startswith("<svg")
    assert svg.count("<polyline") == 1 and "CUB" not in svg
    assert B.plot_svg(records[-1:]) is None


# -- on a real compile ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled() -> Any:
    pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")
    import explorer as ex

    return ex.compile(ex.PRESETS["affine scan"])


@pytest.fixture(scope="module")
def measurements() -> list[dict[str, Any]]:
    return [{"name": "compiled blelloch (CPU)", "length": 2 ** k, "channels": 64,
             "seconds": 1e-6 * 2 ** (k - 6), "bytes": 12 * 64 * 2 ** k, "device": "cpu"}
            for k in range(6, 12)]


def test_record_holds_every_stage_and_pass(compiled: Any, measurements: Any) -> None:
    record = B.compile_record(compiled, measurements)
    json.dumps(record)  # JSON-ready
    assert record["format"] == B.FORMAT
    assert record["recurrence"] == compiled.recurrence.text
    assert [s["name"] for s in record["stages"]] == list(compiled.stages)
    assert [p["name"] for p in record["passes"]] == [p.name for p in compiled.passes]
    assert [p["changed"] for p in record["passes"]] == [p.changed for p in compiled.passes]
    assert record["ptx_info"] == compiled.ptx_info
    assert len(record["measurements"]) == len(measurements)
    # the compiler's term -> lines record, as it is
    if hasattr(compiled, "term_lines"):
        assert record["locations"] == compiled.term_lines()
    # every text comes back exactly, and unchanged passes store no edit
    texts, irs = B._stage_texts(record)
    assert texts == {name: stage.text for name, stage in compiled.stages.items()}
    assert irs == [p.ir for p in compiled.passes]
    for stored, p in zip(record["passes"], compiled.passes):
        if not p.changed:
            assert stored["edits"] == []
    # the IR is stored once: the record is much smaller than the texts it holds
    size = len(json.dumps(record))
    assert size < 0.75 * sum(len(s.text) for s in compiled.stages.values())


def test_terms_say_where_each_located_term_is_written() -> None:
    pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")
    import explorer as ex

    selective = ex.compile(ex.PRESETS["selective scan"])
    record = B.compile_record(selective, graphs=False)
    locations, terms = record["locations"], record["terms"]
    assert locations and {t["term"] for t in terms} == set(locations)
    lines = selective.recurrence.text.split("\n")
    written = {t["term"]: (t["kind"], lines[t["line"] - 1][t["col"]:t["end_col"]]) for t in terms}
    assert written["1:1"] == ("statement", lines[0])
    assert written["2:1"] == ("statement", lines[1])
    assert written["1:61"] == ("name", "x[t]")  # x's first use, with its subscript
    assert written["1:15"] == ("name", "dt[t]")
    assert written["2:33"] == ("name", "D")
    for t in terms:  # the key is where the term starts, columns from 1
        assert t["term"] == f"{t['line']}:{t['col'] + 1}"
    assert B.term_records(selective.recurrence, None) == []
    assert B.term_records(object(), locations) == []  # no statements: no links, no error


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_record_has_the_pictures_as_svg(compiled: Any) -> None:
    graphs = B.compile_record(compiled)["graphs"]
    assert {"recurrence", "plan"} <= set(graphs)
    assert all(svg.startswith("<svg") for svg in graphs.values())


def test_mime_bundle_has_the_record_an_html_fallback_and_text(compiled: Any,
                                                               measurements: Any) -> None:
    bundle = B.mime_bundle(compiled, measurements)
    assert set(bundle) == {B.MIME_TYPE, "text/html", "text/plain"}
    page = bundle["text/html"]
    assert "<script" not in page  # readable where scripts do not run (GitHub, nbviewer)
    assert "ScanWeaver Explorer" in page and "MLIR passes" in page
    assert page.count("<details>") >= len(compiled.passes)
    assert "<polyline" in page  # the timing plot
    assert compiled.passes[0].name in page
    assert "registers / thread" in page
    assert compiled.recurrence.text in bundle["text/plain"]
    saved = B.SavedOutput(compiled, measurements)._repr_mimebundle_()
    assert saved[B.MIME_TYPE]["passes"] == bundle[B.MIME_TYPE]["passes"]


def test_snapshot_is_one_self_contained_file(compiled: Any, measurements: Any,
                                             tmp_path: Path) -> None:
    path = B.snapshot(compiled, tmp_path / "out" / "scan.html", measurements)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    # nothing is loaded from elsewhere: the page's scripts are inline (the record and the view)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"<script[^>]*\ssrc\s*=", page)
    # every line of the PTX is there (the notebook fallback shows the first lines only)
    last_ptx_line = compiled.stages["ptx"].text.strip().splitlines()[-1]
    assert last_ptx_line.strip() in re.sub(r"<[^>]+>", "", page)
    assert "The first" not in page


def test_notebook_record_is_packed_and_built_once(compiled: Any, measurements: Any) -> None:
    first = B.mime_bundle(compiled)
    record = first[B.MIME_TYPE]
    assert record["packed"]["encoding"] == B.PACKING
    assert all("text" not in s for s in record["stages"])
    assert all("edits" not in p for p in record["passes"])
    # everything comes back, as compile_record gives it
    plain = B.compile_record(compiled)
    unpacked = B.unpack(record)
    for key in ("stages", "passes", "locations", "terms", "ptx_info", "pass_input"):
        assert unpacked[key] == plain[key], key
    # packed, the record is a small part of the texts it holds
    texts = sum(len(s.text) for s in compiled.stages.values())
    assert len(json.dumps(record)) < 0.25 * texts
    # built once per compile: a second display costs nothing, and new measurements redo only
    # their own part
    assert B.mime_bundle(compiled) is first
    timed = B.mime_bundle(compiled, measurements)
    assert timed[B.MIME_TYPE]["packed"] is record["packed"]
    assert len(timed[B.MIME_TYPE]["measurements"]) == len(measurements)
    assert "<polyline" in timed["text/html"] and "<polyline" not in first["text/html"]
    assert B.mime_bundle(compiled, list(measurements)) is timed


def test_passes_past_the_budget_keep_no_ir(compiled: Any) -> None:
    # a budget that leaves out a pass and keeps one after it (stored against the last kept)
    for budget in (20_000, 50_000, 100_000, 150_000, 250_000, 400_000):
        record = B.compile_record(compiled, graphs=False, ir_budget=budget)
        if any("base" in p for p in record["passes"]):
            break
    omitted = [p["name"] for p in record["passes"] if "omitted" in p]
    # the lines of the passes left out go with their IR; the others stay as compiled
    located = {name for lines in record["locations"].values() for name in lines}
    assert omitted and not set(omitted) & located
    for term, lines in record["locations"].items():
        assert lines == {code: found for code, found in compiled.term_lines()[term].items()
                         if code not in omitted}
    texts, irs = B._stage_texts(B.pack(record))
    for p, stored, ir in zip(compiled.passes, record["passes"], irs):
        if "omitted" in stored:
            assert ir is None and stored["omitted"]["chars"] == len(p.ir)
        else:
            assert ir == p.ir  # edits against the last IR kept (`base`) rebuild it
    assert any("base" in p for p in record["passes"])
    page = B.report_html(record, full=False)
    assert "IR not saved" in page and "Explorer.snapshot(path) keeps every pass" in page


def test_fallback_cuts_long_lines() -> None:
    text, note = B._clip("short\n" + "x" * 5000, 10)
    assert note == "" and text.startswith("short\n") and text.endswith("(5000 characters)")
    assert len(text) < B.FALLBACK_LINE_CHARS + 50
    assert B._clip("x" * 5000, None) == ("x" * 5000, "")


def test_explorer_displays_its_saved_output_and_writes_a_snapshot(tmp_path: Path) -> None:
    pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")
    import explorer as ex
    from explorer.widget import Explorer

    widget = Explorer(ex.PRESETS["affine scan"])
    data = widget._repr_mimebundle_()
    # the live widget first (JupyterLab ranks it ahead), the saved output beside it
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data[B.MIME_TYPE]["recurrence"] == widget.compiled.recurrence.text
    assert "ScanWeaver Explorer" in data["text/html"]
    path = widget.snapshot(tmp_path / "explorer.html")
    assert "ScanWeaver Explorer" in Path(path).read_text(encoding="utf-8")
