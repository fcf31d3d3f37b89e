"""16-bit arrays in memory, float32 arithmetic: kernel buffers retyped to their contract dtype.

The last step of the lowering (:func:`explorer.codegen.kernels.lower_plan`, pass ``scan-lower``):
the levels emit every kernel over float32 buffers. When the contract gives an argument a
16-bit dtype (``bfloat16`` or ``float16``: the timed inputs of a ``dtype="bfloat16"`` compile,
the outputs unless ``out_dtype="float32"``), :func:`narrow_buffers` retypes that argument in
every function of the module that takes the kernel arguments (the ``gpu.func`` kernels and their
launcher, or the CPU target's grid functions and entry), and each access to it:

* a load becomes a 16-bit load and ``arith.extf`` to f32 (exact: every bf16/f16 value is an
  f32 value), so the arithmetic and the accumulation stay in float32;
* a store becomes ``arith.truncf`` (round to nearest even) and a 16-bit store;
* a wide access (``vector.load``/``vector.store`` of V elements, the tiles of a tree plan)
  becomes one of V 16-bit elements, extended or rounded as a vector; the alignment it claims
  (that of V float32s, which the kernel checked) is halved with the element: still true;
* ``memref.extract_aligned_pointer_as_index`` (the kernel's alignment check) reads the pointer
  alone and is kept.

A buffer reaches its accesses directly or through ``memref.reinterpret_cast`` (the CUDA bare
pointer viewed as a flat memref); any other use is a lowering this pass does not know, and is
refused rather than left half converted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlir.dialects import arith, memref, vector
from mlir.ir import (
    BF16Type,
    DenseElementsAttr,
    F16Type,
    F32Type,
    FunctionType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    MemRefType,
    Type,
    TypeAttr,
    UnitAttr,
    Value,
    VectorType,
    WalkOrder,
    WalkResult,
)

from explorer.codegen.contract import KERNEL_PREFIX
from explorer.errors import CompileError

#: the 16-bit dtypes of the contract and their MLIR element types
NARROW = {"bfloat16": BF16Type.get, "float16": F16Type.get}


def element_type(dtype: str) -> Type:
    """The MLIR element type of a contract dtype (float32, bfloat16 or float16)."""
    if dtype == "float32":
        return F32Type.get()
    return NARROW[dtype]()


def narrow_buffers(module_op: Any, args: Sequence[dict[str, Any]]) -> int:
    """Retype the 16-bit arguments of ``args`` (the contract, in parameter order) in every
    function of the module named after the kernels; returns how many accesses changed."""
    wanted = {i: a["dtype"] for i, a in enumerate(args) if a.get("dtype") in NARROW}
    if not wanted:
        return 0
    changed = 0
    for fn in _functions(module_op):
        block = fn.regions[0].blocks[0]
        if len(block.arguments) < len(args):
            raise CompileError(f"{_name(fn)} takes {len(block.arguments)} arguments, fewer "
                               f"than the {len(args)} of the kernel contract")
        for i, dtype in wanted.items():
            arg = block.arguments[i]
            elem = element_type(dtype)
            arg.set_type(_retyped(arg.type, elem, f"argument {args[i]['name']!r}"))
            changed += _rewrite_uses(arg, elem, args[i]["name"])
        _widen_after_branches(fn)
        _fold_round_trips(fn)
        _unmark(fn)
        # a gpu.func's block has its workgroup buffers after the parameters
        ftype = FunctionType(TypeAttr(fn.attributes["function_type"]).value)
        inputs = [a.type for a in block.arguments][:len(ftype.inputs)]
        results = ftype.results
        fn.attributes["function_type"] = TypeAttr.get(FunctionType.get(inputs, results))
    return changed


def _functions(module_op: Any) -> list[Any]:
    """The functions whose leading parameters are the kernel arguments: every ``gpu.func``
    and ``func.func`` named ``scanweaver_...``."""
    out = []

    def visit(op: Any) -> None:
        op = op.operation
        if op.name in ("gpu.func", "func.func") and _name(op).startswith(KERNEL_PREFIX):
            out.append(op)
            return
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner)
    visit(module_op)
    return out


def _name(fn: Any) -> str:
    return str(fn.attributes["sym_name"]).strip('"')


def _retyped(t: Type, elem: Type, what: str) -> Type:
    mt = MemRefType(t)
    if not isinstance(mt.element_type, F32Type) and str(mt.element_type) != "f32":
        raise CompileError(f"{what} is a memref of {mt.element_type}, not of f32")
    return MemRefType.get(mt.shape, elem, mt.layout, mt.memory_space)


def _rewrite_uses(value: Value, elem: Type, name: str) -> int:
    changed = 0
    for use in list(value.uses):
        op = use.owner.operation if hasattr(use.owner, "operation") else use.owner
        kind = op.name
        if kind == "memref.reinterpret_cast" and use.operand_number == 0:
            result = op.results[0]
            result.set_type(_retyped(result.type, elem, f"a view of {name!r}"))
            changed += _rewrite_uses(result, elem, name)
        elif kind == "memref.load":
            with InsertionPoint(op), op.location:
                narrow = memref.load(op.operands[0], list(op.operands[1:]))
                wide = arith.extf(F32Type.get(), narrow)
            op.results[0].replace_all_uses_with(wide)
            op.erase()
            changed += 1
        elif kind == "memref.store" and use.operand_number == 1:
            with InsertionPoint(op), op.location:
                rounded = arith.truncf(elem, op.operands[0])
                memref.store(rounded, op.operands[1], list(op.operands[2:]))
            op.erase()
            changed += 1
        elif kind == "vector.load" and use.operand_number == 0:
            v = VectorType(op.results[0].type).shape[0]
            with InsertionPoint(op), op.location:
                narrow = vector.load(VectorType.get([v], elem), op.operands[0],
                                     list(op.operands[1:]), alignment=_halved(op))
                wide = (_widen_bf16_pairs(narrow, v) if isinstance(elem, BF16Type)
                        and v % 2 == 0 else
                        arith.extf(VectorType.get([v], F32Type.get()), narrow))
            op.results[0].replace_all_uses_with(wide)
            op.erase()
            changed += 1
        elif kind == "vector.store" and use.operand_number == 1:
            v = VectorType(op.operands[0].type).shape[0]
            with InsertionPoint(op), op.location:
                rounded = arith.truncf(VectorType.get([v], elem), op.operands[0])
                vector.store(rounded, op.operands[1], list(op.operands[2:]),
                             alignment=_halved(op))
            op.erase()
            changed += 1
        elif kind == "memref.extract_aligned_pointer_as_index":
            continue   # the address alone: the same for any element type
        elif kind in ("func.call", "gpu.launch_func"):
            continue   # passed on whole: the callee's parameter is retyped alike
        else:
            raise CompileError(f"{name!r} is used by {kind}, which 16-bit buffers do not "
                               "support yet (only loads, stores and reinterpret_cast)")
    return changed


def _widen(narrow: Value) -> Value:
    """A 16-bit vector as float32 (bf16 pairs from their words where they pair)."""
    vt = VectorType(narrow.type)
    v = vt.shape[0]
    if isinstance(vt.element_type, BF16Type) and v % 2 == 0:
        return _widen_bf16_pairs(narrow, v)
    return arith.extf(VectorType.get([v], F32Type.get()), narrow)


def _is_vector(t: Type) -> bool:
    try:
        VectorType(t)
    except ValueError:
        return False
    return True


def _narrow_vector(wide: Value) -> Value | None:
    """The 16-bit vector that ``wide`` (a float32 vector) was widened from, or None."""
    op = wide.owner
    name = op.name
    if name == "arith.extf" and _is_vector(op.operands[0].type):
        return op.operands[0]
    if name == "vector.shuffle" and WIDENED in op.attributes:
        # shuffle(bitcast(shli(words, 16)), ...), words = bitcast(narrow)
        words = op.operands[0].owner.operands[0].owner.operands[0]
        return words.owner.operands[0]
    return None


def _narrow_elements(wide: Value) -> list[Value] | None:
    """The 16-bit scalars that ``vector.from_elements`` of their float32 values built
    ``wide`` from, or None."""
    op = wide.owner
    if op.name != "vector.from_elements":
        return None
    out = []
    for x in op.operands:
        src = x.owner
        if src.name != "arith.extf" or _is_vector(src.operands[0].type):
            return None
        out.append(src.operands[0])
    return out


def _widen_after_branches(fn: Any) -> None:
    """Where both branches of an ``scf.if`` give a float32 vector widened from 16-bit values
    (the wide tile load and its element-by-element fallback), the ``scf.if`` gives the 16-bit
    vector and it is widened after it. The widening then sits beside the code that follows
    the branch instead of right after the load: a load issued ahead of its use (the next
    lane's tile, loaded while a lane is scanned) is no longer waited for at once by the
    widening of its values (the stall ncu showed on an H100 in the bf16 Mamba kernel: a
    scoreboard wait on the load, at the first shift of its words, each lane)."""
    ifs: list[Any] = []

    def visit(op: Any) -> WalkResult:
        if op.name == "scf.if" and len(op.regions[1].blocks) > 0:
            ifs.append(op)
        return WalkResult.ADVANCE
    fn.walk(visit, WalkOrder.POST_ORDER)
    for op in ifs:   # inner branches first: an outer one then sees their widening
        then_yield = list(op.regions[0].blocks[0].operations)[-1]
        else_yield = list(op.regions[1].blocks[0].operations)[-1]
        for k, result in enumerate(op.results):
            if not _is_vector(result.type):
                continue
            narrow = _narrow_vector(then_yield.operands[k])
            scalars = _narrow_elements(else_yield.operands[k])
            if narrow is None or scalars is None:
                continue
            ntype = narrow.type
            if any(x.type != VectorType(ntype).element_type for x in scalars):
                continue
            with InsertionPoint(else_yield), else_yield.location:
                built = vector.from_elements(ntype, scalars)
            then_yield.operands[k] = narrow
            else_yield.operands[k] = built
            result.set_type(ntype)
            before = [u.owner.operation for u in result.uses]
            with InsertionPoint.after(op), op.location:
                wide = _widen(result)
            mine = [u.owner.operation for u in result.uses
                    if u.owner.operation not in before]
            result.replace_all_uses_except(wide, mine)


def _fold_round_trips(fn: Any) -> None:
    """A 16-bit vector widened to float32 and rounded back to 16 bits (``arith.truncf``: a
    packed stage keeps an input's tile as it was loaded, :mod:`explorer.codegen.packed`) is
    the vector itself: the rounding is exact, and LLVM does not see through the bfloat16
    widening of :func:`_widen_bf16_pairs` (integer shifts) to drop it."""
    trips: list[Any] = []

    def visit(op: Any) -> WalkResult:
        if op.name == "arith.truncf" and _is_vector(op.operands[0].type):
            trips.append(op)
        return WalkResult.ADVANCE
    fn.walk(visit, WalkOrder.POST_ORDER)
    for op in trips:
        narrow = _narrow_vector(op.operands[0])
        if narrow is not None and narrow.type == op.results[0].type:
            op.results[0].replace_all_uses_with(narrow)


def _unmark(fn: Any) -> None:
    """Drop the marks of :func:`_widen_bf16_pairs` (the IR shown carries none)."""
    def visit(op: Any) -> WalkResult:
        if WIDENED in op.attributes:
            del op.attributes[WIDENED]
        return WalkResult.ADVANCE
    fn.walk(visit, WalkOrder.POST_ORDER)


#: marks the shuffle that widens bf16 pairs (:func:`_widen_bf16_pairs`)
WIDENED = "scanweaver.widened"


def _widen_bf16_pairs(narrow: Value, v: int) -> Value:
    """``vector<v x bf16>`` to f32, two elements per 32-bit word: a bfloat16 is the upper half
    of the float32 of the same value, so the word's low element is the word shifted left by 16
    bits and its high element the word with its low 16 bits cleared (one integer instruction
    an element, where ``arith.extf`` lowers to a byte permute and a shift for the high one)."""
    i32, f32 = IntegerType.get_signless(32), F32Type.get()
    half = VectorType.get([v // 2], i32)
    words = vector.bitcast(half, narrow)

    def splat(x: int) -> Value:
        return arith.constant(half, DenseElementsAttr.get_splat(half, IntegerAttr.get(i32, x)))
    low = vector.bitcast(VectorType.get([v // 2], f32), arith.shli(words, splat(16)))
    high = vector.bitcast(VectorType.get([v // 2], f32),
                          arith.andi(words, splat(-65536)))   # 0xFFFF0000
    order = [k for j in range(v // 2) for k in (j, v // 2 + j)]
    out = vector.shuffle(low, high, order)
    out.owner.attributes[WIDENED] = UnitAttr.get()
    return out


def _halved(op: Any) -> Any:
    """The alignment a wide access of 16-bit elements may claim: half that of the float32
    access it replaces (None where it claimed none)."""
    if "alignment" not in op.attributes:
        return None
    old = IntegerAttr(op.attributes["alignment"]).value
    return IntegerAttr.get(IntegerType.get_signless(64), max(2, old // 2))
