"""Stage: the backward pass of a recurrence, derived by the compiler (reverse mode, with sympy).

The forward is the affine scan of :mod:`explorer.passes.affine`,

    s_t = A_t s_{t-1} + b_t        t = 0 .. L-1,   s_{-1} = (h0, 0, ...)

with readouts ``y_r[t] = f_r(h[t], inputs at t, parameters)``.  Given the cotangents of the
outputs (``dL/dh[t]`` of every state, ``dL/dy_r[t]`` of every readout), the adjoint
``lam[t] = dL/ds_t`` is a scan backwards in time:

    lam[t] = d_t + A_{t+1}^T lam[t+1],   lam[L] = 0
    d_t    = dL/dh[t] (on the components h[t]) + sum_r dL/dy_r[t] * dy_r/dh[t]

:func:`grad` writes this adjoint as a recurrence **in the language** and compiles it like any
other, with ``reverse=True`` (the plan's ``scan.grid {direction = "reverse"}``), so the explorer
shows the backward as its own compile: recurrence, affine form, plan, passes, PTX.  For the
selective scan it reads

    lam_h[t, n] = exp(A[n] * dt_next[t]) * lam_h[t-1, n] + grad_h[t, n] + grad_y[t] * C[t, n]

where ``lam_h[t-1]`` of a reverse scan is ``lam_h[t+1]`` in time.  ``A_{t+1}`` reads the inputs
one step later: the wrapper passes each input that ``A_t`` reads as a second, **shifted** array
``x_next[t] = x[t+1]`` (its last step repeats ``x[L-1]``, a finite value that ``lam[L] = 0``
multiplies).  A direct term ``d_t`` that the language cannot spell (the derivative of ``abs`` or
``max`` in a readout, a readout non-linear in a sum over n) is computed elementwise and passed
as an array instead.  The names the backward introduces (``lam_h``, ``x_next``, ``grad_h``,
``fwd_h``, ``d_h``) are chosen to collide with no name of the recurrence, no reserved name and
no initial-state keyword ``<state>0``: a clash moves them to ``lam_h_2``, ``lam_h_3``, ...

The gradients then follow elementwise from ``lam``, the past states and sympy's derivatives:

    dL/dx[t] = sum_i lam_i[t] (dA_t/dx s_{t-1} + db_t/dx)_i + sum_r dL/dy_r[t] dy_r/dx
    dL/dp    = the same summed over t (a parameter p has no time axis)
    dL/dh0   = (A_0^T lam[0])_h

each summed over the axes its array was broadcast along (the batch, the state axis n of an input
without it).  For an input without the axis n of a vector recurrence, the sum over n of its scan
terms is a **readout of the adjoint** (``grad_sum_dt[t] = sum(lam_h[t, n] * (...))``, the past
state read as an input ``fwd_h_prev[t, n]``, or the saved state at its own step, ``fwd_h[t, n]``,
where :func:`explorer.summed_readouts.through_state` allows): a lane-loop plan reduces it in
the adjoint's own kernel (:func:`explorer.summed_readouts.summed_readouts`; with
``lane_gradients``, an input with the axis n has its gradient as a lane readout, see
:func:`grad`).

**Saved for backward**: the inputs, parameters and initial states given to the forward, and the
forward's state trajectories ``h[t]`` (outputs of the forward anyway): nothing else.
**Recomputed**: the past states ``s_{t-1}`` (shifts of the saved trajectories and ``h0``),
``A_t``, ``b_t``, their derivatives and the readouts' derivatives (elementwise, from the saved
arrays); the adjoint scan itself runs as the compiled backward recurrence.

:mod:`explorer.gradients` writes these formulas once for arrays: :meth:`Backward.vjp` runs them
with NumPy, :mod:`explorer.torch_op` on torch tensors (autograd, ``torch.compile``).  A forward
compiled with ``reverse=True`` is handled by flipping time: its adjoint is a forward scan.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from explorer.adjoint_options import adjoint_defaults
from explorer.errors import RecurrenceError
from explorer.frontend.names import RESERVED_NAMES, h0_name
from explorer.frontend.recurrence import FUNCTIONS, Recurrence
from explorer.passes.affine import AffineForm, LaneSum, decompose, state_symbol, symbol
from explorer.spelling import MUL, Unprintable, spell, to_text, wrap
from explorer.summed_readouts import TRAJECTORY, summed_readouts, through_state

#: how the names of the backward recurrence are formed from those of the forward
ADJOINT = "lam_{}"        # the adjoint of state h: lam_h (lam_h_1 for the companion h[t-1])
NEXT = "{}_next"          # input x one step later: x_next[t] = x[t+1]
COTANGENT = "grad_{}"     # dL/dh[t], dL/dy[t]
DIRECT = "d_{}"           # a direct term passed as an array


# ----------------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------------
class _Namer:
    """Names that collide with nothing taken, nor (for states) their ``<name>0`` keyword."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken) | set(RESERVED_NAMES) | set(FUNCTIONS)

    def __call__(self, base: str, state: bool = False) -> str:
        k = 1
        while True:
            name = base if k == 1 else f"{base}_{k}"
            clash = name in self.taken or (state and h0_name(name) in self.taken)
            if not clash:
                self.taken.add(name)
                if state:
                    self.taken.add(h0_name(name))
                return name
            k += 1


@dataclass(frozen=True)
class BackwardNames:
    """The names of the backward recurrence, by what they stand for in the forward."""

    #: forward component (state, lag) -> its adjoint, a state of the backward
    adjoint: dict[tuple[str, int], str]
    #: forward input -> the input one step later (``x_next[t] = x[t+1]``)
    next: dict[str, str]
    #: forward output (state or readout) -> its cotangent ``dL/d<output>[t]``
    cotangent: dict[str, str]
    #: forward state -> its trajectory ``h[t]``, an input of the backward
    trajectory: dict[str, str]
    #: forward component -> its direct term, when passed as an array
    direct: dict[tuple[str, int], str]
    #: forward state -> its past ``h[t-1]``, an input of the backward (read by ``summed``)
    previous: dict[str, str] = field(default_factory=dict)
    #: forward input -> the readout of the backward that sums its scan terms over n
    summed: dict[str, str] = field(default_factory=dict)

    #: the backward's inputs that are the forward's arrays at another time, read in place by
    #: its compiles (``read_offsets``, the plan's ``scan.read``): for a scalar state ``x_next``
    #: is ``x`` at t + 1 and ``fwd_h_prev`` the saved ``h`` at t - 1 (zero at t = 0 in the
    #: kernel: the gradients add the initial state's share of that step). A vector
    #: recurrence's are passed as shifted copies: read in place, they made its adjoint's lane
    #: loop slower (H100, selective scan, 8 x 1536 x 16 x 2^11, adjoint kernel 3.2 ms: 10.4
    #: ms with ``dt_next`` and ``fwd_h_prev`` in place, 8.0 with ``dt_next`` alone, which
    #: changed 50 of its 1408 PTX instructions and took ptxas from 428 to 760 bytes of spills)
    read_offsets: dict[str, int] = field(default_factory=dict)
    lane: dict[str, str] = field(default_factory=dict)   # input -> its lane readout


# ----------------------------------------------------------------------------------------------
# Derivatives that know the sum over the state axis n
# ----------------------------------------------------------------------------------------------
def lane_diff(expr: sympy.Expr, sym: sympy.Symbol, lane: bool) -> sympy.Expr:
    """``d expr / d sym`` where ``expr`` may hold sums over n (``LaneSum``).

    For ``sym`` with the axis n (``C[t, n]``, ``h[t, n]``) the derivative is taken at one lane:
    ``d sum(e) / d sym[n] = de/dsym`` at that lane.  For ``sym`` without it, the sum stays:
    ``d sum(e) / d sym = sum(de/dsym)``.  The chain rule goes through the sums (a readout may be
    non-linear in them: ``sum(C * h) ** 2``).
    """
    sums = sorted(expr.atoms(LaneSum), key=sympy.default_sort_key)
    if not sums:
        return sympy.diff(expr, sym)
    held = [sympy.Dummy(f"sum{k}", real=True) for k in range(len(sums))]
    outer = expr.xreplace(dict(zip(sums, held)))
    out = sympy.diff(outer, sym)
    for s, h in zip(sums, held):
        inner = sympy.diff(s.args[0], sym)
        if inner == 0:
            continue
        out += sympy.diff(outer, h) * (inner if lane else LaneSum(inner))
    return out.xreplace(dict(zip(held, sums)))


# ----------------------------------------------------------------------------------------------
# The backward recurrence
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backward:
    """The backward of a recurrence: its adjoint recurrence and the gradient formulas."""

    forward: Recurrence
    form: AffineForm
    #: the adjoint scan, a recurrence of the language (compile it with ``reverse=True``)
    text: str
    recurrence: Recurrence
    names: BackwardNames
    #: component index -> its direct term d_t (sympy; symbols: cotangents, h[t], inputs)
    direct: dict[int, sympy.Expr]
    #: input or parameter -> [(component i, (dA/dx s_{t-1} + db/dx)_i)]
    scan_terms: dict[str, list[tuple[int, sympy.Expr]]]
    #: input or parameter -> [(readout, dy/dx)]
    readout_terms: dict[str, list[tuple[str, sympy.Expr]]]
    #: state -> [(component i, A[i, h])]: dL/dh0 = sum_i lam_i[0] A_0[i, h]
    h0_terms: dict[str, list[tuple[int, sympy.Expr]]]
    #: what the arrays evaluate: the direct terms and the gradient terms above with their
    #: common subexpressions (``exp(A*dt)`` of dL/ddt and dL/dA ...) named once, in ``shared``
    #: (symbol name -> expression, each reading only those before it)
    shared: dict[str, sympy.Expr]
    reduced: dict[tuple[str, str, Any], sympy.Expr]

    # -- views ---------------------------------------------------------------------------------
    def as_text(self) -> str:
        return self.text

    def summary(self) -> str:
        """The adjoint recurrence and every gradient formula, as text."""
        lines = ["adjoint scan (compiled with reverse=True: lam[t-1] is lam[t+1] in time):",
                 *("  " + line for line in self.text.splitlines()), ""]
        n = self.names
        shifted = ([f"{v}[t] = {k}[t+1]" for k, v in n.next.items()]
                   + [f"{v}[t] = {s}[t-1]" for s, v in n.previous.items()])
        if shifted:
            how = ("read in place by the adjoint's kernels, scan.read" if n.read_offsets
                   else "passed as shifted copies")
            lines.append(f"the forward's arrays at other times ({how}): " + ", ".join(shifted))
        if n.trajectory:
            lines.append("the forward's saved states read at their own step: " + ", ".join(
                f"{v}[t] = {s}[t]" for s, v in n.trajectory.items()))
        comps = self.form.components
        lam = {i: n.adjoint[c] for i, c in enumerate(comps)}
        for name in (*self.forward.inputs, *self.forward.params):
            if name in n.lane or name in n.summed:   # readouts of the adjoint's kernel
                parts = [f"{n.lane[name]}  (the adjoint's lane readout, summed in its kernel "
                         "over the channels that share a row)" if name in n.lane else
                         f"{n.summed[name]}  (the adjoint's readout)"]
            else:
                parts = [f"{lam[i]} * ({sympy.sstr(e)})"
                         for i, e in self.scan_terms.get(name, [])]
            parts += [f"{n.cotangent[r]} * ({sympy.sstr(e)})" for r, e in
                      ([] if name in n.lane else self.readout_terms.get(name, []))]
            total = " + ".join(parts) or "0"
            over = "" if name in self.forward.inputs else "  summed over t"
            lines.append(f"dL/d{name} = {total}{over}")
        for s, terms in self.h0_terms.items():
            total = " + ".join(f"{lam[i]}[0] * ({sympy.sstr(e)})" for i, e in terms) or "0"
            lines.append(f"dL/d{h0_name(s)} = {total}   (A at t = 0)")
        return "\n".join(lines)

    # -- compiling -----------------------------------------------------------------------------
    def compile(self, target: str = "cuda", strategy: str = "blelloch", **options: Any) -> Any:
        """Compile the adjoint scan through the whole pipeline: a :class:`Compiled` with
        ``reverse=True`` (its ``lam[t-1]`` is ``lam[t+1]`` in time), cached like any compile.

        Every output is stored (``outputs="all"``: the gradients read the adjoints and the
        summed readouts); the forward's arrays it reads at another time are read in place
        (``read_offsets``: :attr:`BackwardNames.read_offsets`). On the GPU the Blelloch adjoint
        of a vector recurrence takes direct tiles unless ``tile_layout`` is given, of its
        own size unless one is, and its parameters a row per channel unless ``param_rows`` is
        given (:func:`explorer.adjoint_options.adjoint_defaults`)."""
        from explorer.compiler import compile as _compile
        from explorer.errors import OptionError

        if "reverse" in options:
            raise OptionError("the adjoint scan always runs backwards in time (reverse=True)")
        options.setdefault("outputs", "all")
        if self.names.read_offsets:
            options.setdefault("read_offsets", self.names.read_offsets)
        options.update(adjoint_defaults(target, strategy, self.forward.vector, options))
        return _compile(self.recurrence, target=target, strategy=strategy, reverse=True,
                        **options)

    # -- NumPy gradients -----------------------------------------------------------------------
    def vjp(self, cotangents: Mapping[str, Any], outputs: Mapping[str, Any] | None = None,
            target: str = "cpu", strategy: str = "blelloch",
            options: Mapping[str, Any] | None = None, L: int | None = None,
            **arrays: Any) -> dict[str, np.ndarray]:
        """The gradients of ``sum_o <cotangents[o], o>`` with respect to every array given.

        ``arrays`` are the forward's inputs, parameters and (optionally) initial states, as for
        ``compiled(**arrays)``; ``cotangents`` maps outputs (states, readouts) to arrays shaped
        like them (missing ones are zero); ``outputs`` holds the forward's states (computed
        here when not given).  The adjoint scan runs compiled for ``target`` with ``strategy``
        and ``options`` (``reverse=True`` in ``options`` means that the forward is a reverse
        scan); the elementwise parts run in float64.  Returns name -> gradient, shaped like
        the array given.
        """
        from explorer.compiler import compile as _compile

        rec = self.forward
        opts = dict(options or {})
        reverse = bool(opts.pop("reverse", False))
        if opts.pop("read_offsets", None):
            raise ValueError("vjp differentiates the recurrence as written: no read_offsets "
                             "(the adjoint's own are chosen by compile())")
        known = set(rec.inputs) | set(rec.params) | {h0_name(s) for s in rec.states}
        extra = sorted(set(arrays) - known)
        if extra:
            raise ValueError(f"unexpected arrays: {', '.join(extra)}")
        device = "cpu" if target == "cpu" else None
        if outputs is None:
            # the states are what the gradients need: every output stored
            fwd = _compile(rec, target=target, strategy=strategy, reverse=reverse,
                           **{**opts, "outputs": "all"})
            out = fwd(device=device, L=L, **arrays)
            outputs = out if isinstance(out, dict) else {self.form.outputs[0]: out}
        # the adjoint stores its states, its only outputs
        back = self.compile(target=target, strategy=strategy,
                            **{k: v for k, v in opts.items() if k != "outputs"})

        def scan(call: dict[str, Any], sums: Any = None) -> dict[str, Any]:
            res = back(device=device, **call)
            res = res if isinstance(res, dict) else {back.form.outputs[0]: res}
            return {k: np.asarray(v, dtype=np.float64) for k, v in res.items()}

        given = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
        states = {s: np.asarray(outputs[s], dtype=np.float64) for s in rec.states}
        cots = {k: np.asarray(v, dtype=np.float64) for k, v in cotangents.items()
                if v is not None}
        from explorer.gradients import NUMPY, gradients

        return gradients(self, NUMPY, given, states, cots, scan, reverse=reverse,
                         in_place=dict(back.options.get("read_offsets") or ()))


_CACHE: dict[tuple[str, bool], Backward] = {}
_LOCK = threading.Lock()


def grad(rec: Recurrence | str, lane_gradients: bool = False) -> Backward:
    """The backward of a recurrence (or its text): adjoint recurrence and gradient formulas;
    ``.compile(...)`` compiles the adjoint, ``.vjp(...)`` runs it with NumPy. ``lane_gradients``:
    an input with the axis n gets its gradient as a lane readout of the adjoint (added by its
    kernel into the rows channels share), not from formulas after it. Off by default: H100,
    selective scan at 8 x 1536 x 16 x 2^11 (B, C per batch row), the adjoint kernel 2.12 ->
    4.45 ms, above the formulas it replaces (1.2 ms), added or stored (4.55), any occupancy."""
    if isinstance(rec, str):
        rec = Recurrence.parse(rec)
    elif not isinstance(rec, Recurrence):
        raise TypeError(f"grad() takes a Recurrence or its text, not {type(rec).__name__}")
    key = (rec.text, bool(lane_gradients))
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is None:
        hit = _derive(rec, bool(lane_gradients))
        with _LOCK:
            _CACHE[key] = hit
    return hit


def _derive(rec: Recurrence, lane_gradients: bool = False) -> Backward:
    form = decompose(rec)
    comps = form.components
    S = form.size
    vector = rec.vector
    A, b = form.A, form.b
    lane_of = set(rec.lane_names)

    # --- names -------------------------------------------------------------------------------
    user = set(rec.inputs) | set(rec.params) | set(rec.states) | set(rec.readouts)
    user |= {h0_name(s) for s in rec.states}
    namer = _Namer(user)
    adjoint = {c: namer(ADJOINT.format(c[0] if c[1] == 0 else f"{c[0]}_{c[1]}"), state=True)
               for c in comps}
    a_inputs = sorted({s.name for e in A for s in e.free_symbols} & set(rec.inputs),
                      key=rec.inputs.index)
    nxt = {x: namer(NEXT.format(x)) for x in a_inputs}
    cot = {o: namer(COTANGENT.format(o)) for o in form.outputs}

    # --- the direct terms d_t ----------------------------------------------------------------
    direct: dict[int, sympy.Expr] = {}
    for i, (s, lag) in enumerate(comps):
        if lag:
            continue
        d = symbol(cot[s])
        h_t = state_symbol(s, 0)
        for r, y in form.readouts.items():
            dy = lane_diff(y, h_t, vector)
            if dy != 0:
                d += symbol(cot[r]) * dy
        direct[i] = d
    used_h = {sym.name for d in direct.values() for sym in d.free_symbols}
    trajectory = {s: namer(TRAJECTORY.format(s)) for s in rec.states
                  if state_symbol(s, 0).name in used_h}
    lane_names = set(lane_of)
    if vector:
        lane_names |= {adjoint[c] for c in comps} | {cot[s] for s in rec.states}
        lane_names |= {cot[r] for r in rec.lane_readouts}
        lane_names |= set(trajectory.values())
    lane_names |= {nxt[x] for x in a_inputs if x in lane_of}
    timed = set(rec.inputs) | set(nxt.values()) | set(cot.values()) | set(trajectory.values())
    alias = {state_symbol(s, 0).name: v for s, v in trajectory.items()}

    def ref(name: str) -> str:
        name = alias.get(name, name)
        if name in timed:
            return f"{name}[t, n]" if name in lane_names else f"{name}[t]"
        return f"{name}[n]" if name in lane_names else name

    # --- the adjoint statements --------------------------------------------------------------
    shift = {symbol(x): symbol(v) for x, v in nxt.items()}
    lag_index = ", n" if vector else ""

    def statements(spelled: bool) -> tuple[str, dict[tuple[str, int], str]]:
        """The adjoint recurrence; with ``spelled``, the direct terms the language can spell
        are written into it, the others (all, without) become arrays."""
        arrays: dict[tuple[str, int], str] = {}
        lines = []
        for i, c in enumerate(comps):
            terms = []
            for j, cj in enumerate(comps):
                if A[j, i] == 0:
                    continue
                coeff = A[j, i].xreplace(shift)
                past = f"{adjoint[cj]}[t-1{lag_index}]"
                if coeff == 1:
                    terms.append(past)
                elif coeff == -1:
                    terms.append(f"-{past}")
                else:
                    terms.append(f"{wrap(spell(coeff, ref), MUL)} * {past}")
            if all(A[i, j] == 0 for j in range(S)):
                # nothing reads this adjoint: keep it a state (its own past, times 0)
                terms.append(f"0 * {adjoint[c]}[t-1{lag_index}]")
            if i in direct:
                try:
                    if not spelled:
                        raise Unprintable("every direct term is an array")
                    terms.append(spell(direct[i], ref)[0])
                except Unprintable:
                    arrays[c] = direct_names.get(c) or namer(DIRECT.format(
                        c[0] if c[1] == 0 else f"{c[0]}_{c[1]}"))
                    direct_names[c] = arrays[c]
                    timed.add(arrays[c])
                    if vector:
                        lane_names.add(arrays[c])
                    terms.append(ref(arrays[c]))
            lhs = f"{adjoint[c]}[t, n]" if vector else f"{adjoint[c]}[t]"
            body = " + ".join(terms) if terms else "0"
            lines.append(f"{lhs} = {body}".replace("+ -", "- "))
        return "\n".join(lines), arrays

    direct_names: dict[tuple[str, int], str] = {}
    label = f"backward of {rec.name or 'the recurrence'}"
    text, direct_arrays = statements(spelled=True)
    try:
        back = Recurrence.parse(text, name=label)
    except RecurrenceError:   # a spelled derivative the parser refuses (a constant's range...)
        text, direct_arrays = statements(spelled=False)
        back = Recurrence.parse(text, name=label)

    # --- gradient formulas -------------------------------------------------------------------
    prev = [state_symbol(s, lag + 1) for s, lag in comps]
    scan_terms: dict[str, list[tuple[int, sympy.Expr]]] = {}
    readout_terms: dict[str, list[tuple[str, sympy.Expr]]] = {}
    for name in (*rec.inputs, *rec.params):
        x = symbol(name)
        for i, (_, lag) in enumerate(comps):
            if lag:
                continue   # companion rows are constant
            e = sum((sympy.diff(A[i, j], x) * prev[j] for j in range(S)), sympy.Integer(0))
            e = e + sympy.diff(b[i], x)
            if e != 0:
                scan_terms.setdefault(name, []).append((i, e))
        for r, y in form.readouts.items():
            dy = lane_diff(y, x, name in lane_of)
            if dy != 0:
                readout_terms.setdefault(name, []).append((r, dy))
    h0_terms = {s: [(i, A[i, form.component_index(s)]) for i in range(S)
                    if A[i, form.component_index(s)] != 0] for s in rec.states}
    previous: dict[str, str] = {}
    summed: dict[str, str] = {}
    through = through_state(form, scan_terms, rec.inputs)
    text, back, previous, summed, laned = summed_readouts(
        rec, comps, adjoint, {**scan_terms, **through}, namer, text, back, label, timed,
        lane_names, ref, trajectory, readout_terms if lane_gradients else None, cot)
    # a summed gradient rewritten through h[t] is that readout; the elementwise formulas keep
    # h[t-1] (read without a copy, see explorer.gradients.product)
    scan_terms.update({n: t for n, t in through.items() if n in summed})
    offsets = {} if vector else {**{v: 1 for v in nxt.values()},
                                 **{v: -1 for v in previous.values()}}
    names = BackwardNames(adjoint, nxt, cot, trajectory, direct_arrays, previous, summed,
                          offsets, laned)
    # common subexpressions, named once (evaluated on first use: only what a call needs)
    keys: list[tuple[str, str, Any]] = [("direct", "", i) for i in direct]
    keys += [("scan", n, i) for n, terms in scan_terms.items() for i, _ in terms]
    keys += [("readout", n, r) for n, terms in readout_terms.items() for r, _ in terms]
    exprs = [direct[k[2]] for k in keys if k[0] == "direct"]
    exprs += [e for terms in scan_terms.values() for _, e in terms]
    exprs += [e for terms in readout_terms.values() for _, e in terms]
    fresh = (sympy.Symbol(f"<shared {k}>", real=True) for k in itertools.count())
    pairs, reduced = sympy.cse(exprs, symbols=fresh)
    shared = {sym.name: e for sym, e in pairs}
    return Backward(rec, form, text, back, names, direct, scan_terms, readout_terms, h0_terms,
                    shared, dict(zip(keys, reduced)))


__all__ = ["Backward", "BackwardNames", "Unprintable", "grad", "lane_diff", "to_text"]
