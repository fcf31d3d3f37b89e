"""The names the compiler and the runtime use for themselves, owned here once.

A recurrence names its inputs, parameters, states and readouts freely, except for the names
below: each is refused at parse time (with the reason) because the explorer gives it another
meaning.  Everything else is usable.  ``C`` and ``N`` are usable on purpose (Mamba's readout
matrix is ``C``): the kernels bind their size arguments by role, not by name.

Codegen and the runtimes import the argument names from here (this module imports nothing, so
the CUDA runtime may import it where MLIR and sympy are absent).
"""

from __future__ import annotations

#: the time index and the state axis of the language
TIME_AXIS = "t"
STATE_AXIS = "n"

#: keyword arguments of the calls that take the arrays as keywords
#: (``Compiled.__call__``, ``reference``, ``interpret``, ``CudaKernel.__call__/prepare``)
LENGTH_KEYWORD = "L"
DEVICE_KEYWORD = "device"
STREAM_KEYWORD = "stream"

#: size arguments of the kernels, bound by role (so that an input may be called ``C`` or ``N``)
SIZE_NAMES = ("C", "N", "L")
#: the per-call chunk length of the chunked scan kernels: a size argument and a keyword of
#: ``CudaKernel.prepare``
TIME_CHUNK = "time_chunk"
#: workspaces of the chunked scan: per (sequence, chunk), the chunk's aggregate and the state
#: before the chunk
AGGREGATES = "chunk_aggregates"
CARRIES = "chunk_carries"
#: workspace of the look-back scan: per (sequence, tile), what the tile's block has published
#: (0: nothing yet, 1: its aggregate, 2: the state after it); zeroed before every launch
TILE_FLAGS = "tile_flags"

#: suffix of the initial-state keyword of a state: ``h0=`` gives ``h[-1]`` of the state ``h``
INITIAL_SUFFIX = "0"


def h0_name(state: str) -> str:
    """The keyword (and kernel argument) of the initial state of ``state``: ``h`` -> ``h0``."""
    return f"{state}{INITIAL_SUFFIX}"


#: suffix of the last state of a state, an output a compile stores on request
#: (``outputs=("y", "h_last")``): ``h_last`` is ``h`` after the last step of each sequence
LAST_SUFFIX = "_last"


def last_name(state: str) -> str:
    """The output (and kernel argument) of the last state of ``state``: ``h`` -> ``h_last``."""
    return f"{state}{LAST_SUFFIX}"


#: the keyword of a packed variable-length batch in calls: B + 1 offsets of the sequences
#: packed along time (the flash-attention convention)
CU_SEQLENS = "cu_seqlens"
#: the kernel argument that tells a compile with ``varlen=True`` where sequences start and end
#: (one float32 per time step, built by the runtime from ``cu_seqlens``)
SEGMENT_MARKS = "segment_marks"


#: names a recurrence may not give to an input, a parameter, a state or a readout, and why
#: (the functions of the language are refused separately, as functions)
RESERVED_NAMES: dict[str, str] = {
    TIME_AXIS: "it is the time index (write x[t], h[t-1])",
    STATE_AXIS: "it is the state axis (write h[t, n], A[n])",
    LENGTH_KEYWORD: "it is the keyword that gives the sequence length in calls "
                    "(c(L=...), reference(rec, L=...))",
    DEVICE_KEYWORD: "it is the keyword that picks where a compiled recurrence runs "
                    "(c(device='cpu'))",
    STREAM_KEYWORD: "it is the keyword of the CUDA stream of a launch "
                    "(kernel.prepare(stream=...))",
    TIME_CHUNK: "it is the chunk length of the chunked scan kernels, a kernel argument and a "
                "keyword of kernel.prepare(time_chunk=...)",
    AGGREGATES: "it is a workspace argument of the chunked scan kernels",
    CARRIES: "it is a workspace argument of the chunked scan kernels",
    TILE_FLAGS: "it is a workspace argument of the look-back scan kernel",
    CU_SEQLENS: "it is the keyword of the sequence offsets of a packed batch "
                "(c(..., cu_seqlens=...))",
    SEGMENT_MARKS: "it is the kernel argument of a varlen compile that marks where sequences "
                   "start and end",
}
