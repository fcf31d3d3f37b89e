"""Gradients summed over the state axis in the adjoint's own kernel: readouts of the adjoint.

For an input ``x[t]`` without the axis n of a vector recurrence, the scan terms of its gradient
are ``sum_n lam[t, n] * (dA_t/dx s_{t-1} + db_t/dx)[n]``: a lane-summed readout of the adjoint
recurrence (:func:`summed_readouts`), which :mod:`explorer.autodiff` adds to the backward it
derives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from explorer.errors import RecurrenceError
from explorer.frontend.recurrence import Recurrence
from explorer.passes.affine import state_symbol
from explorer.spelling import MUL, Unprintable, spell, wrap

PREVIOUS = "fwd_{}_prev"  # the forward's h[t-1], read by a gradient summed in the adjoint
GRADIENT = "grad_sum_{}"  # a gradient summed over n in the adjoint's kernel (a readout)


def summed_readouts(rec: Recurrence, comps: Sequence[tuple[str, int]],
                     adjoint: dict[tuple[str, int], str],
                     scan_terms: dict[str, list[tuple[int, sympy.Expr]]], namer: Callable[..., str],
                     text: str, back: Recurrence, label: str, timed: set[str],
                     lane_names: set[str], ref: Callable[[str], str]
                     ) -> tuple[str, Recurrence, dict[str, str], dict[str, str]]:
    """Readouts of the adjoint recurrence that give the scan terms of a gradient (summed over n
    for a vector recurrence).

    For an input ``x[t]`` without the axis n of a vector recurrence, the scan terms of
    ``dL/dx[t]`` are ``sum_n lam[t, n] * (dA_t/dx s_{t-1} + db_t/dx)[n]``: a lane-summed readout
    of the adjoint, which a lane-loop plan reduces in the adjoint's own kernel (the B x D x N x L
    products are never laid out). The past states ``s[t-1]`` enter as inputs
    ``fwd_<state>_prev[t, n]``. Terms the language cannot spell, or that read a state two or
    more steps back, stay with the elementwise formulas. For a scalar state the readout is the
    term itself, ``lam[t] * (dA_t/dx s_{t-1} + db_t/dx)`` (``grad_sum_a[t] = lam_h[t] *
    fwd_h_prev[t]`` for ``h[t] = a[t] * h[t-1] + b[t]``: the adjoint's kernel writes the
    gradient of ``a``), except where it is ``lam`` itself (the gradient of ``b``). Returns the
    adjoint's text and recurrence (with the readouts, when any), the past-state inputs and
    input -> readout."""
    previous: dict[str, str] = {}
    summed: dict[str, str] = {}
    lines: list[str] = []
    past = {state_symbol(st, 1).name: st for st in rec.states}
    lane_of = set(rec.lane_names)
    at = "[t, n]" if rec.vector else "[t]"
    for name in rec.inputs:
        terms = scan_terms.get(name, [])
        if name in lane_of or not terms or any(comps[i][1] for i, _ in terms):
            continue
        if not rec.vector and len(terms) == 1 and terms[0][1] == 1:
            continue   # the gradient is lam itself
        reads = {sym.name for _, e in terms for sym in e.free_symbols}
        if any("[" in r and r not in past for r in reads):
            continue   # a state at t or two or more steps back (``h[t-2]``): not an input here
        new_prev = {past[r]: previous.get(past[r]) or namer(PREVIOUS.format(past[r]))
                    for r in reads if r in past}

        def name_of(sym: str, new_prev: dict[str, str] = new_prev) -> str:
            if sym in past:
                return f"{new_prev[past[sym]]}{at}"
            return ref(sym)
        try:
            body = " + ".join(f"{adjoint[comps[i]]}{at} * {wrap(spell(e, name_of), MUL)}"
                              for i, e in terms)
        except Unprintable:
            continue
        previous.update(new_prev)
        summed[name] = namer(GRADIENT.format(name))
        lines.append(f"{summed[name]}[t] = sum({body})" if rec.vector else
                     f"{summed[name]}[t] = {body}")
    if not lines:
        return text, back, {}, {}
    timed |= set(previous.values())
    if rec.vector:
        lane_names |= set(previous.values())
    full = text + "\n" + "\n".join(lines)
    try:
        return full, Recurrence.parse(full, name=label), previous, summed
    except RecurrenceError:   # a readout the language refuses: the formulas keep them all
        return text, back, {}, {}
