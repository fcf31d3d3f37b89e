"""The lines each recurrence term became after every pass, ours and upstream, and in the PTX.

The explorer links a term of the recurrence to these lines (the saved output's ``locations``):
after an upstream pass such as ``convert-gpu-to-nvvm`` a term must name the ops it became in
that pass's IR, while the IR shown carries no location.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

import explorer as ex  # noqa: E402
from explorer.presets import PRESETS  # noqa: E402

#: a line that holds an op (custom or generic form), with or without results
_OP = re.compile(r'(%[\w#:, %]+ = )?("?[a-z_]+\.[\w.]+"?|})')


@pytest.fixture(scope="module")
def selective() -> Any:
    return ex.compile(PRESETS["selective scan"], target="cuda", strategy="blelloch", cache=False)


def test_a_term_marks_its_ops_after_an_upstream_pass(selective: Any) -> None:
    """x[t] (1:61) after convert-gpu-to-nvvm: the record the explorer saves names lines of that
    pass's IR that are ops, its loads of x, now in the LLVM dialect."""
    from explorer.widget.record import compile_record

    record = compile_record(selective, graphs=False)
    names = [p["name"] for p in record["passes"]]
    assert "convert-gpu-to-nvvm" in names
    lines = record["locations"]["1:61"]["convert-gpu-to-nvvm"]
    assert lines
    ir = selective.passes[names.index("convert-gpu-to-nvvm")].ir.split("\n")
    ops = [ir[i].strip() for i in lines]
    assert all(_OP.match(op) for op in ops), [op for op in ops if not _OP.match(op)][:3]
    loads = [op for op in ops if "llvm.load" in op]
    # scalar loads, and the wide tile loads (vector_width): 4 floats at once
    assert loads and all(re.search(r": !llvm.ptr -> (f32|vector<4xf32>)$", op) for op in loads)
    assert any(op.endswith("vector<4xf32>") for op in loads)
    assert not [op for op in ops if re.search(r"\b(memref|gpu)\.", op)]  # lowered by then
    # dt[t] (1:15) has loads of its own: a term marks its ops, not every load
    dt = set(record["locations"]["1:15"]["convert-gpu-to-nvvm"])
    assert dt and not dt & {i for i in lines if "llvm.load" in ir[i]}
    # and the PTX lines it became
    assert any("ld.global" in selective.ptx.split("\n")[i]
               for i in record["locations"]["1:61"]["ptx"])


def test_every_pass_records_its_term_lines_and_shows_no_locations(selective: Any) -> None:
    before: dict[str, list[int]] | None = None
    for p in selective.passes:
        assert " loc(" not in p.ir and "#loc" not in p.ir and "#di_" not in p.ir, p.name
        assert p.locations, f"{p.name} recorded no term"
        count = p.ir.count("\n") + 1
        assert all(0 <= i < count for lines in p.locations.values() for i in lines), p.name
        if not p.changed and before is not None:    # the text as before: so are its lines
            assert p.locations == before, p.name
        before = p.locations
    where = selective.term_lines()
    upstream = [p.name for p in selective.passes if not p.name.startswith("scan-")]
    for term in ("1:15", "1:61", "2:33"):     # dt[t], x[t], D
        assert {"scan-lower", "convert-gpu-to-nvvm", "cse (gpu.module)"} <= set(where[term])
        assert set(upstream) & set(where[term])
    # the timed inputs reach the PTX's .loc lines; D, a parameter loaded once a block, is
    # hoisted out of the loops by LLVM, which gives a hoisted instruction line 0
    for term in ("1:15", "1:61"):
        assert "ptx" in where[term], term
