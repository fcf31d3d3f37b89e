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
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from explorer.runtime.artifact import ChunkRule, Machine, choose_time_chunk

_CIFACE = "_mlir_ciface_"
_GRID_SUFFIX = "_grid"
_ENGINES: OrderedDict[str, tuple[Any, Any, Any, str | None]] = OrderedDict()
_ENGINE_LIMIT = 8
_LOCK = threading.Lock()
#: the machine the host run pretends to be when it picks a per-call time_chunk
CPU_MACHINE = Machine(sms=32, blocks_per_sm=4)


def _engine(text: str, entry: str | None, opt_level: int) -> tuple[Any, str]:
    from mlir.execution_engine import ExecutionEngine
    from mlir.ir import Context, Location, Module

    key = hashlib.sha256(f"{opt_level}\0{text}".encode()).hexdigest()
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


def _value(v: Any, sizes: Mapping[str, int] | None) -> int:
    """An integer of the manifest, or the per-call value of the size it names."""
    if isinstance(v, str):
        if sizes is None or v not in sizes:
            raise ValueError(f"{v!r} is chosen per call: pass the sizes of the call")
        return int(sizes[v])
    return int(v)


def call_sizes(args: Sequence[Mapping[str, Any]], C: int, N: int, L: int,
               machine: Machine = CPU_MACHINE, time_chunk: int | None = None
               ) -> dict[str, int]:
    """The size arguments of one call: C, N, L and, when the kernels take it, the
    ``time_chunk`` of the manifest's rule for ``machine`` (or the forced ``time_chunk``)."""
    sizes = {"C": C, "N": N, "L": L}
    for a in args:
        if a["role"] == "size" and a["name"] not in sizes:
            if time_chunk is not None:
                sizes[a["name"]] = int(time_chunk)
                continue
            r = a["chunk_rule"]
            fill = float(r.get("fill", 1))
            rule = ChunkRule(int(r["tile"]), int(r.get("min_tiles", 1)), fill,
                             float(r.get("unchunked_from", fill)))
            sizes[a["name"]] = choose_time_chunk(rule, C, N, L, machine)
    return sizes


def workspace_size(arg: Mapping[str, Any], C: int, N: int, L: int,
                   sizes: Mapping[str, int] | None = None) -> int:
    """Floats of a workspace argument: ``C * N * ceil(L / time_chunk) * per_chunk``."""
    return C * N * -(-L // _value(arg["time_chunk"], sizes)) * int(arg["per_chunk"])


def grid_x(kernel: Mapping[str, Any], C: int, N: int, L: int,
           sizes: Mapping[str, int] | None = None) -> int:
    """The manifest's launch rule; 0 when the kernel is not launched for this L
    (``sizes``: the call's sizes, for the values chosen per call)."""
    longer = kernel.get("launch_when_longer_than")
    if longer is not None and L <= _value(longer, sizes):
        return 0
    blocks = -(-(C * N) // int(kernel.get("sequences_per_block", 1)))
    if kernel.get("time_chunk") is not None:
        blocks *= -(-L // _value(kernel["time_chunk"], sizes))
    return blocks


def _size(arg: Mapping[str, Any], C: int, N: int, L: int) -> tuple[int, ...]:
    rows: tuple[int, ...] = (C, N) if arg["lane"] else (C,)
    return (*rows, L) if arg["timed"] else rows


def run_cpu(final_module_text: str, args: Sequence[Mapping[str, Any]],
            arrays_by_name: Mapping[str, Any], C: int, N: int, L: int,
            entry: str | None = None, opt_level: int = 2, machine: Machine = CPU_MACHINE,
            time_chunk: int | None = None) -> dict[str, np.ndarray]:
    """Run the lowered host module on the arrays; return the outputs by name."""
    engine, entry = _engine(final_module_text, entry, opt_level)
    sizes = call_sizes(args, C, N, L, machine, time_chunk)
    keep, packed, outputs = _pack(args, arrays_by_name, sizes)
    engine.invoke(entry, *packed)
    return outputs


def launch_cpu_kernels(final_module_text: str, kernels: Sequence[Mapping[str, Any]],
                       arrays_by_name: Mapping[str, Any], C: int, N: int, L: int,
                       opt_level: int = 2, machine: Machine = CPU_MACHINE,
                       time_chunk: int | None = None) -> dict[str, np.ndarray]:
    """Launch the host version of each kernel of the manifest, in order, like the GPU runtime
    (every kernel takes the full argument list; workspaces are shared by all of them)."""
    args = kernels[0]["args"]
    sizes = call_sizes(args, C, N, L, machine, time_chunk)
    keep, packed, outputs = _pack(args, arrays_by_name, sizes)
    for k in kernels:
        if list(k["args"]) != list(args):
            raise ValueError(f"kernel {k['name']} has an argument list of its own")
        grid = grid_x(k, C, N, L, sizes)
        if grid == 0 or C * N == 0 or L == 0:
            continue
        engine, entry = _engine(final_module_text, k["name"] + _GRID_SUFFIX, opt_level)
        g = ctypes.c_int64(grid)
        keep.append(g)
        engine.invoke(entry, *packed, ctypes.pointer(g))
    return outputs


def _pack(args: Sequence[Mapping[str, Any]], arrays_by_name: Mapping[str, Any],
          sizes: Mapping[str, int]) -> tuple[list[Any], list[Any], dict[str, np.ndarray]]:
    from mlir.runtime import get_ranked_memref_descriptor

    keep: list[Any] = []        # arrays and descriptors alive until the call returns
    packed: list[Any] = []
    outputs: dict[str, np.ndarray] = {}
    C, N, L = sizes["C"], sizes["N"], sizes["L"]
    for a in args:
        role, name = a["role"], a["name"]
        if role == "size":
            value = ctypes.c_int64(int(sizes[name]))
            keep.append(value)
            packed.append(ctypes.pointer(value))
            continue
        shape = ((workspace_size(a, C, N, L, sizes),) if role == "workspace"
                 else _size(a, C, N, L))
        if role == "workspace":
            arr = np.zeros(shape, dtype=np.float32)
        elif role == "output":
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
    return keep, packed, outputs
