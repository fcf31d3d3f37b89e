"""The options the adjoint scan compiles with where nobody chose them: one rule for
:meth:`explorer.autodiff.Backward.compile` (``ex.grad(rec).compile()``, the torch operator's
backward) and the widget's *backward* toggle (:mod:`explorer.widget.backward`), which sets its
controls to what that compile takes so that the explorer shows the kernel the backward runs.

On the GPU the Blelloch adjoint of a vector recurrence (its lane loop streams every lane's
adjoint out) takes direct tiles (:data:`DIRECT_ADJOINT`) of :data:`ADJOINT_TILE` unless a tile
is chosen, and its parameters a row per channel (``param_rows="channel"``: with the row modulus
ptxas spilled twice the bytes in its lane loop, 116 -> 252, and the kernel took 3.27 ms against
1.95 ms on an H200 at 8 x 1536 x 16 x 2^11; README, *Backward speed*)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the tree strategies whose adjoint lane loop (a vector recurrence's) stores its outputs from
#: registers (``tile_layout="direct"``), not through the stage. H100, selective scan:
#: the Blelloch adjoint kernel 5.30 -> 3.23 ms at 8 x 1536 x 16 x 2^11 and 0.299 -> 0.175 ms at
#: 2 x 512 x 16 x 2^10; one warp of ``warp_shuffle`` ran slower direct (3.36 -> 6.41 ms)
DIRECT_ADJOINT = ("blelloch",)
#: the tile of that direct adjoint (unless given): fewer elements a thread run faster (H100,
#: adjoint at 8 x 1536 x 16 x 2^11 and 2 x 512 x 16 x 2^10: 128 threads by 8 2.94 and 0.159 ms,
#: by 4 2.19 and 0.114, by 2 2.80 and 0.151; 64 by 4 2.12 and 0.102, 256 by 4 2.31 and 0.104)
ADJOINT_TILE = {"block_size": 64, "elements_per_thread": 4}


def chosen_tile(options: Mapping[str, Any]) -> dict[str, Any]:
    """The tile entries of ``options`` (block size, elements a thread) that are not the compile
    defaults: a forward's tile is its adjoint's only where it was chosen (the torch operator,
    the widget's backward toggle); the adjoint picks its own otherwise."""
    from explorer.codegen.options import Options

    defaults = Options()
    return {k: options[k] for k in ADJOINT_TILE
            if k in options and options[k] != getattr(defaults, k)}


def adjoint_defaults(target: str, strategy: str, vector: bool,
                     options: Mapping[str, Any]) -> dict[str, Any]:
    """The options to add to ``options`` (those chosen: an entry missing or ``"auto"`` is
    open) for the adjoint of a recurrence (``vector``: with a lane axis) compiled for
    ``target`` with ``strategy``."""
    if not (target == "cuda" and strategy in DIRECT_ADJOINT and vector):
        return {}
    out: dict[str, Any] = {}
    if options.get("tile_layout", "auto") == "auto":
        out["tile_layout"] = "direct"
        out.update({k: v for k, v in ADJOINT_TILE.items() if k not in options})
    if options.get("param_rows", "auto") == "auto":   # codegen.options.PARAM_ROWS
        out["param_rows"] = "channel"
    return out
