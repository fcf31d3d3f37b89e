"""Resident threads per SM that the look-back kernel asks of ptxas (``.minnctapersm``, as
blocks per SM), by its tile and layout: what bounds the registers of each thread, chosen so
that as many tiles wait at once on an SM as its registers and shared memory allow."""

from __future__ import annotations

#: resident threads per SM asked of ptxas for the look-back kernel (as blocks per SM): the
#: walk's registers (the flags and aggregates of several tiles a lane, in warp 0 only) would
#: otherwise cap the whole kernel's occupancy (96 registers, 5 blocks of 128 threads an SM,
#: against 64 and 8 for the scan alone). At 1024 (56 registers, 9 blocks) ncu found its warps
#: waiting at a block barrier half the time (the others wait there while warp 0 looks back)
#: with DRAM at 76% of its peak: 1280 (48 registers, 10 blocks, no spills) measured 1.7% faster
#: in fp32 and 3.5% in bf16 at 1 x 2^26 on an H100, 1536 (40 registers) spilled and was slower
LOOKBACK_THREADS_PER_SM = 1280
#: the same in the direct tile layout with 16 elements a thread, which holds its inputs in
#: registers through the tree and the wait (at 1024 its 64 registers spilled 136 bytes)
LOOKBACK_THREADS_PER_SM_DIRECT_16 = 640
#: the same with 32 elements a thread (tiles past CUDA's 48 KiB of static shared memory take
#: dynamic shared memory): at 1024 they spilled 192 bytes, at 768 (80 registers) 48
LOOKBACK_THREADS_PER_SM_32 = 768
#: the same for a packed float32 tile, which its tiles reach by asynchronous copies (no
#: register holds a load): 6 blocks of 256 threads by 16 elements (40 registers), the most
#: whose stages (32 KiB each) an SM holds; 12 of 128 x 16
LOOKBACK_THREADS_PER_SM_COPIED = 1536


def lookback_threads_per_sm(elements: int, layout: str, dtype: str = "float32") -> int:
    """Resident threads per SM asked of ptxas for the look-back kernel."""
    if layout == "packed" and dtype == "float32" and elements <= 16:
        return LOOKBACK_THREADS_PER_SM_COPIED
    if layout == "direct" and elements > 8:
        return LOOKBACK_THREADS_PER_SM_DIRECT_16
    if elements > 16:
        return LOOKBACK_THREADS_PER_SM_32
    return LOOKBACK_THREADS_PER_SM
