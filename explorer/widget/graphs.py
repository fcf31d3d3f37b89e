"""Pictures for the widget: Graphviz DOT rendered to inline SVG, and the dependence graph of a
recurrence drawn from its recorded affine form (which state at ``t-1`` and which inputs feed which
state at ``t``, and what each readout reads).

Rendering needs the ``dot`` binary; without it :func:`dot_to_svg` returns ``None`` and the widget
says so instead of showing a picture.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.passes.affine import AffineForm

_SVG_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"')


class GraphvizUnavailable(RuntimeError):
    """The Graphviz ``dot`` program is not installed (``apt-get install graphviz``)."""


def dot_to_svg(dot: str, shrink: bool = True) -> str:
    """Render DOT source to an ``<svg>`` element that scales down to the width of its box
    (``shrink=False``: kept at its natural size, for a box that scrolls).

    Raises :class:`GraphvizUnavailable` when ``dot`` is missing and ``ValueError`` when the DOT
    source does not parse.
    """
    import graphviz

    try:
        svg = graphviz.Source(dot).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound as err:
        raise GraphvizUnavailable(
            "Graphviz 'dot' is not installed; install it (apt-get install graphviz) to see graphs"
        ) from err
    except graphviz.CalledProcessError as err:
        raise ValueError(f"Graphviz could not read the graph: {err.stderr!r}") from err
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    # Keep the natural size as the maximum, but let the picture shrink with the output area.
    style = "max-width:100%;height:auto" if shrink else "max-width:none"
    svg = _SVG_SIZE.sub(
        lambda m: (f'<svg style="{style}" width="{m.group(1)}pt" '
                   f'height="{m.group(2)}pt"'),
        svg,
        count=1,
    )
    return svg


def svg_or_message(dot: str | None, shrink: bool = True) -> str:
    """HTML for a DOT graph: the SVG, or an explanation of why there is no picture.

    ``shrink=False`` keeps the picture at its natural size in a box that scrolls sideways (a
    scan tree over 64 threads is unreadable at the width of a notebook)."""
    if not dot:
        return "<i>No graph was recorded for this stage.</i>"
    try:
        if not shrink:
            return ("<div style='overflow-x:auto;max-width:100%'>"
                    f"{dot_to_svg(dot, shrink=False)}</div>")
        return dot_to_svg(dot)
    except (GraphvizUnavailable, ValueError) as err:
        return f'<div style="color:#a00">{html.escape(str(err))}</div>'


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _short(expr: Any, limit: int = 28) -> str:
    text = str(expr)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _names(expr: Any) -> list[str]:
    """The names a sympy expression of the affine form reads."""
    return sorted(str(s) for s in expr.free_symbols)


def dependence_dot(form: AffineForm) -> str:
    """DOT source of the dependence graph recorded in an ``AffineForm``.

    Nodes: every component of the state at ``t-1`` and at ``t``, every input and parameter, every
    readout. Edges: ``A_t[i, j] != 0`` links component ``j`` at ``t-1`` to component ``i`` at ``t``
    (labelled with the coefficient); an input or parameter used by ``A_t[i, :]`` or ``b_t[i]``
    links to component ``i`` at ``t``; readouts link from what they read.
    """
    components = [f"{name}[t]" if lag == 0 else f"{name}[t-{lag}]"
                  for name, lag in form.components]
    previous = [f"{name}[t-1]" if lag == 0 else f"{name}[t-{lag + 1}]"
                for name, lag in form.components]
    inputs = list(form.inputs)
    params = list(form.params)
    lines = [
        "digraph dependence {",
        "  rankdir=LR; nodesep=0.25; ranksep=0.6;",
        ('  node [fontname="Helvetica", fontsize=11, shape=box, style="rounded,filled",'
        ' fillcolor="#ffffff"];'),
        '  edge [fontname="Helvetica", fontsize=9, color="#555555"];',
    ]
    for i, label in enumerate(previous):
        lines.append(f"  prev{i} [label={_quote(label)}, fillcolor=\"#e8eef7\"];")
    for i, label in enumerate(components):
        lines.append(f"  cur{i} [label={_quote(label)}, fillcolor=\"#cfe0f5\", penwidth=1.5];")
    for name in inputs:
        lines.append(f"  in_{name} [label={_quote(name + '[t]')}, shape=ellipse,"
                     " fillcolor=\"#fff4d6\"];")
    for name in params:
        lines.append(f"  in_{name} [label={_quote(name)}, shape=ellipse, style=\"dashed,filled\","
                     " fillcolor=\"#f4f4f4\"];")
    size = len(components)
    for i in range(size):
        used: set[str] = set()
        for j in range(size):
            coeff = form.A[i, j]
            if coeff != 0:
                lines.append(f"  prev{j} -> cur{i} [label={_quote(_short(coeff))}];")
                used.update(_names(coeff))
        used.update(_names(form.b[i]))
        for name in sorted(used):
            if name in inputs or name in params:
                lines.append(f"  in_{name} -> cur{i} [style=dashed];")
    symbol_index = {str(sym): i for i, sym in enumerate(form.state_symbols)}
    for out_name, expr in form.readouts.items():
        lines.append(f"  out_{out_name} [label={_quote(out_name + '[t]')}, shape=box,"
                     " fillcolor=\"#dff2df\"];")
        for name in _names(expr):
            if name in symbol_index:
                lines.append(f"  cur{symbol_index[name]} -> out_{out_name};")
            elif name in inputs or name in params:
                lines.append(f"  in_{name} -> out_{out_name} [style=dashed];")
    lines.append("  { rank=same; " + " ".join(f"prev{i};" for i in range(size)) + " }")
    lines.append("  { rank=same; " + " ".join(f"cur{i};" for i in range(size)) + " }")
    lines.append("}")
    return "\n".join(lines)
