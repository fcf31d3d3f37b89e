"""Shape rules shared by the reference, the CPU runtime and the CUDA runtime (NumPy/CuPy only).

Time is the last axis.  An input indexed by time is ``(..., L)``, or ``(..., N, L)`` when it is
indexed by the state axis n; a parameter is ``(...)``, or ``(..., N)``.  The batch dimensions
``...`` of all arrays broadcast NumPy-style; the broadcast batch is flattened into ``C`` channels,
so kernels see contiguous ``(C, L)``, ``(C, N, L)``, ``(C,)`` and ``(C, N)`` arrays.

An input shared by the channels of a block of leading batch axes (Mamba's ``B`` and ``C``,
``(batch, 1, N, L)`` beside ``x`` of ``(batch, D, L)``) may be read where it is: :func:`marshal`
given its name in ``shared`` lays it out with one row per such block, ``(C / div, ...)``, and
says ``div``, the channels that share a row (``Marshalled.row_div``); channel ``c`` reads row
``c // div``. A parameter given for the trailing batch axes alone (Mamba's ``A`` of ``(D, N)``
beside ``x`` of ``(batch, D, L)``) is read where it is the same way: named in ``modded`` it
keeps its ``mod`` rows (``Marshalled.row_mod``), and channel ``c`` reads row ``c % mod``. Any
other broadcast is laid out per channel.

A parameter or an initial state may also be a number: a Python ``int``/``float``, a NumPy scalar
or a 0-d array (``gamma=0.9``); it broadcasts over the batch and, for ``A[n]``, over the state
axis.  Booleans, text, complex numbers and ``None`` are refused (:func:`as_array`), and so is a
value the float32 kernels cannot hold: a float64 number beyond float32's range would silently
become inf (:func:`check_float32_range`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorer.errors import RecurrenceError
from explorer.runtime.contract import time_steps
from explorer.runtime.dtypes import NARROW, dtype_name, storage, to_storage


@dataclass(frozen=True)
class ArgSpec:
    """One array argument: indexed by time? indexed by the state axis n?"""

    name: str
    timed: bool
    lane: bool
    #: one step in ``every`` (see ``ArgInfo.every``): the time axis holds ``L // every``
    every: int = 0

    def describe(self) -> str:
        steps = f"L // {self.every}" if self.every else "L"
        dims = (f"..., N, {steps}" if self.lane else f"..., {steps}") if self.timed else (
            "..., N" if self.lane else "...")
        return f"({dims})"

    def steps(self, L: int) -> int:
        """The length of the time axis for ``L`` steps (``ArgInfo.steps``' rule)."""
        return time_steps(L, self.every)


@dataclass
class Marshalled:
    C: int
    N: int
    L: int
    batch: tuple[int, ...]
    arrays: dict[str, Any] = field(default_factory=dict)
    #: for an input laid out with fewer rows than channels: the channels that share a row
    row_div: dict[str, int] = field(default_factory=dict)
    #: for a parameter laid out with a row per channel of the trailing batch axes: its rows
    row_mod: dict[str, int] = field(default_factory=dict)

    def unflatten(self, out: Any, lane: bool) -> Any:
        """(C, N, L) or (C, L) -> batch + (N, L) or batch + (L,)."""
        return out.reshape((*self.batch, self.N, self.L) if lane else (*self.batch, self.L))


#: float32's largest finite value: the kernels compute in float32
FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_array(name: str, value: Any) -> Any:
    """An array as given; a Python or NumPy number as a 0-d NumPy array; anything else refused.

    The one place that decides what a value may be, for the reference, the CPU runner and the
    CUDA launcher alike.
    """
    if isinstance(value, bool | np.bool_):
        raise RecurrenceError(f"{name} is a bool ({value}); give a number or an array of real "
                              "numbers")
    if isinstance(value, complex | np.complexfloating):
        raise RecurrenceError(f"{name} is complex ({value}); give a real number or an array of "
                              "real numbers")
    if isinstance(value, str | bytes):
        raise RecurrenceError(f"{name} is text ({value!r:.40}); give a number or an array of "
                              "real numbers")
    if value is None:
        raise RecurrenceError(f"{name} is None; give a number or an array of real numbers")
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            digits = int(int(value).bit_length() * 0.30103)
            raise RecurrenceError(f"{name} is an integer too large for a float (about 10**"
                                  f"{digits})") from None
        return np.asarray(number, dtype=np.float64)
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise RecurrenceError(f"{name} must be an array or a real number, got "
                              f"{type(value).__name__}")
    return value


def check_float32_range(name: str, arr: Any, xp: Any = np) -> None:
    """Refuse finite values beyond float32's range: cast for the kernels they would become inf.

    Only wider floats can hold them (float64 arrays and Python floats); ``inf`` itself passes.
    """
    dtype = np.dtype(arr.dtype)
    if dtype.kind != "f" or dtype.itemsize <= 4:
        return
    magnitude = xp.abs(arr)
    big = (magnitude > FLOAT32_MAX) & xp.isfinite(magnitude)
    if bool(big.any()):
        worst = float(xp.where(big, magnitude, 0).max())
        raise RecurrenceError(f"{name} holds {worst:.3g}, beyond float32's range (|x| <= "
                              f"{FLOAT32_MAX:.4g}): the kernels compute in float32, where it "
                              "would become inf; scale it (explorer.reference computes in "
                              "float64)")


def _shape_parts(spec: ArgSpec, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int | None,
                                                                  int | None]:
    """(batch, N, L) of a value; N is None for a number given for ``A[n]`` (it broadcasts)."""
    if spec.lane and not spec.timed and shape == ():
        return (), None, None
    need = int(spec.timed) + int(spec.lane)
    if len(shape) < need:
        raise RecurrenceError(f"{spec.name} must have shape {spec.describe()}, got {shape}")
    rest = list(shape)
    L = rest.pop() if spec.timed else None
    N = rest.pop() if spec.lane else None
    return tuple(rest), N, L


def _full_shape(spec: ArgSpec, shape: tuple[int, ...], batch: tuple[int, ...]
                ) -> tuple[int, ...]:
    """The shape of a value with the batch axes it lacks (and a number's lane axis) as 1s."""
    if spec.lane and not spec.timed and shape == ():
        shape = (1,)
    b, _, _ = _shape_parts(spec, shape)
    return (1,) * (len(batch) - len(b)) + shape


def check_dtype(name: str, arr: Any) -> None:
    text = dtype_name(arr)
    if text == "bfloat16":   # torch's or ml_dtypes' (NumPy has none)
        return
    try:
        kind = np.dtype(arr.dtype).kind
    except TypeError:   # a torch dtype: by its name
        kind = np.dtype(text).kind if text in np.sctypeDict else "?"
    if kind not in "fiu":
        raise RecurrenceError(f"{name} has dtype {arr.dtype}; give real numbers (float32 or "
                              "float64)")


def resolve(specs: Sequence[ArgSpec], arrays: Mapping[str, Any], L: int | None = None
            ) -> tuple[tuple[int, ...], int, int]:
    """Check the arrays against the specs; return (batch, N, L)."""
    names = {s.name for s in specs}
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise RecurrenceError(f"missing array{'s' * (len(missing) > 1)}: {', '.join(missing)}")
    extra = sorted(set(arrays) - names)
    if extra:
        raise RecurrenceError(f"unexpected array{'s' * (len(extra) > 1)}: {', '.join(extra)} "
                              f"(the recurrence reads {', '.join(sorted(names))})")
    batches: list[tuple[int, ...]] = []
    Ns: dict[str, int] = {}
    Ls: dict[str, int] = {}
    sparse: dict[str, int] = {}   # the time axes of one step in ``every``
    for s in specs:
        arr = as_array(s.name, arrays[s.name])
        if s.timed and tuple(arr.shape) == ():
            raise RecurrenceError(f"{s.name} is read as {s.name}[t]: give an array with time as "
                                  f"the last axis {s.describe()}, not a number")
        check_dtype(s.name, arr)
        b, n, length = _shape_parts(s, tuple(arr.shape))
        batches.append(b)
        if n is not None:
            Ns[s.name] = n
        if length is not None:
            (sparse if s.every else Ls)[s.name] = length
    if len(set(Ls.values())) > 1:
        raise RecurrenceError("the time axes (last axis) differ: "
                              + ", ".join(f"{k}: {v}" for k, v in Ls.items()))
    if len(set(Ns.values())) > 1:
        raise RecurrenceError("the state axes n differ: "
                              + ", ".join(f"{k}: {v}" for k, v in Ns.items()))
    if Ls:
        length = next(iter(Ls.values()))
        if L is not None and L != length:
            raise RecurrenceError(f"L={L} was given but the inputs have length {length}")
    elif L is None:
        raise RecurrenceError("no input is indexed by time: pass the length L")
    else:
        length = L
    for s in specs:
        if s.name in sparse and sparse[s.name] != s.steps(length):
            raise RecurrenceError(f"{s.name} holds one step in {s.every}: its last axis must "
                                  f"be L // {s.every} = {s.steps(length)} for L={length}, "
                                  f"not {sparse[s.name]}")
    try:
        batch = tuple(np.broadcast_shapes(*batches)) if batches else ()
    except ValueError:
        shown = ", ".join(f"{s.name}: {tuple(arrays[s.name].shape)} {s.describe()}"
                          for s in specs)
        raise RecurrenceError(f"the batch dimensions do not broadcast: {shown}") from None
    N = next(iter(Ns.values())) if Ns else 1
    return batch, N, int(length)


def shared_rows(own: tuple[int, ...], batch: tuple[int, ...]) -> int | None:
    """The channels that share a row of an array of batch shape ``own`` (as many axes as
    ``batch``) when it keeps a block of leading axes of ``batch`` and is broadcast over the
    rest (``(8, 1)`` in ``(8, 1536)``: 1536); None for any other broadcast."""
    k = 0
    while k < len(batch) and own[k] == batch[k]:
        k += 1
    if any(n != 1 for n in own[k:]):
        return None
    return math.prod(batch[k:])


def trailing_rows(own: tuple[int, ...], batch: tuple[int, ...]) -> int | None:
    """The rows of an array of batch shape ``own`` (as many axes as ``batch``) that keeps a
    block of trailing axes of ``batch`` and is broadcast over the rest (``(1, 1536)`` in
    ``(8, 1536)``: 1536 rows, channel c reading row ``c % 1536``); None for any other
    broadcast."""
    k = len(batch)
    while k > 0 and own[k - 1] == batch[k - 1]:
        k -= 1
    if any(n != 1 for n in own[:k]):
        return None
    return math.prod(batch[k:])


def kept_rows(name: str, own: tuple[int, ...], batch: tuple[int, ...], shared: Sequence[str],
              modded: Sequence[str]) -> tuple[int, int | None, int | None]:
    """The rows the kernels read ``name`` (of batch shape ``own``) with: ``(rows, divisor,
    modulus)``: a row per block of channels where it is ``shared`` by them (channel c reads
    row ``c // divisor``), a row per channel of the trailing batch axes where it is ``modded``
    and given for them alone (row ``c % modulus``), else a row per channel (both None)."""
    C = math.prod(batch)
    div = shared_rows(own, batch) if name in shared and C > 0 else None
    if div is not None and div > 1:
        return C // div, div, None
    mod = trailing_rows(own, batch) if name in modded and C > 0 else None
    if mod is not None and mod < C:
        return mod, None, mod
    return C, None, None


def marshal(specs: Sequence[ArgSpec], arrays: Mapping[str, Any], xp: Any = np,
            dtype: Any = np.float32, L: int | None = None, vector: bool = False,
            shared: Sequence[str] = (), dtypes: Mapping[str, str] | None = None,
            modded: Sequence[str] = ()) -> Marshalled:
    """Broadcast every array to the canonical contiguous layout of the kernels; an input named
    in ``shared`` and shared by blocks of channels keeps one row per block (its row divisor in
    ``row_div``), and a parameter named in ``modded`` given for the trailing batch axes alone
    keeps its rows (their number in ``row_mod``). ``dtypes``: the contract dtype of arrays
    that are not ``dtype`` (a 16-bit input is rounded into its storage,
    :func:`explorer.runtime.dtypes.to_storage`)."""
    batch, N, length = resolve(specs, arrays, L)
    C = math.prod(batch)
    out = Marshalled(C, N if vector else 1, length, batch)
    for s in specs:
        narrow = (dtypes or {}).get(s.name)
        if narrow in NARROW:
            arr = xp.asarray(to_storage(s.name, as_array(s.name, arrays[s.name]), narrow, xp))
            kept = storage(narrow)
        else:
            arr = xp.asarray(as_array(s.name, arrays[s.name]))
            kept = dtype
        if np.dtype(kept) == np.float32:
            check_float32_range(s.name, arr, xp)
        # insert the batch axes this array lacks, then broadcast to the full canonical shape
        tail = ((N,) if s.lane else ()) + ((s.steps(length),) if s.timed else ())
        arr = arr.reshape(_full_shape(s, tuple(arr.shape), batch))
        own = tuple(arr.shape[:len(batch)])
        rows, div, mod = kept_rows(s.name, own, batch, shared, modded)
        if rows < C:
            # a row per block of channels, or per channel of the trailing batch axes: the rows
            # it has, where it is (no copy when it is contiguous float32 already)
            arr = xp.broadcast_to(arr, own + tail)
            out.arrays[s.name] = xp.ascontiguousarray(arr.reshape((rows, *tail)), dtype=kept)
            if div is not None:
                out.row_div[s.name] = div
            if mod is not None:
                out.row_mod[s.name] = mod
            continue
        full = xp.broadcast_to(arr, batch + tail)
        flat = (C, *tail)
        out.arrays[s.name] = xp.ascontiguousarray(full.reshape(flat) if full.size else
                                                  xp.zeros(flat), dtype=kept)
    return out


def canonical_views(specs: Sequence[ArgSpec], arrays: Mapping[str, Any], L: int | None = None,
                    dtype: Any = np.float64) -> tuple[dict[str, np.ndarray], tuple[int, ...],
                                                      int, int]:
    """Views of every array as ``batch + (N or 1, L or 1)`` (no copies but the dtype cast)."""
    batch, N, length = resolve(specs, arrays, L)
    views: dict[str, np.ndarray] = {}
    for s in specs:
        arr = np.asarray(as_array(s.name, arrays[s.name]), dtype=dtype)
        if np.dtype(dtype) == np.float32:
            check_float32_range(s.name, np.asarray(as_array(s.name, arrays[s.name])))
        shape = list(_full_shape(s, tuple(arr.shape), batch))
        if not s.timed:
            shape.append(1)
        if not s.lane:
            shape.insert(len(shape) - 1, 1)
        views[s.name] = arr.reshape(tuple(shape))
    return views, batch, N, length
