"""Pass ``scan-lower``: the plan (``scan`` ops) -> ``gpu``/``scf``/``memref`` kernels.

Reads the plan back from the IR (:func:`explorer.passes.plan.read_plan`: the threads of a block,
the elements each composes, the sweeps of the block tree, the grid scheme) and emits, level by
level, the kernels that run it (:func:`explorer.codegen.kernels.lower_plan`): for ``cuda`` a
``gpu.module`` with the kernels and a host function launching them in order, for ``cpu`` host
functions that run every block and every thread of the same kernel bodies. The ``scan`` ops
are then erased; every op the lowering makes is located at the recurrence term it comes from
(a name's loads at that name's first use, a readout's arithmetic at its statement, the rest at
the state's statement), so locations reach the PTX's ``.loc`` lines. The kernel contract
(arguments, grids, workspaces) is what the launchers read. With 16-bit inputs
(``dtype="bfloat16"``/``"float16"``) the arrays the contract makes 16-bit are ``bf16``/``f16``
memrefs, loaded through ``arith.extf`` to f32 and stored through ``arith.truncf``
(:mod:`explorer.codegen.narrow`): the arithmetic stays f32.
"""

from __future__ import annotations

from typing import Any

from explorer.dialect import scan
from explorer.passes.plan import read_plan
from explorer.passes.state import ScanState

NAME = "scan-lower"


def term_locations(rec: Any) -> Any:
    """MLIR locations of the recurrence's terms: each statement (its first column) and each
    name where it is first used, ``loc("recurrence":line:col)``."""
    from explorer.codegen.gen import Locations
    from explorer.frontend.recurrence import Ref, walk

    names: dict[str, Any] = {}
    statements: dict[str, Any] = {}
    for st in rec.statements:
        statements[st.target] = scan.location(st.span.line, st.span.col)
        for node in walk(st.expr):
            if isinstance(node, Ref) and node.name not in names:
                names[node.name] = scan.location(node.span.line, node.span.col)
    return Locations(names, statements)


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from explorer.codegen.kernels import lower_plan

        if state.form is None:
            raise ValueError(f"{NAME} runs after scan-decompose and scan-plan")
        plan = read_plan(module_op)
        state.plan = plan
        state.built = lower_plan(module_op, state.form, state.options, plan,
                                 term_locations(state.recurrence))
        scan.erase(scan.ops(module_op))
    return run
