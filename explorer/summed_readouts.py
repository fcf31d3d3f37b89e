"""Gradients summed over the state axis in the adjoint's own kernel: readouts of the adjoint.

For an input ``x[t]`` without the axis n of a vector recurrence, the scan terms of its gradient
are ``sum_n lam[t, n] * (dA_t/dx s_{t-1} + db_t/dx)[n]``: a lane-summed readout of the adjoint
recurrence (:func:`summed_readouts`), which :mod:`explorer.autodiff` adds to the backward it
derives.  Where the step's own state can stand for the past one (:func:`through_state`:
``dA_t/dx s_{t-1} = q (s_t - b_t)``), the readout reads the forward's saved ``h[t]`` where it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from explorer.errors import RecurrenceError
from explorer.frontend.recurrence import Recurrence
from explorer.passes.affine import AffineForm, LaneSum, state_symbol, symbol
from explorer.spelling import MUL, Unprintable, spell, wrap

PREVIOUS = "fwd_{}_prev"  # the forward's h[t-1], read by a gradient summed in the adjoint
TRAJECTORY = "fwd_{}"     # the forward's h[t], read by the adjoint
GRADIENT = "grad_sum_{}"  # a gradient summed over n in the adjoint's kernel (a readout)
LANE_GRADIENT = "grad_lane_{}"  # a lane input's gradient, a lane readout of the adjoint


def through_state(form: AffineForm, scan_terms: dict[str, list[tuple[int, sympy.Expr]]],
                  names: Sequence[str]) -> dict[str, list[tuple[int, sympy.Expr]]]:
    """The scan terms of ``names`` with the past state written through the step's own state,
    where that is exact and keeps float32's accuracy: name -> rewritten terms (the others are
    left out).

    For a first-order state (one component: ``s_t = A_t s_{t-1} + b_t``, scalar or one lane of
    a diagonal state), ``A_t s_{t-1} = s_t - b_t``.  So where ``dA_t/dx = q A_t``, the term
    ``dA_t/dx s_{t-1} + db_t/dx`` is ``q (s_t - b_t) + db_t/dx``: it reads the saved trajectory
    ``s_t`` at its own step, no copy of it shifted (for the selective scan's ``dt``,
    ``A exp(A dt) h[t-1] + B x`` becomes ``A (h[t] - dt B x) + B x``, one ``exp`` fewer too).  At
    t = 0 the identity holds with the initial state (the forward computed ``s_0 = A_0 h0 +
    b_0``), so no step is special.  The difference ``s_t - b_t`` cancels where the gate forgets
    (``A_t`` near 0): its rounding, about ``eps |q b_t|``, must stay small against the
    companion ``db_t/dx``.  So the rewrite is taken only where ``q b_t / (db_t/dx)`` is a
    constant times ``log A_t`` (the error then grows with the gate's exponent, not with
    ``1 / A_t``: ``A dt`` for ``exp(A dt)``, the Mamba preset's ``A softplus(dt + dt_bias)``).
    A term without ``db_t/dx`` (``exp(A dt)``'s ``A``: all cancellation) keeps ``s_{t-1}``, as
    does ``A_t = a[t]`` (``q = 1/a``) and ``sigmoid(g)`` or ``exp(-softplus(g))`` gates."""
    if form.size != 1:
        return {}
    (state, _), = form.components
    A_t, b_t = form.A[0, 0], form.b[0]
    if A_t == 0 or not A_t.free_symbols:
        return {}
    prev, now = state_symbol(state, 1), state_symbol(state, 0)
    log_gate = sympy.expand_log(sympy.log(A_t), force=True)
    out: dict[str, list[tuple[int, sympy.Expr]]] = {}
    for name in names:
        if name not in scan_terms:
            continue
        x = symbol(name)
        d_a, d_b = sympy.diff(A_t, x), sympy.diff(b_t, x)
        if d_a == 0 or d_b == 0:
            continue
        q = sympy.diff(log_gate, x)   # d_a / A_t, as the gate spells it (no exp split)
        if {prev, now} & q.free_symbols or \
                sympy.fraction(sympy.together(q))[1].is_positive is not True:
            continue
        ratio = sympy.simplify(q * b_t / d_b / log_gate)
        if not ratio.is_number or ratio == 0:
            continue
        out[name] = [(i, q * (now - b_t) + d_b) for i, _ in scan_terms[name]]
    return out


def summed_readouts(rec: Recurrence, comps: Sequence[tuple[str, int]],
                     adjoint: dict[tuple[str, int], str],
                     scan_terms: dict[str, list[tuple[int, sympy.Expr]]], namer: Callable[..., str],
                     text: str, back: Recurrence, label: str, timed: set[str],
                     lane_names: set[str], ref: Callable[[str], str],
                     trajectory: dict[str, str],
                     readout_terms: dict[str, list[tuple[str, sympy.Expr]]] | None = None,
                     cotangent: dict[str, str] | None = None
                     ) -> tuple[str, Recurrence, dict[str, str], dict[str, str],
                                dict[str, str]]:
    """Readouts of the adjoint recurrence that give the scan terms of a gradient (summed over n
    for a vector recurrence).

    For an input ``x[t]`` without the axis n of a vector recurrence, the scan terms of
    ``dL/dx[t]`` are ``sum_n lam[t, n] * (dA_t/dx s_{t-1} + db_t/dx)[n]``: a lane-summed readout
    of the adjoint, which a lane-loop plan reduces in the adjoint's own kernel (the B x D x N x L
    products are never laid out). The past states ``s[t-1]`` enter as inputs
    ``fwd_<state>_prev[t, n]``, the states at t (terms rewritten by :func:`through_state`) as
    ``fwd_<state>[t, n]`` (added to ``trajectory``, the forward's trajectories the adjoint
    reads). Terms the language cannot spell, or that read a state two or
    more steps back, stay with the elementwise formulas. For a scalar state the readout is the
    term itself, ``lam[t] * (dA_t/dx s_{t-1} + db_t/dx)`` (``grad_sum_a[t] = lam_h[t] *
    fwd_h_prev[t]`` for ``h[t] = a[t] * h[t-1] + b[t]``: the adjoint's kernel writes the
    gradient of ``a``), except where it is ``lam`` itself (the gradient of ``b``).

    A timed input with the axis n (Mamba's ``B[t, n]``, ``C[t, n]``) has its whole gradient as a
    **lane readout** of the adjoint (``grad_lane_B[t, n] = lam_h[t, n] * (dt[t] * x[t])``,
    ``grad_lane_C[t, n] = grad_y[t] * fwd_h[t, n]``: its scan terms and its readouts' terms,
    ``readout_terms`` with the cotangents ``cotangent``; None: no lane readouts), which the
    kernel adds into a row that the channels sharing the input's row share. Returns the
    adjoint's text and recurrence (with the readouts, when any), the past-state inputs, input
    -> summed readout and input -> lane readout."""
    previous: dict[str, str] = {}
    summed: dict[str, str] = {}
    laned: dict[str, str] = {}
    lines: list[str] = []
    past = {state_symbol(st, 1).name: st for st in rec.states}
    now = {state_symbol(st, 0).name: st for st in rec.states}
    traj = dict(trajectory)   # the states the readouts read at t (through_state)
    lane_of = set(rec.lane_names)
    at = "[t, n]" if rec.vector else "[t]"
    for name in rec.inputs:
        terms = scan_terms.get(name, [])
        if name in lane_of:
            if readout_terms is None:   # lane gradients not asked for: the formulas keep them
                continue
            line = _lane_gradient(name, terms, readout_terms.get(name, []), comps,
                                  adjoint, cotangent or {}, past, now, previous, traj, namer,
                                  ref)
            if line is not None:
                laned[name] = line[0]
                lines.append(line[1])
            continue
        if not terms or any(comps[i][1] for i, _ in terms):
            continue
        if not rec.vector and len(terms) == 1 and terms[0][1] == 1:
            continue   # the gradient is lam itself
        found = _state_inputs([e for _, e in terms], past, now, previous, traj, namer, ref, at)
        if found is None:
            continue
        new_prev, new_traj, name_of = found
        try:
            body = " + ".join(f"{adjoint[comps[i]]}{at} * {wrap(spell(e, name_of), MUL)}"
                              for i, e in terms)
        except Unprintable:
            continue
        previous.update(new_prev)
        traj.update(new_traj)
        summed[name] = namer(GRADIENT.format(name))
        lines.append(f"{summed[name]}[t] = sum({body})" if rec.vector else
                     f"{summed[name]}[t] = {body}")
    if not lines:
        return text, back, {}, {}, {}
    full = text + "\n" + "\n".join(lines)
    try:
        parsed = Recurrence.parse(full, name=label)
    except RecurrenceError:   # a readout the language refuses: the formulas keep them all
        return text, back, {}, {}, {}
    trajectory.update(traj)
    timed |= set(previous.values()) | set(traj.values())
    if rec.vector:
        lane_names |= set(previous.values()) | set(traj.values())
    return full, parsed, previous, summed, laned


def _lane_gradient(name: str, terms: list[tuple[int, sympy.Expr]],
                   readout_terms: list[tuple[str, sympy.Expr]],
                   comps: Sequence[tuple[str, int]], adjoint: dict[tuple[str, int], str],
                   cotangent: dict[str, str], past: dict[str, str], now: dict[str, str],
                   previous: dict[str, str], traj: dict[str, str], namer: Callable[..., str],
                   ref: Callable[[str], str]) -> tuple[str, str] | None:
    """The lane readout of the adjoint that is the gradient of the lane input ``name``: (its
    name, its statement), or None where it cannot be one (a term with a sum over n, a state
    two steps back, nothing to compute). Updates ``previous`` and ``traj`` with the forward's
    states it reads."""
    if not terms and not readout_terms:
        return None
    if any(comps[i][1] for i, _ in terms):
        return None
    exprs = [e for _, e in terms] + [e for _, e in readout_terms]
    if any(e.has(LaneSum) for e in exprs):
        return None   # the derivative of a readout non-linear in a sum over n
    found = _state_inputs(exprs, past, now, previous, traj, namer, ref, "[t, n]")
    if found is None:
        return None
    new_prev, new_traj, name_of = found
    try:
        parts = [f"{adjoint[comps[i]]}[t, n] * {wrap(spell(e, name_of), MUL)}" for i, e in terms]
        parts += [f"{ref(cotangent[r])} * {wrap(spell(e, name_of), MUL)}"
                  for r, e in readout_terms]
    except (Unprintable, KeyError):
        return None
    previous.update(new_prev)
    traj.update(new_traj)
    out = namer(LANE_GRADIENT.format(name))
    return out, f"{out}[t, n] = " + " + ".join(parts)


def _state_inputs(exprs: Sequence[sympy.Expr], past: dict[str, str], now: dict[str, str],
                  previous: dict[str, str], traj: dict[str, str], namer: Callable[..., str],
                  ref: Callable[[str], str], at: str
                  ) -> tuple[dict[str, str], dict[str, str], Callable[[str], str]] | None:
    """The forward's states that ``exprs`` read as inputs of the adjoint: (state -> its past
    ``fwd_<state>_prev``, state -> its trajectory ``fwd_<state>``, each named anew where not in
    ``previous`` / ``traj`` yet, and the speller's name of a symbol, indexed ``at``); None
    where they read a state two or more steps back (``h[t-2]``: not an input here)."""
    reads = {sym.name for e in exprs for sym in e.free_symbols}
    if any("[" in r and r not in past and r not in now for r in reads):
        return None
    new_prev = {past[r]: previous.get(past[r]) or namer(PREVIOUS.format(past[r]))
                for r in reads if r in past}
    new_traj = {now[r]: traj.get(now[r]) or namer(TRAJECTORY.format(now[r]))
                for r in reads if r in now}

    def name_of(sym: str) -> str:
        if sym in past:
            return f"{new_prev[past[sym]]}{at}"
        if sym in now:
            return f"{new_traj[now[sym]]}{at}"
        return ref(sym)
    return new_prev, new_traj, name_of
