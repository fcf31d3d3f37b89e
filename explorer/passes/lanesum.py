"""The sum over the state axis ``n`` as a sympy function, shared by the affine decomposition
(:mod:`explorer.passes.affine`) and the numeric evaluation of its expressions
(:mod:`explorer.passes.numeric`), which import it from here (and not from each other)."""

from __future__ import annotations

import sympy


class LaneSum(sympy.Function):
    """sum over the state axis n (only in readouts of vector recurrences)."""

    nargs = 1

    def _latex(self, printer: sympy.printing.latex.LatexPrinter) -> str:
        return r"\sum_{n} \left(" + printer._print(self.args[0]) + r"\right)"

    def _sympystr(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"sum({printer._print(self.args[0])})"
