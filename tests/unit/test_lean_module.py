"""``scan-lower`` makes each constant of a function once, at the top of its entry block
(``explorer.codegen.emit.constants_in``): the module shown after it holds the kernels' work,
not thousands of repeated constants for ``canonicalize`` to fold."""

from __future__ import annotations

import re
from collections import Counter

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from mlir.dialects import arith, func  # noqa: E402
from mlir.ir import (  # noqa: E402
    Context,
    FunctionType,
    IndexType,
    InsertionPoint,
    Location,
    Module,
)

import explorer  # noqa: E402
from explorer.codegen.emit import cf, ci, constants_in  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402

_CONSTANT = re.compile(r"= arith\.constant ([^:]+) : (\S+)")
_FUNCTION = re.compile(r"^\s*(gpu\.func|func\.func) @")


def _constants_by_function(ir: str) -> dict[str, Counter[tuple[str, str]]]:
    found: dict[str, Counter[tuple[str, str]]] = {}
    current = None
    for line in ir.splitlines():
        if _FUNCTION.match(line):
            current = line.split("@")[1].split("(")[0]
            found[current] = Counter()
        m = _CONSTANT.search(line)
        if m and current is not None:
            found[current][(m.group(1).strip(), m.group(2))] += 1
    return found


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("preset,strategy", [("affine scan", "blelloch"),
                                             ("Mamba selective scan", "warp_shuffle"),
                                             ("second order", "sequential")])
def test_scan_lower_makes_each_constant_once_a_function(preset: str, strategy: str,
                                                        target: str) -> None:
    c = explorer.compile(PRESETS[preset], strategy=strategy, target=target, cache=False)
    ir = next(p.ir for p in c.passes if p.name == "scan-lower")
    functions = _constants_by_function(ir)
    assert functions, ir[:2000]
    for name, constants in functions.items():
        twice = {k: n for k, n in constants.items() if n > 1}
        assert not twice, f"{name} makes these constants more than once: {twice}"


def test_a_pool_puts_constants_first_in_the_order_asked_and_dominating() -> None:
    with Context(), Location.unknown():
        module = Module.create()
        with InsertionPoint(module.body):
            fn = func.FuncOp("f", FunctionType.get([IndexType.get()], [IndexType.get()]))
            entry = fn.add_entry_block()
            with InsertionPoint(entry), constants_in(entry):
                x = arith.addi(entry.arguments[0], ci(7))
                y = arith.muli(x, ci(3))
                z = arith.addi(y, ci(7))            # the 7 made before, not again
                nan_a, nan_b = cf(float("nan")), cf(float("nan"))
                zero, minus_zero = cf(0.0), cf(-0.0)
                func.return_([z])
            assert nan_a != nan_b                    # NaN equals nothing: never shared
            assert zero != minus_zero                # 0.0 and -0.0 are different constants
        module.operation.verify()
        names = [op.operation.name for op in entry.operations]
        values = [str(op.operation.attributes["value"]) for op in entry.operations
                  if op.operation.name == "arith.constant"]
    # 7, 3, 0.0 and -0.0 first, once each; the NaNs where they were asked for
    assert names[:4] == ["arith.constant"] * 4 and names[4] != "arith.constant", names
    assert values[:2] == ["7 : index", "3 : index"], values
    assert names.count("arith.constant") == 6, names
