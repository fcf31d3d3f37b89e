"""Spelling a sympy expression in the recurrence language (for the backward recurrence that
:mod:`explorer.autodiff` writes): the inverse of the parser's translation to sympy, for the
functions and operators the language has."""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy

from explorer.passes.lanesum import Sigmoid, Softplus


class Unprintable(ValueError):
    """A sympy expression the language cannot spell (sign, Heaviside, a sum over n ...)."""


_ATOM, _POW, _UNARY, MUL, _ADD = 5, 4, 3, 2, 1


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise Unprintable(f"the constant {value} is not finite")
    return repr(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def to_text(expr: sympy.Expr, ref: Callable[[str], str]) -> str:
    """Spell a sympy expression in the language; ``ref(symbol name)`` spells a symbol.

    Raises :class:`Unprintable` for what the language has no word for.
    """
    return spell(sympy.sympify(expr), ref)[0]


def wrap(part: tuple[str, int], least: int) -> str:
    text, p = part
    return f"({text})" if p < least else text


def spell(e: sympy.Expr, ref: Callable[[str], str]) -> tuple[str, int]:
    if e.is_Symbol:
        return ref(e.name), _ATOM
    if e.is_Number or e.is_NumberSymbol:
        v = float(e)
        return (_number(v), _ATOM) if v >= 0 else (_number(v), _UNARY)
    if e.is_Add:
        terms = e.as_ordered_terms()
        text = wrap(spell(terms[0], ref), _ADD)
        for term in terms[1:]:
            if term.could_extract_minus_sign():
                text += " - " + wrap(spell(-term, ref), MUL)
            else:
                text += " + " + wrap(spell(term, ref), _ADD + 1)
        return text, _ADD
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if coeff < 0:   # -a * b: numerically -(a * b)
            return "-" + wrap(spell(-e, ref), MUL), MUL
        num, den = [], []
        for f in sympy.Mul.make_args(e):
            if f.is_Pow and f.exp.is_Number and f.exp < 0:
                den.append(f.base ** -f.exp)
            elif f.is_Rational and not f.is_Integer:
                num.append(sympy.Integer(f.p))
                den.append(sympy.Integer(f.q))
            else:
                num.append(f)
        num = [f for f in num if f != 1] or [sympy.Integer(1)]
        text = " * ".join(wrap(spell(f, ref), MUL) for f in num)
        if den:
            d = sympy.Mul(*den)
            text = f"{text} / {wrap(spell(d, ref), _POW)}"
        return text, MUL
    if e.is_Pow:
        base, exponent = e.args
        if not exponent.is_Number:
            raise Unprintable(f"a power with a symbolic exponent: {e}")
        if exponent == sympy.Rational(1, 2):
            return f"sqrt({spell(base, ref)[0]})", _ATOM
        if exponent < 0:
            return f"1 / {wrap(spell(base ** -exponent, ref), _POW)}", MUL
        return f"{wrap(spell(base, ref), _POW + 1)} ** {_number(float(exponent))}", _POW
    names = {sympy.exp: "exp", sympy.log: "log", sympy.tanh: "tanh", sympy.Abs: "abs",
             Sigmoid: "sigmoid", Softplus: "softplus"}
    if e.func in names:
        return f"{names[e.func]}({spell(e.args[0], ref)[0]})", _ATOM
    if isinstance(e, sympy.Max | sympy.Min):
        word = "max" if isinstance(e, sympy.Max) else "min"
        args = [spell(a, ref)[0] for a in e.args]
        text = args[-1]
        for a in reversed(args[:-1]):
            text = f"{word}({a}, {text})"
        return text, _ATOM
    raise Unprintable(f"the language has no word for {type(e).__name__} ({e})")
