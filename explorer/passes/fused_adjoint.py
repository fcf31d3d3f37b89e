"""The fused backward of a diagonal recurrence: one kernel recomputes the forward's states,
scans the adjoint and reduces every gradient (``compile(text, backward=True)``).

For ``h_t = a_t h_{t-1} + b_t`` (a lane's state a scalar: ``h[t, n]``) and readouts ``y_t``,
the adjoint is ``lam_t = c_t + a_{t+1} lam_{t+1}`` with ``c_t = dL/dh_t`` of the step's own
outputs (``sum_r grad_y_r dy_r/dh_t + grad_h_t``). Its kernel scans ``mu_t = a_t lam_t``
instead, ``mu_t = a_t mu_{t+1} + a_t c_t``: the element at step t is built from the forward's
``a_t`` at the same step (no shifted copy of the inputs), and ``lam_t = c_t + mu_{t+1}`` is the
exclusive scan from the end. The states ``h_{t-1}`` are recomputed tile by tile (``T`` steps)
from the saved state before the tile (``fwd_h`` at ``kT - 1``, the initial state for the first);
every gradient is then a term at a step:

* an input without the axis n (``dt``, ``x``): its lanes' terms summed in registers, plus the
  readouts' terms outside their sums, stored per step (``over = "lanes"``);
* an input with it (``B``, ``C``): a term per step and lane, added into its row by every channel
  that shares it (``over = "rows"``, coalesced atomics through shared memory);
* a parameter with the axis n (``A``): summed over the steps per lane (``over = "time"``);
  without it (``D``): over the steps and lanes (``over = "all"``); each channel adds its sum
  into the parameter's row it reads (the channels that share a row add into it);
* the initial state: ``mu_0`` (``over = "first"``).

This module derives those terms with sympy (:class:`FusedAdjoint`), writes them into the plan
as ``scan.recompute``, ``scan.adjoint`` and one ``scan.gradient`` per gradient, and runs the
same algorithm in NumPy, tile by tile, as a model of the kernel (:func:`run_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from explorer.autodiff import grad, lane_diff
from explorer.errors import OptionError
from explorer.frontend.names import h0_name
from explorer.passes.affine import AffineForm, state_symbol
from explorer.passes.lanesum import LaneSum

NAME = "scan-plan"

#: the adjoint, at a step and lane, in the terms' expressions
LAM = sympy.Symbol("lam[t]", real=True)

#: the tile of the backward kernel: threads of its block, steps a thread (one tile of T steps
#: at a time, from the last). One warp by 16: measured on an H200 (selective scan, the op's
#: whole backward, one run, tiles compiled with ``block_size`` and ``elements_per_thread``):
#: 3.23 ms at 8 x 1536 x 16 x 2^11 against 3.42 to 4.33 for 128 x 4, 128 x 8, 128 x 16,
#: 256 x 8, 64 x 4, 64 x 8, 64 x 16 and 32 x 8; 0.39 ms at 2 x 512 x 16 x 2^10 (0.38 to 0.73)
BACKWARD_TILE = (32, 16)


@dataclass(frozen=True)
class Gradient:
    """One gradient the kernel writes: ``target = d L / d of``, reduced ``over`` (see the
    module docstring); ``lane``: its term at a step and lane (summed as ``over`` says),
    ``outer``: the readouts' term at a step outside their sums (an input or parameter without
    the axis n), whose sums over the lanes (``LaneSum``) the kernel adds up beside."""

    target: str
    of: str
    over: str
    lane: sympy.Expr
    outer: sympy.Expr

    def expr(self) -> str:
        """The term as the plan writes it (``mu[0]`` for the initial state's)."""
        if self.over == "first":
            return "mu[0]"
        parts = [str(e) for e in (self.lane, self.outer) if e != 0]
        return " + ".join(parts) or "0"


@dataclass(frozen=True)
class FusedAdjoint:
    form: AffineForm
    state: str
    saved: str                     # the saved states' argument (``fwd_h``)
    a: sympy.Expr
    b: sympy.Expr
    inject: sympy.Expr             # c_t
    cotangents: dict[str, str]     # forward output -> its cotangent argument
    gradients: tuple[Gradient, ...]
    #: the sums over the lanes the outer terms read, in order (their arguments)
    sums: tuple[sympy.Expr, ...]

    @property
    def h(self) -> sympy.Symbol:
        return state_symbol(self.state, 0)

    @property
    def h_prev(self) -> sympy.Symbol:
        return state_symbol(self.state, 1)

    def by_over(self, over: str) -> list[Gradient]:
        return [g for g in self.gradients if g.over == over]

    def text(self) -> str:
        """The backward as the plan shows it."""
        h, hp = self.h, self.h_prev
        lines = [f"{h} = ({self.a}) * {hp} + {self.b}      recomputed, tile by tile, from the "
                 f"saved {self.saved}",
                 f"mu[t] = ({self.a}) * (mu[t+1] + c[t]),  lam[t] = c[t] + mu[t+1],  "
                 f"c[t] = {self.inject}      backwards in time"]
        for g in self.gradients:
            what = {"lanes": "summed over the lanes, a value per step",
                    "rows": "per step and lane, added into its row",
                    "time": "summed over time per lane, added into the parameter's row",
                    "all": "summed over time and lanes, added into the parameter's row",
                    "first": "mu at the first step"}[g.over]
            lines.append(f"{g.target} = {g.expr()}      ({what})")
        return "\n".join(lines)


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


_DERIVED: dict[tuple[str, bool], FusedAdjoint | str] = {}


def supported(form: AffineForm, states: bool = True) -> str | None:
    """Why the fused backward cannot take ``form``, or None (derived once per recurrence and
    ``states``, see :func:`derive`)."""
    key = (form.recurrence.text, states)
    hit = _DERIVED.get(key)
    if hit is None:
        try:
            hit = derive(form, states)
        except OptionError as err:
            hit = str(err)
        if len(_DERIVED) > 256:
            _DERIVED.clear()
        _DERIVED[key] = hit
    return hit if isinstance(hit, str) else None


def derived(form: AffineForm, states: bool = True) -> FusedAdjoint:
    """:func:`derive`, once per recurrence (what a backward call reads: sympy's derivation
    takes milliseconds)."""
    why = supported(form, states)
    if why is not None:
        raise OptionError(why)
    hit = _DERIVED[(form.recurrence.text, states)]
    assert isinstance(hit, FusedAdjoint)
    return hit


def _unsupported(form: AffineForm) -> str | None:
    rec = form.recurrence
    if form.kind != "diagonal":
        return (f"the fused backward takes a diagonal recurrence (a scalar state per lane, "
                f"h[t, n]); this one is {form.kind}")
    if rec.lane_readouts:
        return "the fused backward takes readouts summed over the lanes, not lane readouts"
    return None


def derive(form: AffineForm, states: bool = True) -> FusedAdjoint:
    """The backward kernel's terms for ``form`` (refused with an :class:`OptionError` where the
    fused backward does not apply). ``states``: the loss reads the states too, so ``c_t`` adds
    their cotangent (an argument); without, only the readouts' (a loss of the readouts alone:
    no state cotangent is read, ``backward="readouts"``)."""
    why = _unsupported(form)
    if why is not None:
        raise OptionError(why)
    rec = form.recurrence
    (state,) = rec.states
    bw = grad(rec)
    names = bw.names
    cot = dict(names.cotangent)
    # the names the kernel's arguments may not take: the recurrence's and the cotangents'
    taken = set(rec.inputs) | set(rec.params) | set(rec.states) | set(rec.readouts) \
        | set(cot.values())
    saved = names.trajectory.get(state) or _fresh(f"fwd_{state}", taken)
    taken |= {saved, h0_name(state)}
    a, b = form.A[0, 0], form.b[0]
    h, hp = state_symbol(state, 0), state_symbol(state, 1)
    lanes = set(rec.lane_names)
    gy = {r: sympy.Symbol(cot[r], real=True) for r in rec.readouts}
    if not states:
        if not rec.readouts:
            raise OptionError("backward='readouts' takes the readouts' cotangents alone; this "
                              "recurrence has no readouts (backward=True reads its states')")
        cot.pop(state)
    inject = (sympy.Symbol(cot[state], real=True) if states else sympy.Integer(0)) + sum(
        (gy[r] * lane_diff(form.readouts[r], h, True) for r in rec.readouts), sympy.Integer(0))
    if inject.atoms(LaneSum):
        raise OptionError("the fused backward takes readouts linear in their sums over the "
                          f"lanes (dL/d{state}[t] = {inject} reads a sum over the lanes)")
    grads: list[Gradient] = []
    sums: list[sympy.Expr] = []
    for x in (*rec.inputs, *rec.params):
        sym = sympy.Symbol(x, real=True)
        lane_x = x in lanes
        scan = sympy.diff(a, sym) * hp + sympy.diff(b, sym)
        terms = [gy[r] * lane_diff(form.readouts[r], sym, lane_x) for r in rec.readouts]
        readout = sympy.Add(*terms)
        if lane_x:
            if readout.atoms(LaneSum):
                raise OptionError(f"the fused backward takes readouts linear in their sums "
                                  f"over the lanes (the gradient of {x} reads one)")
            lane, outer = LAM * scan + readout, sympy.Integer(0)
        else:
            # the readouts' terms are per step (their sums over the lanes, forward sums or
            # derivatives, added up by the kernel in registers beside the lanes' terms)
            lane, outer = LAM * scan, readout
            for s_ in sorted(outer.atoms(LaneSum), key=sympy.default_sort_key):
                if s_.args[0] not in sums:
                    sums.append(s_.args[0])
        over = ("rows" if lane_x else "lanes") if x in rec.inputs else (
            "time" if lane_x else "all")
        grads.append(Gradient(_fresh(f"grad_{x}", taken), x, over, lane, outer))
    grads.append(Gradient(_fresh(f"grad_{h0_name(state)}", taken), h0_name(state), "first",
                          sympy.Integer(0), sympy.Integer(0)))
    return FusedAdjoint(form, state, saved, a, b, inject, cot, tuple(grads),
                        tuple(sums))


# ----------------------------------------------------------------------------------------------
# NumPy model of the kernel: the same tiles, checkpoints, suffix scan and reductions
# ----------------------------------------------------------------------------------------------
def run_model(fa: FusedAdjoint, arrays: dict[str, np.ndarray], saved: np.ndarray,
              cotangents: dict[str, np.ndarray], T: int) -> dict[str, np.ndarray]:
    """The kernel's algorithm in float64 on arrays of the canonical layouts (inputs ``(C, L)``
    or ``(C, N, L)``, parameters ``(C,)`` or ``(C, N)``, the initial state ``(C, N)``): tiles of
    ``T`` steps from the last, each recomputing its states from ``saved`` (``(C, N, L // T)``:
    the state at the last step of each whole tile) at the step before it, the adjoint as the
    suffix scan of ``mu``. Returns the gradients by their targets, per channel (parameters not
    yet summed over rows)."""
    from explorer.passes.numeric import evaluate

    rec = fa.form.recurrence
    lanes = set(rec.lane_names)
    C, N, _ = saved.shape
    L = (arrays[rec.inputs[0]] if rec.inputs else next(iter(cotangents.values()))).shape[-1]
    h0 = arrays.get(h0_name(fa.state), np.zeros((C, N)))

    def env_at(lo: int, hi: int) -> dict[str, Any]:
        env: dict[str, Any] = {}
        for x in rec.inputs:
            v = arrays[x][..., lo:hi]
            env[x] = v if x in lanes else v[:, None, :]
        for p in rec.params:
            v = arrays[p]
            env[p] = v[:, :, None] if p in lanes else v[:, None, None]
        for o, name in fa.cotangents.items():
            v = cotangents.get(o, np.zeros((C, N, L) if o in rec.states else (C, L)))
            v = v[..., lo:hi]
            env[name] = v if o in rec.states else v[:, None, :]
        return env
    out = {g.target: np.zeros((C, N, L) if g.over == "rows" else (C, L) if g.over == "lanes"
                              else (C, N) if g.over in ("time", "first") else (C,))
           for g in fa.gradients}
    mu_next = np.zeros((C, N))
    for k in reversed(range(-(-L // T))):
        lo, hi = k * T, min(L, k * T + T)
        env = env_at(lo, hi)
        shape = (C, N, hi - lo)
        a = np.broadcast_to(evaluate(fa.a, env), shape)
        b = np.broadcast_to(evaluate(fa.b, env), shape)
        hs = np.empty(shape)
        hprev = np.empty(shape)
        h = h0 if k == 0 else saved[:, :, k - 1]
        for j in range(hi - lo):
            hprev[..., j] = h
            h = a[..., j] * h + b[..., j]
            hs[..., j] = h
        env[str(fa.h)], env[str(fa.h_prev)] = hs, hprev
        c = np.broadcast_to(evaluate(fa.inject, env), shape)
        lam = np.empty(shape)
        mu = mu_next
        for j in reversed(range(hi - lo)):
            lam[..., j] = c[..., j] + mu
            mu = a[..., j] * lam[..., j]
        mu_next = mu
        env[str(LAM)] = lam
        for g in fa.gradients:
            if g.over == "first":
                continue
            term = np.broadcast_to(evaluate(g.lane, env), shape)
            outer: Any = 0.0
            if g.outer != 0:
                sums = {s_: sympy.Symbol(f"<sum {i}>") for i, s_ in enumerate(
                    g.outer.atoms(LaneSum))}
                for s_, sym in sums.items():
                    env[sym.name] = np.broadcast_to(evaluate(s_.args[0], env), shape).sum(
                        axis=1, keepdims=True)
                outer = evaluate(g.outer.xreplace(sums), env)
                outer = np.broadcast_to(outer, (C, 1, hi - lo))[:, 0, :]
            if g.over == "rows":
                out[g.target][..., lo:hi] += term
            elif g.over == "lanes":
                out[g.target][..., lo:hi] += term.sum(axis=1) + outer
            elif g.over == "time":
                out[g.target] += term.sum(axis=2)
            else:
                out[g.target] += term.sum(axis=(1, 2)) + np.sum(outer, axis=-1)
    first = fa.by_over("first")[0]
    out[first.target] = mu_next
    return out
