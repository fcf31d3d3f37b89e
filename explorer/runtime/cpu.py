"""Runtime on the host: run a module lowered for ``target="cpu"`` with MLIR's ExecutionEngine.

``run_cpu(final_module_text, args, arrays_by_name, C, N, L)`` takes the lowered module (LLVM
dialect), the manifest ``args`` of the compile and the arrays in the canonical contiguous layout
(:func:`explorer.runtime.shapes.marshal`), allocates the outputs and returns them by name:
``(C, N, L)`` for lane-wide states, ``(C, L)`` otherwise. Missing initial states are zero.
Workspace arguments (``role: "workspace"``) are allocated as the GPU runtime does:
``C * N * ceil(L / time_chunk) * per_chunk`` zero-initialised floats.

A ``time_chunk`` chosen per call (the size argument of that name and its ``chunk_rule``) is
chosen as the CUDA runtime does, for a fixed machine description, :data:`CPU_MACHINE` (32 SMs,
4 resident blocks each: with the default rule, 13 or more sequences run unchunked, fewer are cut
into chunks), unless the caller passes another ``machine`` or forces ``time_chunk``.

``launch_cpu_kernels`` is the reference launcher of the manifest: it calls the host version of
every kernel (``<kernel>_grid``) in list order with the grid the runtime would use, so the
geometry rules (``sequences_per_block``, ``time_chunk``, ``launch_when_longer_than``) and the
workspaces are exercised on the host exactly as on the GPU.

Compiled engines are kept (a few, least recently used dropped) so that running the same module
again does not recompile it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from explorer.runtime.contract import (
    DEFAULT_PTX,
    ArgInfo,
    KernelInfo,
    Machine,
    check_lanes,
    parse_kernels,
    size_values,
)
from explorer.runtime.dtypes import storage, to_storage
from explorer.runtime.segments import initial_keyword

_CIFACE = "_mlir_ciface_"
_GRID_SUFFIX = "_grid"
_ENGINES: OrderedDict[str, tuple[Any, Any, Any, str | None]] = OrderedDict()
_ENGINE_LIMIT = 8
_LOCK = threading.Lock()
#: the machine the host run pretends to be when it picks a per-call time_chunk
CPU_MACHINE = Machine(sms=32, blocks_per_sm=4)


@functools.lru_cache(maxsize=_ENGINE_LIMIT)
def _engine_key(text: str, opt_level: int) -> str:
    """The engine cache's key of a module (hashed once per module text: a call on the same
    text object finds it by identity)."""
    return hashlib.sha256(f"{opt_level}\0{text}".encode()).hexdigest()


def _engine(text: str, entry: str | None, opt_level: int) -> tuple[Any, str]:
    from mlir.execution_engine import ExecutionEngine
    from mlir.ir import Context, Location, Module

    key = _engine_key(text, opt_level)
    with _LOCK:
        hit = _ENGINES.get(key)
        if hit is not None:
            _ENGINES.move_to_end(key)
            found = entry or hit[3]
            if found is None:
                raise ValueError("the module has several C-interface entry points: name one")
            return hit[2], found
    ctx = Context()
    with ctx, Location.unknown():
        module = Module.parse(text)
        names = [str(op.attributes["sym_name"]).strip('"') for op in module.body.operations
                 if op.operation.name == "llvm.func"]
        # the entry: a C-interface function that is not a kernel's host grid loop
        entries = [n[len(_CIFACE):] for n in names
                   if n.startswith(_CIFACE) and not n.endswith(_GRID_SUFFIX)]
        if entry is None and len(entries) != 1:
            raise ValueError(f"expected one C-interface entry point in the module, found "
                             f"{entries or 'none'}")
        default = entries[0] if len(entries) == 1 else None
        engine = ExecutionEngine(module, opt_level=opt_level)
    with _LOCK:
        _ENGINES[key] = (ctx, module, engine, default)
        while len(_ENGINES) > _ENGINE_LIMIT:
            _ENGINES.popitem(last=False)
    chosen = entry or default
    if chosen is None:
        raise ValueError("the module has no C-interface entry point")
    return engine, chosen


def _contract(kernels: Sequence[KernelInfo | Mapping[str, Any]]) -> tuple[KernelInfo, ...]:
    """The typed kernels (manifest entries are checked into them)."""
    typed = [k for k in kernels if isinstance(k, KernelInfo)]
    if len(typed) == len(kernels):
        return tuple(typed)
    return parse_kernels([dict(k, ptx=DEFAULT_PTX) for k in kernels if isinstance(k, Mapping)])


def _shape(arg: ArgInfo, C: int, N: int, L: int) -> tuple[int, ...]:
    rows: tuple[int, ...] = (C, N) if arg.lane else (C,)
    return (*rows, arg.steps(L)) if arg.timed else rows


def run_cpu(final_module_text: str, kernels: Sequence[KernelInfo | Mapping[str, Any]],
            arrays_by_name: Mapping[str, Any], C: int, N: int, L: int,
            entry: str | None = None, opt_level: int = 2, machine: Machine = CPU_MACHINE,
            time_chunk: int | None = None, row_div: Mapping[str, int] | None = None,
            sequences: int = 1, row_mod: Mapping[str, int] | None = None
            ) -> dict[str, np.ndarray]:
    """Run the lowered host module's entry (which launches every kernel's grid in order) on
    the arrays; return the outputs by name. ``row_div``: for an input given with a row per
    block of channels (``(C / div, ...)``), the channels that share a row; for a lane readout,
    the channels whose values are added into one row; ``row_mod``: for a parameter given
    with a row per channel of the trailing batch axes, its rows (a parameter not named has a
    row per channel). ``sequences``: of
    a packed batch (a varlen compile's ``segment_marks`` among the arrays), the number of
    initial and last states per channel."""
    typed = _contract(kernels)
    args = typed[0].args
    check_lanes(typed, N)
    engine, entry = _engine(final_module_text, entry, opt_level)
    sizes = size_values(args, C, N, L, machine, time_chunk)
    keep, packed, outputs = _pack(args, arrays_by_name, sizes, row_div or {}, sequences,
                                  row_mod or {})
    engine.invoke(entry, *packed)
    return outputs


def launch_cpu_kernels(final_module_text: str, kernels: Sequence[KernelInfo | Mapping[str, Any]],
                       arrays_by_name: Mapping[str, Any], C: int, N: int, L: int,
                       opt_level: int = 2, machine: Machine = CPU_MACHINE,
                       time_chunk: int | None = None, row_div: Mapping[str, int] | None = None,
                       sequences: int = 1, row_mod: Mapping[str, int] | None = None
                       ) -> dict[str, np.ndarray]:
    """Launch the host version of each kernel of the contract, in order, with the grid the GPU
    runtime would use (every kernel takes the full argument list; workspaces are shared)."""
    typed = _contract(kernels)
    args = typed[0].args
    check_lanes(typed, N)
    sizes = size_values(args, C, N, L, machine, time_chunk)
    keep, packed, outputs = _pack(args, arrays_by_name, sizes, row_div or {}, sequences,
                                  row_mod or {})
    for k in typed:
        if k.args != args:
            raise ValueError(f"kernel {k.name} has an argument list of its own")
        if not k.launched(L, sizes) or C * N == 0 or L == 0:
            continue
        engine, entry = _engine(final_module_text, k.name + _GRID_SUFFIX, opt_level)
        g = ctypes.c_int64(k.grid(C, N, L, sizes)[0])
        keep.append(g)
        engine.invoke(entry, *packed, ctypes.pointer(g))
    return outputs


def _divisor(name: str, row_div: Mapping[str, int], C: int) -> int:
    div = int(row_div.get(name, 1))
    if div < 1 or C % div:
        raise ValueError(f"{name}: {div} channels a row do not divide C={C}")
    return div


class _FlatMemRef(ctypes.Structure):
    """The descriptor of a 1-d memref (MLIR's ABI: allocated and aligned pointers, offset, one
    size and one stride in elements); the element type does not enter it."""

    _fields_ = [("allocated", ctypes.c_longlong), ("aligned", ctypes.c_void_p),
                ("offset", ctypes.c_longlong), ("shape", ctypes.c_longlong * 1),
                ("strides", ctypes.c_longlong * 1)]


def _flat_descriptor(flat: np.ndarray) -> _FlatMemRef:
    """The memref descriptor of a contiguous 1-d array (no copy: it points at the data)."""
    assert flat.ndim == 1 and flat.flags.c_contiguous
    desc = _FlatMemRef()
    desc.allocated = desc.aligned = flat.ctypes.data
    desc.offset = 0
    desc.shape[0] = flat.shape[0]
    desc.strides[0] = 1
    return desc


def _modulus(name: str, row_mod: Mapping[str, int], C: int) -> int:
    mod = int(row_mod.get(name, C))
    if C and (mod < 1 or C % mod):
        raise ValueError(f"{name}: {mod} rows do not divide C={C}")
    return max(mod, 1)


def _pack(args: Sequence[ArgInfo], arrays_by_name: Mapping[str, Any],
          sizes: Mapping[str, int], row_div: Mapping[str, int], sequences: int = 1,
          row_mod: Mapping[str, int] | None = None
          ) -> tuple[list[Any], list[Any], dict[str, np.ndarray]]:
    row_mod = row_mod or {}
    unknown = sorted(set(row_div) - {a.name for a in args if a.role == "rowmap"})
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: the kernels read no row divisor for them "
                         "(give them a row per channel)")
    unknown = sorted(set(row_mod) - {a.name for a in args if a.role == "rowmod"})
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: the kernels read no row modulus for them "
                         "(give them a row per channel)")
    keep: list[Any] = []        # arrays and descriptors alive until the call returns
    packed: list[Any] = []
    outputs: dict[str, np.ndarray] = {}
    C, N, L = sizes["C"], sizes["N"], sizes["L"]
    for a in args:
        role, name = a.role, a.name
        if role in ("size", "rowmap", "rowmod"):
            value = ctypes.c_int64(int(sizes[name]) if role == "size" else
                                   _divisor(name, row_div, C) if role == "rowmap" else
                                   _modulus(name, row_mod, C))
            keep.append(value)
            packed.append(ctypes.pointer(value))
            continue
        shape = ((a.workspace_size(C, N, L, sizes),) if role == "workspace"
                 else (L,) if role == "segments"
                 else _shape(a, C // row_div.get(name, 1) if role == "input" or a.reset
                             else row_mod.get(name, C) if role == "param" else C, N, L))
        if role in ("h0", "output") and not a.timed:   # a state per packed sequence
            shape = (sequences, *shape)
        if role == "workspace":
            arr = np.zeros(shape, dtype=np.float32)
        elif role == "output" and not a.timed:   # a last state starts as the initial state
            start = arrays_by_name.get(initial_keyword(name))
            arr = (np.zeros(shape, dtype=np.float32) if start is None else
                   np.array(np.reshape(start, shape), dtype=np.float32))
            outputs[name] = arr
        elif role == "output":   # zeroed where the kernels add into it (a lane readout)
            arr = (np.zeros if a.reset else np.empty)(shape, dtype=storage(a.dtype))
            outputs[name] = arr
        elif role == "h0" and name not in arrays_by_name:
            arr = np.zeros(shape, dtype=np.float32)
        else:
            if name not in arrays_by_name:
                raise ValueError(f"missing array {name!r} {shape}")
            # marshalled arrays come in their storage (bfloat16 as uint16 patterns); other
            # arrays are rounded into it
            given = arrays_by_name[name]
            if getattr(given, "dtype", None) != storage(a.dtype):
                given = to_storage(name, given, a.dtype)
            arr = np.ascontiguousarray(given, dtype=storage(a.dtype))
            if arr.size != int(np.prod(shape)):
                raise ValueError(f"{name} has {arr.size} elements, expected shape {shape}")
        flat = arr.reshape(-1)
        desc = _flat_descriptor(flat)
        keep += [arr, flat, desc]
        packed.append(ctypes.pointer(ctypes.pointer(desc)))
    return keep, packed, outputs
