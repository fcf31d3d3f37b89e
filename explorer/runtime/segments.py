"""Runtime, packed variable-length batches and last states (NumPy/CuPy only, no MLIR).

A compile with ``varlen=True`` (the plan's ``scan.segments``) scans sequences of different
lengths packed along time. A call gives their offsets as ``cu_seqlens`` (the flash-attention
convention): ``B + 1`` integers, ``cu_seqlens[0] == 0``, non-decreasing, the last equal to the
total length L; sequence j is the steps ``[cu_seqlens[j], cu_seqlens[j + 1])`` of every channel
(the offsets are shared by all channels and batch rows). :func:`check_cu_seqlens` validates
them, and :func:`segment_marks` turns them into the kernels' ``segment_marks`` argument: per time
step ``4 j + first + 2 last`` as float32 (``first``/``last``: the step starts/ends sequence
``j``), exact up to :data:`MAX_SEQUENCES` sequences. The kernels read one mark per step (shared
by every channel, so it stays in cache) and restart the state at each start.

With ``cu_seqlens`` an initial state ``<state>0`` is one per sequence: ``(B, ...)`` where ``...``
broadcasts like a parameter (:func:`marshal_initial`), and a last state ``<state>_last`` comes
back as ``(B, *batch)`` (``(B, *batch, N)`` for a vector state); without it, as the parameter's
``batch`` (``batch + (N,)``). A last state starts as the initial state, so an empty sequence
(``cu_seqlens[j] == cu_seqlens[j + 1]``) returns its initial state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from explorer.errors import RecurrenceError
from explorer.frontend.names import CU_SEQLENS, LAST_SUFFIX, h0_name
from explorer.runtime.shapes import as_array, check_float32_range

#: most sequences of a packed batch: ``4 j + 3`` is exact in float32 up to 2**24
MAX_SEQUENCES = 2**22


def check_cu_seqlens(cu_seqlens: Any, L: int) -> np.ndarray:
    """The offsets as a host int64 array, or :class:`RecurrenceError` saying what is wrong:
    a 1-d integer array (NumPy, CuPy, torch, or a list) of at least 2 entries, starting at 0,
    non-decreasing, ending at ``L`` (the length of the time axis)."""
    value = cu_seqlens
    if hasattr(value, "detach") and hasattr(value, "cpu"):      # torch
        value = value.detach().cpu().numpy()
    elif hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):   # CuPy
        value = value.get()
    if isinstance(value, list | tuple):
        if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value):
            raise RecurrenceError(f"{CU_SEQLENS} must hold integers, got {value!r:.60}")
        value = np.asarray(value, dtype=np.int64)
    if not isinstance(value, np.ndarray):
        raise RecurrenceError(f"{CU_SEQLENS} must be an integer array of B + 1 offsets, got "
                              f"{type(cu_seqlens).__name__}")
    if value.dtype.kind not in "iu":
        raise RecurrenceError(f"{CU_SEQLENS} must be an integer array (int32 or int64), got "
                              f"dtype {value.dtype}")
    if value.ndim != 1 or value.shape[0] < 2:
        raise RecurrenceError(f"{CU_SEQLENS} must be 1-d with B + 1 >= 2 offsets, got shape "
                              f"{tuple(value.shape)}")
    cu = value.astype(np.int64)
    if cu[0] != 0:
        raise RecurrenceError(f"{CU_SEQLENS}[0] must be 0, got {int(cu[0])}")
    steps = np.diff(cu)
    if (steps < 0).any():
        bad = int(np.argmax(steps < 0))
        raise RecurrenceError(f"{CU_SEQLENS} must be non-decreasing: {CU_SEQLENS}[{bad + 1}] = "
                              f"{int(cu[bad + 1])} < {CU_SEQLENS}[{bad}] = {int(cu[bad])}")
    if cu[-1] != L:
        raise RecurrenceError(f"{CU_SEQLENS} must end at the total length L={L} (the last "
                              f"axis of the inputs), got {int(cu[-1])}")
    if cu.shape[0] - 1 > MAX_SEQUENCES:
        raise RecurrenceError(f"{CU_SEQLENS} packs {cu.shape[0] - 1} sequences, at most "
                              f"{MAX_SEQUENCES}")
    return cu


def segment_marks(cu: np.ndarray, L: int) -> np.ndarray:
    """The kernels' ``segment_marks`` (float32, length L) for checked offsets ``cu``."""
    lengths = np.diff(cu)
    j = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths)
    marks = 4 * j
    full = lengths > 0
    marks[cu[:-1][full]] += 1
    marks[cu[1:][full] - 1] += 2
    return marks.astype(np.float32)


def packed_call(varlen: bool, arrays: dict[str, Any]) -> Any:
    """Take ``cu_seqlens`` out of a call's keywords: the value, or None; a
    :class:`RecurrenceError` when the compile does not take packed batches."""
    cu = arrays.pop(CU_SEQLENS, None)
    if cu is not None and not varlen:
        raise RecurrenceError(f"{CU_SEQLENS} was given but this compile scans whole sequences: "
                              "compile with varlen=True")
    return cu


def marshal_initial(name: str, value: Any, sequences: int, batch: tuple[int, ...], N: int,
                    lane: bool, xp: Any = np) -> Any:
    """The initial state ``name`` of each of ``sequences`` packed sequences as the kernels
    read it, flat ``(sequences * C [* N],)`` float32: given as ``(B, ...)`` with ``...``
    broadcasting against ``batch`` (``batch + (N,)`` for a vector state), or a number."""
    arr = xp.asarray(as_array(name, value))
    check_float32_range(name, arr, xp)
    target = (sequences, *batch, *((N,) if lane else ()))
    if arr.ndim:
        if arr.shape[0] != sequences:
            raise RecurrenceError(f"{name}: with {CU_SEQLENS} an initial state is one per "
                                  f"sequence, (B={sequences}, ...), got shape {tuple(arr.shape)}")
        if arr.ndim > len(target):
            raise RecurrenceError(f"{name} has shape {tuple(arr.shape)}; expected (B, ...) "
                                  f"broadcasting to {target}")
        arr = arr.reshape((sequences, *(1,) * (len(target) - arr.ndim), *arr.shape[1:]))
    try:
        full = xp.broadcast_to(arr, target)
    except ValueError:
        raise RecurrenceError(f"{name} of shape {tuple(arr.shape)} does not broadcast to "
                              f"{target}") from None
    return xp.ascontiguousarray(full, dtype=xp.float32).reshape(-1)


def last_state_of(output: str) -> str:
    """The state whose last state ``output`` is (``h_last`` -> ``h``)."""
    return output[:-len(LAST_SUFFIX)]


def initial_keyword(output: str) -> str:
    """The keyword of the initial state a last state starts from (``h_last`` -> ``h0``)."""
    return h0_name(last_state_of(output))


def last_shape(sequences: int | None, batch: tuple[int, ...], N: int, lane: bool
               ) -> tuple[int, ...]:
    """The shape a last state comes back in (``sequences``: None when the call is not
    packed)."""
    head = () if sequences is None else (sequences,)
    return (*head, *batch, *((N,) if lane else ()))


def state_rows(sequences: int, C: int, N: int, lane: bool) -> int:
    """Floats of an initial or last state array of a call."""
    return sequences * C * (N if lane else 1)


__all__ = ["MAX_SEQUENCES", "check_cu_seqlens", "segment_marks", "packed_call",
           "marshal_initial", "last_shape", "state_rows", "initial_keyword", "last_state_of"]
