"""The snapshot: one self-contained HTML file of a compile, which opens from disk with no server.

It holds the packed record, the extension's view of it as an inline script (built with the
extension: ``snapshot.js``), and the script-free report (:mod:`explorer.widget.report`) as its
``<noscript>`` copy.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from explorer import __version__
from explorer.widget.record import compile_record, pack
from explorer.widget.report import report_html

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
