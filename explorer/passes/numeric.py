"""Numeric evaluation of the sympy expressions of an `AffineForm` with NumPy (float64).

A small tree walker rather than ``sympy.lambdify``: it covers exactly the operations the front end
produces, generates no code, and treats ``LaneSum`` as a sum over the lane axis (second to last).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import sympy

from explorer.passes.lanesum import LaneSum, Sigmoid, Softplus, np_sigmoid, np_softplus

_FUNCS: dict[type, Callable[[Any], Any]] = {
    sympy.exp: np.exp,
    sympy.log: np.log,
    sympy.tanh: np.tanh,
    sympy.Abs: np.abs,
    Sigmoid: np_sigmoid,   # without overflow
    Softplus: np_softplus,
}


def evaluate(expr: sympy.Expr, env: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` with ``env`` mapping symbol names to arrays (or numbers)."""
    if expr.is_Symbol:
        try:
            return env[expr.name]
        except KeyError:
            raise KeyError(f"no value for {expr.name}") from None
    if expr.is_Number or expr.is_NumberSymbol:
        return float(expr)
    if expr.is_Add:
        total = evaluate(expr.args[0], env)
        for a in expr.args[1:]:
            total = total + evaluate(a, env)
        return total
    if expr.is_Mul:
        prod = evaluate(expr.args[0], env)
        for a in expr.args[1:]:
            prod = prod * evaluate(a, env)
        return prod
    if expr.is_Pow:
        base, exponent = expr.args
        b = evaluate(base, env)
        if exponent == sympy.Rational(1, 2):
            return np.sqrt(b)
        if exponent == -1:
            return 1.0 / np.asarray(b, dtype=float)
        return np.power(np.asarray(b, dtype=float), float(exponent))
    if isinstance(expr, LaneSum):
        return np.sum(evaluate(expr.args[0], env), axis=-2, keepdims=True)
    if isinstance(expr, sympy.Max | sympy.Min):
        f = np.maximum if isinstance(expr, sympy.Max) else np.minimum
        vals = [evaluate(a, env) for a in expr.args]
        out = vals[0]
        for v in vals[1:]:
            out = f(out, v)
        return out
    func = _FUNCS.get(type(expr)) or _FUNCS.get(expr.func)
    if func is not None:
        return func(evaluate(expr.args[0], env))
    raise NotImplementedError(f"cannot evaluate {type(expr).__name__}: {expr}")
