"""What our passes hand each other beside the IR, for one compile.

The IR is the program: the plan the lowering follows is read from the ``scan`` ops (see
:mod:`explorer.passes.plan`). What the IR does not carry in a form a pass can compute with is
kept here: the parsed :class:`Recurrence` (the ``scan.recurrence`` op holds its text), the sympy
:class:`AffineForm` that ``scan-decompose`` derived (``scan.affine`` holds it as text), and what
the lowering produced for the launchers (the kernel contract).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explorer.codegen.options import Options
from explorer.frontend.recurrence import Recurrence


@dataclass
class ScanState:
    recurrence: Recurrence
    options: Options
    form: Any = None          # AffineForm, after scan-decompose
    plan: Any = None          # explorer.passes.plan.Plan, after scan-plan (read from the IR)
    built: Any = None         # explorer.codegen.kernels.BuiltModule, after the lowering
    backward_tile: Any = None  # (threads, elements) of a fused backward compile

    def __post_init__(self) -> None:
        if self.options.backward:
            from explorer.passes.backward import tile_of

            self.backward_tile = tile_of(self.options)
        # the tile left open by the options is the plan's choice for this recurrence
        from explorer.passes.plan_options import resolve_tiles

        self.options = resolve_tiles(self.options, self.recurrence)
