"""Explorer output that outlives the kernel: a mime bundle, and a self-contained HTML snapshot.

The compiled result is written as ``application/vnd.scanweaver.compile+json`` (every stage, the
pass list with names, times and whether each changed the IR, the ptxas resources, the pictures of
the recurrence and the plan as SVG, the last run's measurements). The JupyterLab extension in
``extensions/scanweaver`` renders it read-only (tabs, pass stepping, diffs, the timing plot) in a
saved notebook opened with no kernel. A ``text/html`` fallback beside it stays readable where the
extension is absent (GitHub, nbviewer). :func:`snapshot` writes one HTML file holding the record,
the extension's view of it as an inline script (built with the extension: ``snapshot.js``), and
the script-free report as its ``<noscript>`` copy; it opens from disk with no server.

The bundle's layout (``format`` ``scanweaver-compile/2``; the extension's ``src/bundle.ts`` reads
it)::

    recurrence, strategy, target, options, explorer_version
    stages:   [{name, kind, seconds, text} | {name, kind, seconds, pass: i}]
    pass_input: the stage the passes start from
    passes:   [{name, seconds, changed, pipeline, edits: [[keep, drop, [inserted lines]], ...],
                base?: j} | {name, seconds, changed, pipeline, omitted: {lines, chars}}]
    ptx_info, graphs: {stage name: svg}, measurements: [{name, length, channels, seconds, bytes,
    device, kind, status}] | null,
    locations: {term "line:col": {pass name | "ptx": [line, ...]}} | null   (lines from 0)
    terms:    [{term "line:col", kind: statement | name, name, line, col, end_col}]
              (where each located term stands in the recurrence text: line from 1, columns
              from 0, end exclusive)
    packed?:  {encoding: "gzip+base64", data}: the stages' texts and the passes' edits, moved
              out of the records above into one compressed JSON {stages: {name: text},
              edits: [edits | null per pass]}

The IR after each pass is stored as line edits against the IR before it (or, after a pass whose IR
was left out, against the IR of pass ``base``), and a stage whose text is a pass's IR names the
pass. In a notebook (:func:`mime_bundle`) the texts are packed, which makes the record about a
twelfth of the texts it holds, and the IR of passes past :data:`PASS_IR_BUDGET` is left out (the
passes that carry locations are always kept); :func:`snapshot` keeps everything. The mime bundle
of a compile is built once and cached (:class:`SavedRecord`); new measurements only redo their
own part. ``locations`` is the compiler's own record (``Compiled.term_lines``), stored as it is,
for linking each recurrence term to the lines it became; ``terms`` says where each of its terms
is written (the parser's spans), so the extension marks exactly those characters.
"""

from __future__ import annotations

import base64
import difflib
import functools
import gzip
import html
import json
import math
import os
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from explorer import __version__

MIME_TYPE = "application/vnd.scanweaver.compile+json"
FORMAT = "scanweaver-compile/2"
PACKING = "gzip+base64"

#: lines of each code block in the in-notebook HTML fallback (the snapshot keeps every line)
FALLBACK_LINES = 100
#: lines of each pass's diff in the in-notebook HTML fallback
FALLBACK_DIFF_LINES = 30
#: characters of one line in the in-notebook HTML fallback (the gpu.binary op holds the whole
#: PTX in one line of about 100 kB)
FALLBACK_LINE_CHARS = 300
#: characters of pass IR (the lines each pass's edits insert, before packing) a notebook's saved
#: output keeps; passes past it keep their name, time and size but not their IR. The presets'
#: pipelines insert 1.2-1.5 MB (about 0.2 MB packed), so they keep every pass; a recurrence
#: whose IR is ten times larger keeps its first passes and those with locations.
PASS_IR_BUDGET = 4_000_000

Edit = list[Any]  # [keep, drop, inserted lines]


# ------------------------------------------------------------------------------------------------
# the record
# ------------------------------------------------------------------------------------------------
def line_edits(before: str, after: str) -> list[Edit]:
    """Edits that take the lines of ``before`` to those of ``after``: ``[keep, drop, insert]``
    (copy ``keep`` lines, skip ``drop``, insert the lines ``insert``); the rest is kept."""
    if before == after:
        return []
    old, new = before.split("\n"), after.split("\n")
    # the common head and tail need no matching (passes often change one region)
    head, shortest = 0, min(len(old), len(new))
    while head < shortest and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < shortest - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    edits: list[Edit] = []
    position = 0
    matcher = difflib.SequenceMatcher(None, old[head:len(old) - tail], new[head:len(new) - tail],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        edits.append([head + i1 - position, i2 - i1, new[head + j1:head + j2]])
        position = head + i2
    return edits


def apply_edits(before: str, edits: Sequence[Edit]) -> str:
    """The text after a pass, from the text before it and the pass's edits."""
    old = before.split("\n")
    out: list[str] = []
    position = 0
    for keep, drop, insert in edits:
        out.extend(old[position:position + keep])
        position += keep + drop
        out.extend(insert)
    out.extend(old[position:])
    return "\n".join(out)


def _pass_stages(stages: Sequence[Any], passes: Sequence[Any]) -> dict[int, int]:
    """Stage index -> pass index, for the stages that hold a pass's IR (matched in order)."""
    found: dict[int, int] = {}
    next_pass = 0
    for index, stage in enumerate(stages):
        for j in range(next_pass, len(passes)):
            if passes[j].ir is stage.text or passes[j].ir == stage.text:
                found[index] = j
                next_pass = j + 1
                break
    return found


def measurement_records(measurements: Iterable[Any] | None) -> list[dict[str, Any]] | None:
    """Measurements as plain records, from the run panel's ``Measurement`` objects, the bench's
    records (``method``, ``L``, ``C``, ``time_ms``) or dicts of either."""
    if measurements is None:
        return None
    out = []
    for m in measurements:
        get = m.get if isinstance(m, dict) else (lambda key, default=None, _m=m:
                                                 getattr(_m, key, default))
        extra = get("extra", None) or {}
        seconds = get("seconds", None)
        time_ms = get("time_ms", None)
        if seconds is None and time_ms is not None:
            seconds = float(time_ms) / 1e3
        kind = get("kind", None) or extra.get("kind") or "generated"
        moved = get("bytes_moved", None) or get("bytes", None)
        rate = get("gbps", None)
        if not moved and rate and seconds:
            moved = round(float(rate) * 1e9 * float(seconds))  # a bench record's dict
        out.append({
            "name": str(get("name", None) or get("method", None) or kind),
            "length": int(get("length", None) or get("L", 0) or 0),
            "channels": int(get("channels", None) or get("C", 0) or 0),
            "seconds": float(seconds or 0.0),
            "bytes": int(moved or 0),
            "device": str(get("device", None) or "cuda"),
            "kind": str(kind),
            "status": str(get("status", None) or extra.get("status") or "ok"),
        })
    return out


@functools.lru_cache(maxsize=64)
def _svg(dot: str) -> str | None:
    """``dot`` as SVG (kept: a compile shown twice draws its pictures once); None when it does
    not parse. Raises GraphvizUnavailable without ``dot``."""
    from explorer.widget.graphs import dot_to_svg

    try:
        return dot_to_svg(dot)
    except ValueError:
        return None


def _graphs(compiled: Any) -> dict[str, str]:
    """SVG pictures: the recorded graphs of the stages and the affine form's transition graph
    (none when Graphviz's ``dot`` is missing). Each ``dot`` runs in its own process, at once."""
    from explorer.widget.graphs import GraphvizUnavailable, dependence_dot

    sources: dict[str, str] = {name: stage.dot for name, stage in compiled.stages.items()
                               if getattr(stage, "dot", None)}
    form = getattr(compiled, "form", None)
    if form is not None and "affine" in compiled.stages:
        try:
            sources["affine"] = dependence_dot(form)
        except Exception:  # noqa: BLE001 - a picture is decoration; the text stays
            pass
    if not sources:
        return {}
    try:
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            drawn = dict(zip(sources, pool.map(_svg, sources.values())))
    except GraphvizUnavailable:
        return {}
    return {name: svg for name, svg in drawn.items() if svg is not None}


def _pass_records(compiled: Any, pass_input: str | None, locations: dict[str, Any] | None,
                  ir_budget: int | None) -> list[dict[str, Any]]:
    """A record per pass: its IR as edits against the last IR kept, or, past ``ir_budget``
    characters of inserted lines, left out (the passes that carry locations are always kept)."""
    located = {name for record in (locations or {}).values() for name in record}
    kept = compiled.stages[pass_input].text if pass_input else ""
    base = -1  # the pass whose IR is ``kept`` (-1: the input)
    spent = 0
    out = []
    for index, p in enumerate(compiled.passes):
        record: dict[str, Any] = {"name": p.name, "seconds": float(p.seconds or 0.0),
                                  "changed": bool(p.changed),
                                  "pipeline": getattr(p, "pipeline", "")}
        edits = line_edits(kept, p.ir)
        cost = sum(len(line) + 1 for _, _, insert in edits for line in insert)
        if (ir_budget is not None and edits and spent + cost > ir_budget
                and p.name not in located):
            record["omitted"] = {"lines": p.ir.count("\n") + 1, "chars": len(p.ir)}
        else:
            record["edits"] = edits
            if base != index - 1:
                record["base"] = base
            spent += cost
            kept, base = p.ir, index
        out.append(record)
    return out


def compile_record(compiled: Any, measurements: Iterable[Any] | None = None,
                   graphs: bool = True, ir_budget: int | None = None,
                   ptx_info: Any = None) -> dict[str, Any]:
    """The ``application/vnd.scanweaver.compile+json`` record of ``compiled`` (JSON-ready, texts
    not packed). ``ir_budget``: characters of pass IR to keep (None: all). ``ptx_info``: a
    function giving the ptxas report, for a caller that computes it elsewhere."""
    stages = list(compiled.stages.values())
    passes = list(compiled.passes)
    by_stage = _pass_stages(stages, passes)
    pass_input = None
    if by_stage:
        first = min(by_stage)
        if first > 0 and (first - 1) not in by_stage:
            pass_input = stages[first - 1].name
    stage_records = []
    for index, stage in enumerate(stages):
        record: dict[str, Any] = {"name": stage.name, "kind": getattr(stage, "kind", "text"),
                                  "seconds": float(stage.seconds or 0.0)}
        if index in by_stage:
            record["pass"] = by_stage[index]
        else:
            record["text"] = stage.text
        stage_records.append(record)
    locations = _locations(compiled)
    pass_records = _pass_records(compiled, pass_input, locations, ir_budget)
    pictures = _graphs(compiled) if graphs else {}
    return {
        "format": FORMAT,
        "explorer_version": __version__,
        "recurrence": compiled.recurrence.text,
        "strategy": compiled.strategy,
        "target": compiled.target,
        "options": dict(compiled.options),
        "stages": stage_records,
        "pass_input": pass_input,
        "passes": pass_records,
        "ptx_info": ptx_info() if ptx_info is not None else compiled.ptx_info,
        "graphs": pictures,
        "measurements": measurement_records(measurements),
        "locations": locations,
        "terms": term_records(compiled.recurrence, locations),
    }


def pack(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its stage texts and pass edits moved into one compressed ``packed``
    field (IR compresses about ten to one)."""
    stages = {s["name"]: s["text"] for s in record["stages"] if "text" in s}
    edits = [p.get("edits") for p in record["passes"]]
    payload = json.dumps({"stages": stages, "edits": edits}, separators=(",", ":"))
    data = base64.b64encode(gzip.compress(payload.encode("utf-8"), compresslevel=6, mtime=0))
    out = dict(record)
    out["stages"] = [{k: v for k, v in s.items() if k != "text"} for s in record["stages"]]
    out["passes"] = [{k: v for k, v in p.items() if k != "edits"} for p in record["passes"]]
    out["packed"] = {"encoding": PACKING, "data": data.decode("ascii")}
    return out


def unpack(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its texts back in place (a record that is not packed is returned as it
    is)."""
    packed = record.get("packed")
    if not packed:
        return record
    if packed.get("encoding") != PACKING:
        raise ValueError(f"unknown packing {packed.get('encoding')!r}")
    payload = json.loads(gzip.decompress(base64.b64decode(packed["data"])).decode("utf-8"))
    out = {k: v for k, v in record.items() if k != "packed"}
    texts, edits = payload["stages"], payload["edits"]
    out["stages"] = [{**s, "text": texts[s["name"]]} if s["name"] in texts else dict(s)
                     for s in record["stages"]]
    out["passes"] = [{**p, "edits": e} if e is not None else dict(p)
                     for p, e in zip(record["passes"], edits)]
    return out


def _locations(compiled: Any) -> dict[str, dict[str, list[int]]] | None:
    """The compiler's term -> lines record, where the compile has one."""
    term_lines = getattr(compiled, "term_lines", None)
    if not callable(term_lines):
        return None
    try:
        record: dict[str, dict[str, list[int]]] = term_lines()
    except Exception:  # noqa: BLE001 - the links are extra; the stages stay
        return None
    return record


def term_records(recurrence: Any, locations: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Where each term of ``locations`` is written in the recurrence: a statement (its whole
    span) or a name's first use (the name and its subscript), from the parser's spans. Terms
    the record does not name are left out."""
    if not locations:
        return []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(kind: str, name: str, span: Any) -> None:
        key = f"{span.line}:{span.col + 1}"  # columns from 1, as the locations count them
        if key in locations and key not in seen:
            seen.add(key)
            out.append({"term": key, "kind": kind, "name": name, "line": span.line,
                        "col": span.col, "end_col": span.end_col})

    try:
        from explorer.frontend.recurrence import Ref, walk

        for statement in recurrence.statements:  # statements first: they own their column
            add("statement", statement.target, statement.span)
        for statement in recurrence.statements:
            for node in walk(statement.expr):
                if isinstance(node, Ref):
                    add("name", node.name, node.span)
    except (AttributeError, TypeError):  # a recurrence without spans: the links stay off
        return []
    return out


class SavedRecord:
    """The saved output of one compile, built once: the packed record and the HTML fallback
    without timings. :meth:`mime_bundle` adds the measurements (and their part of the HTML),
    again only when they changed. ptxas (for the PTX resources) runs while the rest is built."""

    def __init__(self, compiled: Any) -> None:
        report: dict[str, Any] = {}
        # ptxas is a process of its own: let it run while Python builds the record
        worker = threading.Thread(target=self._ptx_info, args=(compiled, report), daemon=True)
        worker.start()

        record = compile_record(compiled, None, ir_budget=PASS_IR_BUDGET,
                                ptx_info=lambda: None)
        self.summary = (f"ScanWeaver Explorer: {record['recurrence']} ({record['strategy']}, "
                        f"{record['target']}; {len(record['stages'])} stages, "
                        f"{len(record['passes'])} MLIR passes)")
        body = _report_body(record, full=False, ptx_later=True)
        worker.join()
        if "error" in report:
            raise report["error"]
        record["ptx_info"] = report.get("info")
        self.html_body = body.replace(_PTX_MARK, _ptx_info_html(record), 1)
        self.record = pack(record)
        self._last: tuple[str, dict[str, Any]] | None = None

    @staticmethod
    def _ptx_info(compiled: Any, report: dict[str, Any]) -> None:
        try:
            report["info"] = compiled.ptx_info
        except BaseException as err:  # noqa: BLE001 - raised again by the thread that waits
            report["error"] = err

    def mime_bundle(self, measurements: Iterable[Any] | None = None) -> dict[str, Any]:
        records = measurement_records(measurements)
        key = json.dumps(records, sort_keys=True)
        if self._last is None or self._last[0] != key:
            bundle = {
                MIME_TYPE: {**self.record, "measurements": records},
                "text/html": self.html_body + _timing_html(records or []) + "</div>",
                "text/plain": self.summary,
            }
            self._last = (key, bundle)
        return self._last[1]


#: SavedRecord of each compile still alive, by id (compiled results are not hashable)
_SAVED: dict[int, tuple[weakref.ref[Any], SavedRecord]] = {}
_SAVED_LOCK = threading.RLock()


def saved_record(compiled: Any) -> SavedRecord:
    """The :class:`SavedRecord` of ``compiled``, built on first use and kept while it lives."""
    key = id(compiled)
    with _SAVED_LOCK:
        entry = _SAVED.get(key)
        if entry is not None and entry[0]() is compiled:
            return entry[1]
    saved = SavedRecord(compiled)

    def forget(dead: weakref.ref[Any]) -> None:
        with _SAVED_LOCK:
            if key in _SAVED and _SAVED[key][0] is dead:
                del _SAVED[key]

    try:
        ref = weakref.ref(compiled, forget)
    except TypeError:  # not weakly referable: not kept
        return saved
    with _SAVED_LOCK:
        _SAVED[key] = (ref, saved)
    return saved


def mime_bundle(compiled: Any, measurements: Iterable[Any] | None = None) -> dict[str, Any]:
    """The mime bundle a notebook stores: the packed record, an HTML fallback and a line of text
    (built once per compile: see :class:`SavedRecord`)."""
    return saved_record(compiled).mime_bundle(measurements)


class SavedOutput:
    """Shows a compile in a notebook as the mime bundle (``display(SavedOutput(c))``)."""

    def __init__(self, compiled: Any, measurements: Iterable[Any] | None = None) -> None:
        self.compiled = compiled
        self.measurements = list(measurements) if measurements is not None else None

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return mime_bundle(self.compiled, self.measurements)


# ------------------------------------------------------------------------------------------------
# HTML: the fallback and the snapshot
# ------------------------------------------------------------------------------------------------
# Highlighting for HTML uses explorer.widget.highlight, whose MLIR lexer we keep over the
# mlir-pygments package (1.0.0): on our pipeline's IR that lexer emits error tokens for result
# numbers (`%0#1`, which scf and gpu ops print), splits every op name into three tokens
# (dialect, dot, name) and marks each bracket as punctuation, which makes the HTML of the same IR
# about 40% larger (1.37 MB against 0.96 MB for one input module) at the same lexing speed; ours
# has no error token on any stage the pipeline prints, and needs no extra dependency.
_LANGUAGE = {"mlir": "mlir", "llvm": "llvm", "ptx": "ptx"}
_TITLES = {"recurrence": "Recurrence", "affine": "Affine form", "plan": "Scan plan",
           "llvm": "LLVM IR", "ptx": "PTX"}
_CSS = """
.sw-report { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif;
  font-size: 13px; color: #222; max-width: 1100px; }
.sw-report h2 { font-size: 17px; margin: 4px 0; }
.sw-report h3 { font-size: 14px; margin: 14px 0 4px; }
.sw-report .sw-facts, .sw-report .sw-note { color: #666; }
.sw-report details { margin: 4px 0; }
.sw-report summary { cursor: pointer; }
.sw-report table { border-collapse: collapse; }
.sw-report td, .sw-report th { padding: 1px 12px 1px 0; text-align: left; }
.sw-report .sw-graph svg { max-width: 100%; height: auto; }
.sw-report .sw-badge { display: inline-block; margin: 2px 6px 2px 0; padding: 1px 8px;
  border-radius: 10px; background: #eef4ff; }
"""


def seconds_text(seconds: float | None) -> str:
    """A duration for people: µs, ms or s (``-`` when unknown)."""
    if not seconds:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _clip(text: str, lines: int | None) -> tuple[str, str]:
    """The first ``lines`` lines of ``text``, each cut at :data:`FALLBACK_LINE_CHARS`
    characters, and a note saying what was left out."""
    if lines is None:
        return text, ""
    all_lines = text.split("\n")
    shown = [line if len(line) <= FALLBACK_LINE_CHARS else
             f"{line[:FALLBACK_LINE_CHARS]} … ({len(line)} characters)"
             for line in all_lines[:lines]]
    if len(all_lines) <= lines:
        return "\n".join(shown), ""
    note = (f"<div class='sw-note'>The first {lines} of {len(all_lines)} lines; the saved output "
            "(with the JupyterLab extension) and the snapshot file hold all of them.</div>")
    return "\n".join(shown), note


def _code(text: str, language: str | None, lines: int | None) -> str:
    from explorer.widget.highlight import highlight, plain_html

    shown, note = _clip(text, lines)
    body = highlight(shown, language) if language else plain_html(shown)
    return body + note


def edits_diff(before: Sequence[str], edits: Sequence[Edit], before_name: str,
               after_name: str, context: int = 3, limit: int | None = None) -> str:
    """The unified diff that ``edits`` make to the lines ``before``, read from the edits (no diff
    is computed again; the extension's ``src/diff.ts`` does the same). ``limit``: stop after
    about that many lines. Empty when the edits change nothing."""
    changes = []  # (start in before, lines dropped, lines inserted)
    position = 0
    for keep, drop, insert in edits:
        position += keep
        if drop or insert:
            changes.append((position, drop, insert))
        position += drop
    out = [f"--- {before_name}", f"+++ {after_name}"] if changes else []
    shift = 0  # lines after minus lines before, up to the hunk
    i = 0
    while i < len(changes) and (limit is None or len(out) < limit):
        j = i
        while (j + 1 < len(changes)
               and changes[j + 1][0] - (changes[j][0] + changes[j][1]) <= 2 * context):
            j += 1
        old_from = max(0, changes[i][0] - context)
        old_to = min(len(before), changes[j][0] + changes[j][1] + context)
        body: list[str] = []
        cursor = old_from
        added = removed = 0
        for start, drop, insert in changes[i:j + 1]:
            body += [" " + line for line in before[cursor:start]]
            body += ["-" + line for line in before[start:start + drop]]
            body += ["+" + line for line in insert]
            cursor = start + drop
            added, removed = added + len(insert), removed + drop
        body += [" " + line for line in before[cursor:old_to]]
        old_count = old_to - old_from
        new_count = old_count + added - removed
        out.append(f"@@ -{old_from + 1},{old_count} +{old_from + shift + 1},{new_count} @@")
        out += body
        shift += added - removed
        i = j + 1
    return "".join(line + "\n" for line in out)


def _stage_texts(record: dict[str, Any]) -> tuple[dict[str, str], list[str | None]]:
    """Every stage's text and the IR after each pass (None where it was left out), decoded from
    the record."""
    record = unpack(record)
    texts = {s["name"]: s["text"] for s in record["stages"] if "text" in s}
    start = texts.get(record.get("pass_input") or "", "")
    irs: list[str | None] = []
    for index, p in enumerate(record["passes"]):
        base = p.get("base", index - 1)
        before = start if base < 0 else irs[base]
        irs.append(apply_edits(before, p["edits"])
                   if "edits" in p and before is not None else None)
    for s in record["stages"]:
        if "pass" in s and irs[s["pass"]] is not None:
            texts[s["name"]] = irs[s["pass"]] or ""
    return texts, irs


def plot_svg(measurements: Sequence[dict[str, Any]], width: int = 720, height: int = 300
             ) -> str | None:
    """Throughput against L as an SVG line plot (the extension draws the same in TypeScript)."""
    series: dict[str, dict[str, Any]] = {}
    for m in measurements:
        if m.get("status", "ok") != "ok" or not m["seconds"] > 0 or not m["length"] > 0:
            continue
        entry = series.setdefault(m["name"], {"kind": m.get("kind", "generated"), "points": []})
        entry["points"].append((m["length"], m["bytes"] / m["seconds"] / 1e9))
    points = [p for s in series.values() for p in s["points"]]
    if not points:
        return None
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"]
    left, right, top = 64, 20, 30
    bottom = 46 + 18 * len(series)
    inner_w, inner_h = width - left - right, height
    total_h = height + top + bottom
    x_lo = min(math.log2(p[0]) for p in points)
    x_hi = max(math.log2(p[0]) for p in points)
    if x_hi - x_lo < 1:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    y_top = max(p[1] for p in points) or 1.0
    raw = y_top / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(f * power for f in (1, 2, 2.5, 5, 10) if f * power >= raw)
    y_max = step * math.ceil(y_top / step)

    def x(length: float) -> float:
        return left + (math.log2(length) - x_lo) / (x_hi - x_lo) * inner_w

    def y(value: float) -> float:
        return top + inner_h - value / y_max * inner_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
           f'viewBox="0 0 {width} {total_h}" font-family="sans-serif" font-size="11">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">'
           'throughput against sequence length</text>']
    for k in range(round(y_max / step) + 1):
        value = k * step
        out.append(f'<line x1="{left}" x2="{left + inner_w}" y1="{y(value):.1f}" '
                   f'y2="{y(value):.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{left - 6}" y="{y(value):.1f}" text-anchor="end" '
                   f'dominant-baseline="middle">{float(f"{value:.6g}"):g}</text>')
    for length in sorted({p[0] for p in points}):
        label = f"2^{int(math.log2(length))}" if length & (length - 1) == 0 else str(length)
        out.append(f'<text x="{x(length):.1f}" y="{top + inner_h + 16}" '
                   f'text-anchor="middle">{label}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{inner_w}" height="{inner_h}" fill="none" '
               'stroke="#444"/>')
    out.append(f'<text x="{left + inner_w / 2}" y="{top + inner_h + 34}" text-anchor="middle">'
               'L (time steps, log scale)</text>')
    out.append(f'<text transform="translate(16 {top + inner_h / 2}) rotate(-90)" '
               'text-anchor="middle">GB/s (bytes read + written)</text>')
    for index, (name, entry) in enumerate(series.items()):
        roof = entry["kind"] == "roofline"
        color = "#555" if roof else colors[index % len(colors)]
        dash = ' stroke-dasharray="6 4"' if roof else ""
        pts = sorted(entry["points"])
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                   f'stroke-width="2"{dash}/>')
        if not roof:
            out.extend(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{color}"/>'
                       for a, b in pts)
        ly = top + inner_h + 52 + 18 * index
        out.append(f'<line x1="{left}" x2="{left + 24}" y1="{ly}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{left + 30}" y="{ly}" dominant-baseline="middle">'
                   f'{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def report_html(record: dict[str, Any], full: bool = True) -> str:
    """The record as HTML needing no script: every stage, each pass with its diff, the pictures,
    the PTX resources and the timings. ``full=False`` (the notebook fallback) shows the first
    lines of each long text only."""
    record = unpack(record)
    return (_report_body(record, full) + _timing_html(record.get("measurements") or [])
            + "</div>")


#: where the PTX resources go in a body built before ptxas answered
_PTX_MARK = "<!--sw-ptx-info-->"


def _report_body(record: dict[str, Any], full: bool, ptx_later: bool = False) -> str:
    """The report without its timings and closing tag (``ptx_later``: with :data:`_PTX_MARK`
    where the PTX resources go)."""
    from explorer.widget.highlight import style_sheet

    lines = None if full else FALLBACK_LINES
    diff_lines = None if full else FALLBACK_DIFF_LINES
    texts, irs = _stage_texts(record)
    esc = html.escape
    options = ", ".join(f"{k} {v}" for k, v in record["options"].items()
                        if k not in ("strategy", "target"))
    parts = [f"<div class='sw-report'><style>{_CSS}</style>{style_sheet()}",
             "<h2>ScanWeaver Explorer</h2>",
             _code(record["recurrence"], None, None),
             f"<div class='sw-facts'>strategy {esc(record['strategy'])} · target "
             f"{esc(record['target'])} · {esc(options)} · {len(record['stages'])} stages, "
             f"{len(record['passes'])} MLIR passes · explorer "
             f"{esc(str(record.get('explorer_version')))}</div>"]
    graphs = record.get("graphs") or {}
    pass_stage_names = {s["name"] for s in record["stages"] if "pass" in s}
    pass_input = record.get("pass_input")
    for stage in record["stages"]:
        name = stage["name"]
        if name in pass_stage_names:
            continue
        title = _TITLES.get(name, name)
        text = texts.get(name, "")
        count = len(text.split("\n")) if text else 0
        parts.append(f"<h3>{esc(title)}</h3><div class='sw-note'>{count} lines, stage time "
                     f"{seconds_text(stage['seconds'])}</div>")
        if name == "ptx":
            parts.append(_PTX_MARK if ptx_later else _ptx_info_html(record))
        if name in graphs:
            parts.append(f"<div class='sw-graph'>{graphs[name]}</div>")
        code = _code(text, _LANGUAGE.get(stage["kind"]), lines)
        if name == pass_input or stage["kind"] in _LANGUAGE:
            parts.append(f"<details{' open' if name == 'ptx' else ''}><summary>{esc(title)} "
                         f"text</summary>{code}</details>")
        else:
            parts.append(code)
        if name == pass_input and record["passes"]:
            parts.append(_passes_html(record, texts.get(name, ""), irs, diff_lines, lines))
    return "".join(parts)


def _timing_html(measurements: Sequence[dict[str, Any]]) -> str:
    """The timing plot and table of the report."""
    esc = html.escape
    parts = ["<h3>Timing</h3>"]
    svg = plot_svg(measurements) if measurements else None
    if svg is None:
        parts.append("<div class='sw-note'>No measurements were saved with this compile.</div>")
    else:
        parts.append(f"<div class='sw-graph'>{svg}</div>")
        rows = "".join(
            f"<tr><td>{esc(m['name'])}</td><td>{m['channels']}</td><td>{m['length']}</td>"
            f"<td>{seconds_text(m['seconds'])}</td><td>"
            f"{(m['bytes'] / m['seconds'] / 1e9 if m['seconds'] > 0 else float('nan')):.2f}"
            f"</td><td>{esc(m['device'])}</td><td>{esc(m['status'])}</td></tr>"
            for m in measurements)
        parts.append("<details><summary>measurements</summary><table><tr><th>method</th>"
                     "<th>channels</th><th>L</th><th>time</th><th>GB/s</th><th>device</th>"
                     f"<th>status</th></tr>{rows}</table></details>")
    return "".join(parts)


def _ptx_info_html(record: dict[str, Any]) -> str:
    info = record.get("ptx_info")
    if not info or "unavailable" in info:
        why = f" ({info['unavailable']})" if info else ""
        return (f"<div class='sw-note'>No ptxas report where this was compiled"
                f"{html.escape(str(why))}: register, spill and shared-memory counts are "
                "unknown.</div>")
    labels = {"registers": "registers / thread", "spills_stores": "spill stores",
              "spills_loads": "spill loads", "shared_bytes": "shared memory (bytes)",
              "stack_bytes": "stack (bytes)", "barriers": "barriers"}
    badges = "".join(f"<span class='sw-badge'>{html.escape(label)}: "
                     f"<b>{html.escape(str(info[key]))}</b></span>"
                     for key, label in labels.items() if key in info)
    chip = html.escape(str(record["options"].get("chip", "")))
    kernel = html.escape(str(info.get("kernel", "")))
    other = (f"<div class='sw-note'>other kernels: {html.escape(str(info['other_kernels']))}"
             "</div>" if info.get("other_kernels") else "")
    return f"<div>ptxas {chip}, kernel <code>{kernel}</code>: {badges}</div>{other}"


def _passes_html(record: dict[str, Any], start: str, irs: list[str | None],
                 diff_lines: int | None, lines: int | None) -> str:
    """The pass list: a row per pass with its time, and its diff against the pass before."""
    out = ["<h3>MLIR passes</h3><div class='sw-note'>Each pass with the diff of the IR it "
           "produced against the IR before it.</div>"]
    for index, p in enumerate(record["passes"]):
        base = p.get("base", index - 1)
        name = html.escape(p["name"])
        if "edits" not in p:
            size = p.get("omitted") or {}
            out.append(f"<details><summary>{index + 1}. {name} ({seconds_text(p['seconds'])}, "
                       f"IR not saved)</summary><div class='sw-note'>The IR after this pass "
                       f"({size.get('lines', '?')} lines) was left out to keep the notebook "
                       "small; Explorer.snapshot(path) keeps every pass.</div></details>")
            continue
        before_text = start if base < 0 else irs[base] or ""
        edits = p["edits"]
        added = sum(len(insert) for _, _, insert in edits)
        removed = sum(drop for _, drop, _ in edits)
        against = "before" if base == index - 1 else (
            "the input" if base < 0 else f"after pass {base + 1} (the IR between was not saved)")
        diff = edits_diff(before_text.split("\n"), edits, against, f"after {p['name']}",
                          limit=diff_lines)
        change = f"+{added} −{removed} lines" if edits else "changed nothing"
        summary = f"{index + 1}. {name} ({seconds_text(p['seconds'])}, {change})"
        body = _code(diff, "diff", diff_lines) if diff else ""
        out.append(f"<details><summary>{summary}</summary>{body}</details>")
    last = next((ir for ir in reversed(irs) if ir is not None), None)
    if last is not None:
        out.append("<details><summary>IR after the last pass saved</summary>"
                   f"{_code(last, 'mlir', lines)}</details>")
    return "".join(out)


#: where the snapshot's script is: in the installed package (the wheel carries the extension
#: build's ``snapshot.js`` there), or in a source checkout where the extension was built
SNAPSHOT_SCRIPTS = (
    Path(__file__).resolve().parent / "static" / "snapshot.js",
    Path(__file__).resolve().parents[2] / "extensions" / "scanweaver" / "labextension"
    / "snapshot.js",
)


def snapshot_script() -> str | None:
    """The snapshot's script (the extension's view of a compile, bundled with its styles by
    ``npm run build:snapshot``), or None where the extension was never built."""
    for candidate in SNAPSHOT_SCRIPTS:
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    return None


def _inline_json(text: str) -> str:
    """JSON made safe inside a ``<script>`` element: no ``</`` can end it and no ``<!--`` can
    start a comment (``<\\/`` and ``\\u0021`` mean the same in JSON strings)."""
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def _inline_script(code: str) -> str:
    """Script code made safe inside a ``<script>`` element: a ``</script`` (only ever inside a
    string of the bundle) would end the element, so its ``/`` is escaped."""
    return re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)


def snapshot_html(record: dict[str, Any], script: str | None) -> str:
    """The snapshot page of ``record``: the extension's interactive view (tabs, pass stepping
    with diffs, pictures, the timing plot) drawn by ``script`` from the packed record, with the
    script-free report as its ``<noscript>`` copy (the script shows that copy, too, should it
    fail). Without a script the page is the script-free report."""
    title = html.escape(f"ScanWeaver Explorer: {record['recurrence']}")
    static = report_html(record, full=True)
    head = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='generator' content='scanweaver-explorer {__version__}'>"
            f"<title>{title}</title></head><body>")
    if script is None:
        return f"{head}{static}</body></html>\n"
    data = json.dumps(pack(record), separators=(",", ":"))
    return (f"{head}<div id='sw-snapshot' class='sw-snapshot'>Drawing the explorer's view…"
            f"</div><noscript id='sw-static'>{static}</noscript>"
            f"<script type='application/json' id='sw-record'>{_inline_json(data)}</script>"
            f"<script>{_inline_script(script)}</script></body></html>\n")


def snapshot(compiled: Any, path: str | os.PathLike[str],
             measurements: Iterable[Any] | None = None) -> Path:
    """Write one self-contained HTML file of ``compiled`` (every stage, the pass list with each
    pass's IR and diff, the pictures, the PTX resources, and the timings with their plot when
    ``measurements`` are given); returns its path. It opens from disk in a browser, with no
    server and no network: the extension's view of the compile when its build is here
    (:func:`snapshot_script`), the script-free report otherwise."""
    record = compile_record(compiled, measurements)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(snapshot_html(record, snapshot_script()), encoding="utf-8")
    return out
