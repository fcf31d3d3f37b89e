"""The record of a compile that outlives the kernel: what the saved output and the snapshot hold.

:func:`compile_record` builds it from a compiled result (every stage, the pass list with names,
times and whether each changed the IR, the ptxas resources, the pictures of the recurrence and
the plan as SVG, the last run's measurements); :func:`pack` and :func:`unpack` move its texts
into one compressed field and back. The notebook stores it as
``application/vnd.scanweaver.compile+json`` (:mod:`explorer.widget.bundle`), and the snapshot
file (:mod:`explorer.widget.snapshot`) carries it for the extension's view.

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
pass. In a notebook (``explorer.widget.bundle.mime_bundle``) the texts are packed, which makes
the record about a twelfth of the texts it holds, and the IR of passes past
:data:`PASS_IR_BUDGET` is left out (and their lines in ``locations`` with it); the snapshot
keeps everything. ``locations`` is the compiler's own record (``Compiled.term_lines``), stored
as it is, for linking each recurrence term to the lines it became; ``terms`` says where
each of its terms is written (the parser's spans), so the extension marks exactly those
characters.
"""

from __future__ import annotations

import base64
import difflib
import functools
import gzip
import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from explorer import __version__

MIME_TYPE = "application/vnd.scanweaver.compile+json"
FORMAT = "scanweaver-compile/2"
PACKING = "gzip+base64"

#: characters of pass IR (the lines each pass's edits insert, before packing) a notebook's saved
#: output keeps; passes past it keep their name, time and size but not their IR. The presets'
#: pipelines insert 1.2-1.5 MB (about 0.2 MB packed), so they keep every pass; a recurrence
#: whose IR is ten times larger keeps its first passes.
PASS_IR_BUDGET = 4_000_000

Edit = list[Any]  # [keep, drop, inserted lines]


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


def _pass_records(compiled: Any, pass_input: str | None,
                  ir_budget: int | None) -> list[dict[str, Any]]:
    """A record per pass: its IR as edits against the last IR kept, or, past ``ir_budget``
    characters of inserted lines, left out."""
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
        if ir_budget is not None and edits and spent + cost > ir_budget:
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
    pass_records = _pass_records(compiled, pass_input, ir_budget)
    locations = _locations(compiled)
    omitted = {p["name"] for p in pass_records if "omitted" in p}
    if locations and omitted:   # lines of IR that was not kept link to nothing
        locations = {term: {code: lines for code, lines in record.items()
                            if code not in omitted}
                     for term, record in locations.items()}
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
