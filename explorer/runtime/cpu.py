"""Runtime on the host: run a module lowered for ``target="cpu"`` with MLIR's ExecutionEngine.

``run_cpu(final_module_text, args, arrays_by_name, C, N, L)`` takes the lowered module (LLVM
dialect), the manifest ``args`` of the compile and the arrays in the canonical contiguous layout
(:func:`explorer.runtime.shapes.marshal`), allocates the outputs and returns them by name:
``(C, N, L)`` for lane-wide states, ``(C, L)`` otherwise. Missing initial states are zero.

Compiled engines are kept (a few, least recently used dropped) so that running the same module
again does not recompile it.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_CIFACE = "_mlir_ciface_"
_ENGINES: OrderedDict[str, tuple[Any, Any, Any, str]] = OrderedDict()
_ENGINE_LIMIT = 8
_LOCK = threading.Lock()


def _engine(text: str, entry: str | None, opt_level: int) -> tuple[Any, str]:
    from mlir.execution_engine import ExecutionEngine
    from mlir.ir import Context, Location, Module

    key = hashlib.sha256(f"{opt_level}\0{entry}\0{text}".encode()).hexdigest()
    with _LOCK:
        hit = _ENGINES.get(key)
        if hit is not None:
            _ENGINES.move_to_end(key)
            return hit[2], hit[3]
    ctx = Context()
    with ctx, Location.unknown():
        module = Module.parse(text)
        if entry is None:
            entries = [str(op.attributes["sym_name"]).strip('"')[len(_CIFACE):]
                       for op in module.body.operations
                       if op.operation.name == "llvm.func"
                       and str(op.attributes["sym_name"]).strip('"').startswith(_CIFACE)]
            if len(entries) != 1:
                raise ValueError(f"expected one C-interface entry point in the module, found "
                                 f"{entries or 'none'}")
            entry = entries[0]
        engine = ExecutionEngine(module, opt_level=opt_level)
    with _LOCK:
        _ENGINES[key] = (ctx, module, engine, entry)
        while len(_ENGINES) > _ENGINE_LIMIT:
            _ENGINES.popitem(last=False)
    return engine, entry


def _size(arg: Mapping[str, Any], C: int, N: int, L: int) -> tuple[int, ...]:
    rows: tuple[int, ...] = (C, N) if arg["lane"] else (C,)
    return (*rows, L) if arg["timed"] else rows


def run_cpu(final_module_text: str, args: Sequence[Mapping[str, Any]],
            arrays_by_name: Mapping[str, Any], C: int, N: int, L: int,
            entry: str | None = None, opt_level: int = 2) -> dict[str, np.ndarray]:
    """Run the lowered host module on the arrays; return the outputs by name."""
    from mlir.runtime import get_ranked_memref_descriptor

    engine, entry = _engine(final_module_text, entry, opt_level)
    keep: list[Any] = []        # arrays and descriptors alive until the call returns
    packed: list[Any] = []
    outputs: dict[str, np.ndarray] = {}
    sizes = {"C": C, "N": N, "L": L}
    for a in args:
        role, name = a["role"], a["name"]
        if role == "size":
            value = ctypes.c_int64(int(sizes[name]))
            keep.append(value)
            packed.append(ctypes.pointer(value))
            continue
        shape = _size(a, C, N, L)
        if role == "output":
            arr = np.empty(shape, dtype=np.float32)
            outputs[name] = arr
        elif role == "h0" and name not in arrays_by_name:
            arr = np.zeros(shape, dtype=np.float32)
        else:
            if name not in arrays_by_name:
                raise ValueError(f"missing array {name!r} {shape}")
            arr = np.ascontiguousarray(arrays_by_name[name], dtype=np.float32)
            if arr.size != int(np.prod(shape)):
                raise ValueError(f"{name} has {arr.size} elements, expected shape {shape}")
        flat = arr.reshape(-1)
        desc = get_ranked_memref_descriptor(flat)
        keep += [arr, flat, desc]
        packed.append(ctypes.pointer(ctypes.pointer(desc)))
    engine.invoke(entry, *packed)
    return outputs
