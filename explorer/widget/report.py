"""The compile's record as HTML needing no script: the notebook's fallback and the snapshot's
``<noscript>`` copy.

Every stage (highlighted), each pass with its diff (read from the record's line edits), the
pictures, the PTX resources, and the timings with their plot drawn as SVG. In a notebook
(``full=False``) each long text shows its first lines only.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from explorer.widget.record import Edit, _stage_texts, unpack

#: lines of each code block in the in-notebook HTML fallback (the snapshot keeps every line)
FALLBACK_LINES = 100
#: lines of each pass's diff in the in-notebook HTML fallback
FALLBACK_DIFF_LINES = 30
#: characters of one line in the in-notebook HTML fallback (the gpu.binary op holds the whole
#: PTX in one line of about 100 kB)
FALLBACK_LINE_CHARS = 300

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
