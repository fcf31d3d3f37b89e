"""Pass ``scan-lower``: the plan (``scan`` ops) -> ``gpu``/``scf``/``memref`` kernels.

Reads the plan back from the IR (:func:`explorer.passes.plan.read_plan`: the threads of a block,
the elements each composes, the sweeps of the block tree, the grid scheme) and emits, level by
level, the kernels that run it (:func:`explorer.codegen.kernels.lower_plan`): for ``cuda`` a
``gpu.module`` with the kernels and a host function launching them in order, for ``cpu`` host
functions that run every block and every thread of the same kernel bodies. The ``scan`` ops
are then erased; the kernel contract (arguments, grids, workspaces) is what the launchers read.
"""

from __future__ import annotations

from typing import Any

from explorer.dialect import scan
from explorer.passes.plan import read_plan
from explorer.passes.state import ScanState

NAME = "scan-lower"


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from explorer.codegen.kernels import lower_plan

        if state.form is None:
            raise ValueError(f"{NAME} runs after scan-decompose and scan-plan")
        plan = read_plan(module_op)
        state.plan = plan
        state.built = lower_plan(module_op, state.form, state.options, plan)
        scan.erase(scan.ops(module_op))
    return run
