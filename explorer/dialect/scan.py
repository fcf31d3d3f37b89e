"""The ``scan`` dialect: the recurrence, its affine scan and the plan, as MLIR operations.

Defined at run time in IRDL (:data:`IRDL`, loaded into a context by :func:`load`), so the ops
parse and verify like any other dialect's. They carry the program at the level of the
recurrence and of the plan; our passes (:mod:`explorer.passes.pipeline`) rewrite them step by
step, and the last of them replaces them by ``gpu``/``scf``/``memref`` code:

* ``scan.recurrence`` (the text, the roles of the names) and one ``scan.statement`` per line of
  the recurrence, located at its line and column (``loc("recurrence":line:col)``);
* after ``scan-decompose``: ``scan.affine`` (the scan's element ``(A_t, b_t)``: form, state
  dimension, the coefficients) and one ``scan.readout`` per readout;
* after ``scan-plan``: the plan, from the innermost level out: ``scan.thread`` (elements composed
  serially in registers, and moved a vector of them at a time), ``scan.block`` (threads of a
  block and the tree over their aggregates), one ``scan.sweep`` per level of that tree (phase,
  stride, active threads, and ``via``: ``shared`` memory with a barrier after the level, or
  ``shuffle`` in registers inside a warp), ``scan.grid`` (how a sequence is spread
  over blocks), ``scan.store`` (the outputs the kernels write) and, for a vector state with
  readouts, ``scan.lane_sum`` (where the sums over the lanes are computed), and with
  ``varlen=True`` ``scan.segments`` (sequences packed along time, the state restarted at each
  start), and one ``scan.read`` per input read in place at another time (``offset``: the
  array is read at ``t + offset`` for step t, zero outside the sequence). The lowering
  reads these ops, so the tree drawn from them is the tree the kernels run.

Every op takes no operands and produces no results; its attributes are its meaning. (IRDL ops
cannot be terminators, so the dialect has no regions: order in the module is program order.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: the op names and their attributes, in the order they are printed
OPS: dict[str, tuple[str, ...]] = {
    "recurrence": ("text", "states", "readouts", "inputs", "params", "lanes"),
    "statement": ("target", "kind", "source"),
    "affine": ("form", "dim", "width", "components", "A", "b"),
    "readout": ("target", "expr", "lane_sum"),
    "thread": ("elements", "vector_width", "layout"),
    "block": ("threads", "tree"),
    "sweep": ("phase", "stride", "active", "via"),
    "grid": ("scheme", "direction", "tile", "min_tiles", "fill", "unchunked_from"),
    "warp_tile": ("sequences", "steps"),
    "lookback": ("lanes", "tiles_per_lane", "elements", "threads", "layout"),
    "short": ("threads", "elements", "longest", "layout"),
    "store": ("outputs",),
    "lane_sum": ("readouts", "scheme"),
    "segments": ("argument", "reset"),
    "read": ("input", "offset"),
    "recompute": ("state", "saved", "every"),
    "adjoint": ("state", "tree", "c"),
    "gradient": ("target", "of", "over", "expr"),
}

#: the dialect in IRDL: every attribute present, of any kind (the passes check their values)
IRDL = "irdl.dialect @scan {\n" + "".join(
    f"  irdl.operation @{name} {{\n"
    + "".join(f"    %{i} = irdl.any\n" for i in range(len(attrs)))
    + ("    irdl.attributes { "
       + ", ".join(f'"{a}" = %{i}' for i, a in enumerate(attrs)) + " }\n" if attrs else "")
    + "  }\n"
    for name, attrs in OPS.items()) + "}\n"

#: the file name of the recurrence in locations (and in the PTX's ``.file``)
SOURCE = "recurrence"


def load(ctx: Any) -> None:
    """Load the dialect into ``ctx`` (once per context)."""
    from mlir.dialects import irdl
    from mlir.ir import Module

    if getattr(ctx, "_scan_dialect_loaded", False):
        return
    with ctx:
        irdl.load_dialects(Module.parse(IRDL))
    try:
        ctx._scan_dialect_loaded = True
    except AttributeError:   # a context wrapper that takes no attributes: load each time
        pass


def attribute(value: Any) -> Any:
    """An MLIR attribute for a Python value (str, bool, int, float, list of those)."""
    from mlir.ir import (
        ArrayAttr,
        BoolAttr,
        F64Type,
        FloatAttr,
        IntegerAttr,
        IntegerType,
        StringAttr,
    )

    if isinstance(value, bool):
        return BoolAttr.get(value)
    if isinstance(value, int):
        return IntegerAttr.get(IntegerType.get_signless(64), value)
    if isinstance(value, float):
        return FloatAttr.get(F64Type.get(), value)
    if isinstance(value, str):
        return StringAttr.get(value)
    if isinstance(value, list | tuple):
        return ArrayAttr.get([attribute(v) for v in value])
    raise TypeError(f"no attribute for {type(value).__name__}")


def value_of(attr: Any) -> Any:
    """The Python value of an attribute made by :func:`attribute`."""
    from mlir.ir import ArrayAttr, BoolAttr, FloatAttr, IntegerAttr, StringAttr

    if hasattr(attr, "maybe_downcast"):
        attr = attr.maybe_downcast()
    if isinstance(attr, BoolAttr | IntegerAttr | FloatAttr | StringAttr):
        return attr.value
    if isinstance(attr, ArrayAttr):
        return [value_of(a) for a in attr]
    raise TypeError(f"unexpected attribute {attr}")


def create(name: str, attrs: Mapping[str, Any], loc: Any = None) -> Any:
    """Create ``scan.<name>`` at the current insertion point."""
    from mlir.ir import Operation

    if name not in OPS:
        raise KeyError(f"scan.{name} is not an op of the dialect")
    missing = set(OPS[name]) - set(attrs)
    if missing:
        raise KeyError(f"scan.{name} needs {', '.join(sorted(missing))}")
    return Operation.create(f"scan.{name}", attributes={k: attribute(attrs[k])
                                                        for k in OPS[name]}, loc=loc)


def ops(module_op: Any, name: str | None = None) -> list[Any]:
    """The top-level ``scan`` ops of a module (of one kind when ``name`` is given)."""
    out = []
    for op in module_op.regions[0].blocks[0].operations:
        full = op.operation.name
        if full.startswith("scan.") and (name is None or full == f"scan.{name}"):
            out.append(op.operation)
    return out


def attrs(op: Any) -> dict[str, Any]:
    """The attributes of a ``scan`` op as Python values."""
    return {name: value_of(op.attributes[name]) for name in op.attributes}


def location(line: int, col: int) -> Any:
    """``loc("recurrence":line:col)`` (columns counted from 1, as MLIR prints them)."""
    from mlir.ir import Location

    return Location.file(SOURCE, line, col + 1)


def erase(op_list: Iterable[Any]) -> None:
    for op in list(op_list):
        op.erase()
