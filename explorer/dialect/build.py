"""The input of the pass pipeline: a recurrence as ``scan`` IR.

``scan.recurrence`` holds the text and the role of every name; one ``scan.statement`` per
statement is located at the statement's line and column in the recurrence
(``loc("recurrence":line:col)``), and the passes keep those locations on what they make.
"""

from __future__ import annotations

from mlir.ir import Context, InsertionPoint, Location, Module

from explorer.dialect import scan
from explorer.frontend.recurrence import Recurrence, to_text


def build_scan(rec: Recurrence) -> str:
    """The ``scan`` module of ``rec``, as text with its locations."""
    with Context() as ctx, Location.unknown():
        scan.load(ctx)
        module = Module.create()
        with InsertionPoint(module.body):
            scan.create("recurrence", {
                "text": rec.text, "states": list(rec.states), "readouts": list(rec.readouts),
                "inputs": list(rec.inputs), "params": list(rec.params),
                "lanes": sorted(rec.lane_names)}, loc=scan.location(1, 0))
            for s in rec.statements:
                lhs = f"{s.target}[t, n]" if s.lane else f"{s.target}[t]"
                scan.create("statement", {
                    "target": s.target, "kind": "state" if s.target in rec.states else "readout",
                    "source": f"{lhs} = {to_text(s.expr)}"},
                    loc=scan.location(s.span.line, s.span.col))
        return module.operation.get_asm(enable_debug_info=True)
