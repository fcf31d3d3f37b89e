"""Pass ``scan-decompose``: ``scan.recurrence`` -> ``scan.affine`` + ``scan.readout``.

The recurrence's statements (``scan.statement``) become the scan's element
``s_t = A_t s_{t-1} + b_t`` (sympy does the algebra, :func:`explorer.passes.affine.decompose`);
the op records the form (scalar,
diagonal or dense), the state dimension, the width of an element (the numbers a combine moves)
and the coefficients, each as text. Readouts become ``scan.readout`` ops. Every new op keeps the
location of the statement it came from.
"""

from __future__ import annotations

from typing import Any

from mlir.ir import InsertionPoint, Location

from explorer.dialect import scan
from explorer.passes.state import ScanState

NAME = "scan-decompose"


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from explorer.codegen.emit import closure_pattern
        from explorer.passes.affine import decompose

        recs = scan.ops(module_op, "recurrence")
        if len(recs) != 1 or scan.ops(module_op, "affine"):
            raise ValueError(f"{NAME} expects one scan.recurrence, not yet decomposed")
        text = scan.attrs(recs[0])["text"]
        if text != state.recurrence.text:
            raise ValueError(f"{NAME}: the scan.recurrence is not the recurrence compiled")
        form = decompose(state.recurrence)
        state.form = form
        statements = {scan.attrs(op)["target"]: op.location
                      for op in scan.ops(module_op, "statement")}
        first = statements.get(state.recurrence.states[0], recs[0].location)
        S = form.size
        width = len(closure_pattern(form.A)) + S
        with InsertionPoint.after(recs[0]):
            scan.create("affine", {
                "form": form.kind, "dim": S, "width": width,
                "components": [f"{n}[t-{lag}]" if lag else f"{n}[t]"
                               for n, lag in form.components],
                "A": [str(form.A[i, j]) for i in range(S) for j in range(S)],
                "b": [str(form.b[i]) for i in range(S)],
            }, loc=first)
            for name, expr in form.readouts.items():
                scan.create("readout", {"target": name, "expr": str(expr),
                                        "lane_sum": bool(form.vector)},
                            loc=statements.get(name, Location.unknown()))
        # the recurrence stays (its text is what a replay of the later passes parses)
        scan.erase(scan.ops(module_op, "statement"))
    return run
