"""Explorer output that outlives the kernel: the mime bundle a notebook saves.

The compiled result is written as ``application/vnd.scanweaver.compile+json``: the record of
:mod:`explorer.widget.record` (whose docstring gives its layout), packed, with the IR of passes
past :data:`PASS_IR_BUDGET` left out. The JupyterLab extension in ``extensions/scanweaver``
renders it read-only in a saved notebook opened with no kernel; a ``text/html`` fallback beside
it (:mod:`explorer.widget.report`) stays readable where the extension is absent (GitHub,
nbviewer). The bundle of a compile is built once and cached (:class:`SavedRecord`); new
measurements only redo their own part. :func:`snapshot` (:mod:`explorer.widget.snapshot`) writes
the same record into one HTML file.

The names of those modules are importable from here too.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from explorer.widget.record import (
    FORMAT,
    MIME_TYPE,
    PACKING,
    PASS_IR_BUDGET,
    Edit,
    apply_edits,
    compile_record,
    line_edits,
    measurement_records,
    pack,
    term_records,
    unpack,
)
from explorer.widget.record import _stage_texts as _stage_texts
from explorer.widget.report import (
    _PTX_MARK,
    FALLBACK_DIFF_LINES,
    FALLBACK_LINE_CHARS,
    FALLBACK_LINES,
    _ptx_info_html,
    _report_body,
    _timing_html,
    edits_diff,
    plot_svg,
    report_html,
    seconds_text,
)
from explorer.widget.report import _clip as _clip
from explorer.widget.snapshot import SNAPSHOT_SCRIPTS, snapshot, snapshot_html, snapshot_script

__all__ = [
    "FALLBACK_DIFF_LINES", "FALLBACK_LINES", "FALLBACK_LINE_CHARS", "FORMAT", "MIME_TYPE",
    "PACKING", "PASS_IR_BUDGET", "SNAPSHOT_SCRIPTS", "Edit", "SavedOutput", "SavedRecord",
    "apply_edits", "compile_record", "edits_diff", "line_edits", "measurement_records",
    "mime_bundle", "pack", "plot_svg", "report_html", "saved_record", "seconds_text", "snapshot",
    "snapshot_html", "snapshot_script", "term_records", "unpack",
]


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
