"""Stage 3, scan plans: the order in which the associative combine is applied, as data.

A plan over ``n`` positions is a list of levels; each level is a set of combine steps that may run
at the same time (a barrier separates levels).  Positions hold pairs ``e = (A, b)``.

* ``combine`` step (left, right): ``x[right] = x[right] o x[left]`` (left is the earlier part).
* ``swap`` step (left, right), the Blelloch down-sweep: ``x[left], x[right] = x[right],
  x[left] o x[right]``.

Plans:

* sequential: ``n - 1`` levels of one step each; work ``n - 1``, depth ``n - 1``.
* Blelloch (work-efficient): on ``size = 2**ceil(log2 n)`` positions (the padding holds the
  identity), an up-sweep of ``log2 size`` levels builds a reduction tree; the root is saved as the
  total and replaced by the identity; a down-sweep of ``log2 size`` levels gives the exclusive
  prefixes; shifting them by one and appending the total gives the inclusive scan (no combine).
  Work ``2 (size - 1)``, depth ``2 log2 size``.
* Kogge-Stone (Hillis-Steele): ``log2 size`` levels; at level d every position ``i >= 2**d``
  takes ``x[i] o x[i - 2**d]`` from the previous level (double-buffered); work
  ``size log2 size - (size - 1)``, depth ``log2 size``.
* warp shuffles: Kogge-Stone inside each group of 32 positions (a warp's lanes, trading values
  by shuffles: phase ``shuffle``), then the groups joined in order (phase ``warps``): every
  position of group g takes the last position of group g - 1, already joined. Depth
  ``5 + groups - 1``; on the GPU the first five levels need no barrier, the joins one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Phase = Literal["scan", "up", "down", "shuffle", "warps"]
STRATEGIES = ("sequential", "blelloch", "kogge_stone", "warp_shuffle")
#: the lanes of a warp: the groups that the warp-shuffle plan scans by shuffles
WARP_LANES = 32
MAX_DOT_POSITIONS = 64


@dataclass(frozen=True)
class Step:
    kind: Literal["combine", "swap"]
    left: int
    right: int


@dataclass(frozen=True)
class Level:
    phase: Phase
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class ScanPlan:
    strategy: str
    n: int
    size: int
    levels: tuple[Level, ...]

    @property
    def work(self) -> int:
        """Number of combines."""
        return sum(len(level.steps) for level in self.levels)

    @property
    def depth(self) -> int:
        """Number of levels (barriers between them)."""
        return len(self.levels)

    def as_text(self) -> str:
        lines = [f"{self.strategy} scan over n={self.n} (size {self.size}): "
                 f"work {self.work} combines, depth {self.depth} levels"]
        for i, level in enumerate(self.levels[:64]):
            steps = " ".join(f"{s.left}->{s.right}" if s.kind == "combine" else
                             f"{s.left}<->{s.right}" for s in level.steps[:16])
            more = f" ... (+{len(level.steps) - 16})" if len(level.steps) > 16 else ""
            lines.append(f"  level {i:2d} [{level.phase:4s}] {steps}{more}")
        if len(self.levels) > 64:
            lines.append(f"  ... {len(self.levels) - 64} more levels")
        if self.strategy == "blelloch":
            lines.append("  then: inclusive[i] = exclusive[i+1], inclusive[size-1] = total")
        return "\n".join(lines)

    def to_dot(self, highlight_level: int | None = None) -> str:
        """A graphviz DOT picture: nodes are partial results, edges are combines, by level."""
        return _plan_dot(self, highlight_level)


def warp_levels(n: int, strides: tuple[int, ...] = (1, 2, 4, 8, 16)) -> tuple[Level, ...]:
    """The warp-shuffle plan over ``n`` positions: a Kogge-Stone level inside every group of
    WARP_LANES positions per stride, then one level per later group joining it to the group
    before (its last position, joined already)."""
    levels = [Level("shuffle", tuple(Step("combine", i - s, i) for i in range(s, n)
                                     if i % WARP_LANES >= s))
              for s in strides if s < n]
    levels += [Level("warps", tuple(Step("combine", g - 1, i)
                                    for i in range(g, min(g + WARP_LANES, n))))
               for g in range(WARP_LANES, n, WARP_LANES)]
    return tuple(levels)


def _ceil_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def make_plan(strategy: str, n: int) -> ScanPlan:
    """Build the plan of ``strategy`` for ``n`` positions."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown scan strategy {strategy!r}; "
                         f"choose one of {', '.join(STRATEGIES)}")
    if not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"a plan needs n >= 1 positions, got {n!r}")
    n = int(n)
    if strategy == "sequential":
        levels = tuple(Level("scan", (Step("combine", i - 1, i),)) for i in range(1, n))
        return ScanPlan(strategy, n, n, levels)
    if strategy == "warp_shuffle":
        return ScanPlan(strategy, n, n, warp_levels(n))
    size = _ceil_pow2(n)
    k = size.bit_length() - 1
    if strategy == "kogge_stone":
        levels = tuple(
            Level("scan", tuple(Step("combine", i - (1 << d), i) for i in range(1 << d, size)))
            for d in range(k))
        return ScanPlan(strategy, n, size, levels)
    up = [Level("up", tuple(Step("combine", r - (1 << d), r)
                            for r in range((1 << (d + 1)) - 1, size, 1 << (d + 1))))
          for d in range(k)]
    down = [Level("down", tuple(Step("swap", r - (1 << d), r)
                                for r in range((1 << (d + 1)) - 1, size, 1 << (d + 1))))
            for d in reversed(range(k))]
    return ScanPlan(strategy, n, size, tuple(up + down))


def run_plan(plan: ScanPlan, A: np.ndarray, b: np.ndarray, init: np.ndarray | None = None
             ) -> np.ndarray:
    """Execute ``plan`` with NumPy over elements ``A`` (..., n, S, S), ``b`` (..., n, S).

    Returns the states ``s_t`` (..., n, S) given ``s_{-1} = init`` (zero by default): each
    inclusive prefix ``(P_t, q_t)`` applied to ``init``.
    """
    from explorer.passes.affine import AffineForm

    *batch, n, S = b.shape
    if n != plan.n:
        raise ValueError(f"the plan is for n={plan.n}, the data has n={n}")
    xa = np.broadcast_to(np.eye(S), (*batch, plan.size, S, S)).copy()
    xb = np.zeros((*batch, plan.size, S))
    xa[..., :n, :, :] = A
    xb[..., :n, :] = b
    comb = AffineForm.combine
    total: tuple[np.ndarray, np.ndarray] | None = None
    for level in plan.levels:
        if plan.strategy == "blelloch" and level.phase == "down" and total is None:
            total = (xa[..., -1, :, :].copy(), xb[..., -1, :].copy())
            xa[..., -1, :, :] = np.eye(S)
            xb[..., -1, :] = 0.0
        old_a, old_b = xa.copy(), xb.copy()  # every step of a level reads the level's inputs
        for st in level.steps:
            la, lb = old_a[..., st.left, :, :], old_b[..., st.left, :]
            ra, rb = old_a[..., st.right, :, :], old_b[..., st.right, :]
            if st.kind == "combine":
                xa[..., st.right, :, :], xb[..., st.right, :] = comb(ra, rb, la, lb)
            else:
                xa[..., st.left, :, :], xb[..., st.left, :] = ra, rb
                xa[..., st.right, :, :], xb[..., st.right, :] = comb(la, lb, ra, rb)
    if plan.strategy == "blelloch":
        if total is None:  # size 1: no levels, the element is its own prefix
            total = (xa[..., -1, :, :].copy(), xb[..., -1, :].copy())
        xa = np.concatenate([xa[..., 1:, :, :], total[0][..., None, :, :]], axis=-3)
        xb = np.concatenate([xb[..., 1:, :], total[1][..., None, :]], axis=-2)
    xa, xb = xa[..., :n, :, :], xb[..., :n, :]
    s0 = np.zeros((*batch, S)) if init is None else init
    return np.einsum("...tij,...j->...ti", xa, s0) + xb


# ----------------------------------------------------------------------------------------------
# Picture
# ----------------------------------------------------------------------------------------------
_PHASE_COLOR = {"up": "#1a73e8", "down": "#e8710a", "scan": "#188038", "shuffle": "#9334e6",
                "warps": "#129eaf"}
_LEGEND = {"blelloch": "blue: up-sweep, orange: down-sweep",
           "kogge_stone": "green: one level of combines each", "sequential": "one combine a level",
           "warp_shuffle": "purple: shuffles inside a warp, teal: warps joined in order"}


def _plan_dot(plan: ScanPlan, highlight: int | None) -> str:
    if plan.size > MAX_DOT_POSITIONS:
        raise ValueError(f"the picture is drawn for n <= {MAX_DOT_POSITIONS} "
                         f"(this plan has {plan.size} positions)")
    L = plan.levels
    lines = [
        "digraph plan {",
        '  graph [rankdir=TB, nodesep=0.15, ranksep=0.35, fontname="Helvetica", labelloc=t,',
        f'         label="{plan.strategy}: n={plan.n}, work={plan.work} combines, '
        f'depth={plan.depth} levels ({_LEGEND.get(plan.strategy, "")})"];',
        '  node [shape=circle, width=0.32, fixedsize=true, fontsize=9, fontname="Helvetica"];',
        "  edge [arrowsize=0.5];",
    ]
    current = {i: f"x0_{i}" for i in range(plan.size)}
    rank0 = []
    for i in range(plan.size):
        style = ', style=dashed, color="#9aa0a6"' if i >= plan.n else ""
        rank0.append(f'x0_{i} [label="{i}"{style}]')
    lines.append("  { rank=same; " + "; ".join(rank0) + " }")
    lines.append("  " + " -> ".join(current[i] for i in range(plan.size)) + " [style=invis];")
    for li, level in enumerate(L, start=1):
        color = _PHASE_COLOR[level.phase]
        hot = highlight is not None and highlight == li - 1
        dim = highlight is not None and not hot
        pen = 2.4 if hot else 1.0
        ecolor = "#dadce0" if dim else color
        touched: set[int] = set()
        for st in level.steps:
            touched.update((st.right,) if st.kind == "combine" else (st.left, st.right))
        new = {i: f"x{li}_{i}" for i in range(plan.size)}
        rank = []
        for i, node in new.items():
            if i in touched:
                fill = color if hot else "white"
                font = "white" if hot else "black"
                rank.append(f'{node} [label="{i}", color="{ecolor}", style=filled, '
                            f'fillcolor="{fill}", fontcolor="{font}"]')
            else:  # a value carried unchanged to the next level
                rank.append(f'{node} [shape=point, width=0.04, color="#dadce0"]')
                lines.append(f'  {current[i]} -> {node} [color="#eeeeee", arrowhead=none];')
        lines.append(f'  {{ rank=same; {"; ".join(rank)} }}')
        lines.append("  " + " -> ".join(new[i] for i in range(plan.size)) + " [style=invis];")
        for st in level.steps:
            if st.kind == "combine":
                lines.append(f"  {current[st.left]} -> {new[st.right]} "
                             f'[color="{ecolor}", penwidth={pen}];')
                lines.append(f'  {current[st.right]} -> {new[st.right]} [color="{ecolor}", '
                             f"penwidth={pen}];")
            else:
                lines.append(f'  {current[st.right]} -> {new[st.left]} [color="{ecolor}", '
                             f"style=dashed, penwidth={pen}];")
                lines.append(f"  {current[st.left]} -> {new[st.right]} "
                             f'[color="{ecolor}", penwidth={pen}];')
                lines.append(f'  {current[st.right]} -> {new[st.right]} [color="{ecolor}", '
                             f"penwidth={pen}];")
        current = new
    lines.append("}")
    return "\n".join(lines)
