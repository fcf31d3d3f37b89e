"""The sympy functions of the language that sympy has no class for: the sum over the state axis
``n``, ``sigmoid`` and ``softplus``. Shared by the affine decomposition
(:mod:`explorer.passes.affine`) and the numeric evaluation of its expressions
(:mod:`explorer.passes.numeric`), which import them from here (and not from each other).

``sigmoid`` and ``softplus`` stay functions through the algebra (their derivatives are
``sigmoid(x) (1 - sigmoid(x))`` and ``sigmoid(x)``): written out as ``1 / (1 + exp(-x))`` and
``log(1 + exp(x))``, sympy's algebra turns them into forms such as ``exp(x) / (exp(x) + 1)``,
which overflow to ``inf / inf`` in float32 for x past 88, and ``log(1 + exp(x))`` itself is
``inf`` there. Each consumer computes them in a form that cannot overflow: the kernels
(:mod:`explorer.codegen.emit`), NumPy (:mod:`explorer.passes.numeric`), the gradient
formulas (:mod:`explorer.gradients`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy


class LaneSum(sympy.Function):
    """sum over the state axis n (only in readouts of vector recurrences)."""

    nargs = 1

    def _latex(self, printer: sympy.printing.latex.LatexPrinter) -> str:
        return r"\sum_{n} \left(" + printer._print(self.args[0]) + r"\right)"

    def _sympystr(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"sum({printer._print(self.args[0])})"


def np_sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))`` in NumPy without overflow (tanh saturates)."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=float)))


def np_softplus(x: Any) -> Any:
    """``log(1 + exp(x))`` in NumPy without overflow."""
    return np.logaddexp(0.0, x)


class _Saturating(sympy.Function):
    """A function of one real argument, positive, written as the language writes it."""

    nargs = 1
    word = ""
    #: its value at a number, in NumPy without overflow
    numeric: Any = None

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:
        if x.is_Number:   # a float, computed without overflow
            return sympy.Float(float(cls.numeric(float(x))))
        return None

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real

    def _eval_is_positive(self) -> bool | None:
        return True if self.args[0].is_real else None

    def _sympystr(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"{self.word}({printer._print(self.args[0])})"


class Sigmoid(_Saturating):
    """``1 / (1 + exp(-x))``."""

    word = "sigmoid"
    numeric = staticmethod(np_sigmoid)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        s = Sigmoid(self.args[0])
        return s * (1 - s)

    def _eval_rewrite_as_exp(self, x: sympy.Expr, **kwargs: object) -> sympy.Expr:
        return 1 / (1 + sympy.exp(-x))

    def _latex(self, printer: sympy.printing.latex.LatexPrinter) -> str:
        return r"\sigma\left(" + printer._print(self.args[0]) + r"\right)"


class Softplus(_Saturating):
    """``log(1 + exp(x))``."""

    word = "softplus"
    numeric = staticmethod(np_softplus)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return Sigmoid(self.args[0])

    def _eval_rewrite_as_exp(self, x: sympy.Expr, **kwargs: object) -> sympy.Expr:
        return sympy.log(1 + sympy.exp(x))

    def _latex(self, printer: sympy.printing.latex.LatexPrinter) -> str:
        return r"\operatorname{softplus}\left(" + printer._print(self.args[0]) + r"\right)"
