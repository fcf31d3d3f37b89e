"""Timing on the GPU: CUDA events around each launch, after warm-up, median of many launches.

Before every timed launch a 256 MiB buffer is overwritten (outside the timed region) so that no
method finds its inputs in L2 left there by its previous repetition: every time is a cold-cache
time, the same for the kernels, the baselines and the copy roofline.  Work that runs on streams
we cannot see (JAX) is timed on the host around a blocking call instead; the record says which
timer was used.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: bytes overwritten before each timed launch to evict L2 (H100: 50 MB, H200: 60 MB of L2)
FLUSH_BYTES = 256 * 1024 * 1024


@dataclass
class Timing:
    """The median and spread of the repetitions, in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    timer: str  # "cuda-events" or "host"
    samples_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def spread(self) -> float:
        """(max - min) / median: how much the repetitions disagree."""
        return (self.max_ms - self.min_ms) / self.median_ms if self.median_ms > 0 else 0.0


def choose_reps(estimate_ms: float, budget_ms: float, min_reps: int, max_reps: int) -> int:
    """As many repetitions as fit ``budget_ms`` (one takes ``estimate_ms``), within the bounds."""
    if estimate_ms <= 0:
        return max(min_reps, max_reps)
    return int(max(min_reps, min(max_reps, budget_ms // estimate_ms)))


class Flusher:
    """Overwrites a buffer larger than L2 on the current stream."""

    def __init__(self, nbytes: int = FLUSH_BYTES) -> None:
        import cupy as cp

        self.buf = cp.empty(nbytes, dtype=cp.uint8) if nbytes > 0 else None

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.fill(0)


def time_cuda(fn: Callable[[], Any], warmup: int = 3, budget_ms: float = 300.0,
              min_reps: int = 5, max_reps: int = 100, flush: Flusher | None = None,
              sync: Callable[[], None] | None = None) -> Timing:
    """Median time of ``fn()`` (which enqueues GPU work on the current stream) by CUDA events."""
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    for _ in range(max(0, warmup)):
        fn()
    if sync is not None:
        sync()
    stream.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    samples: list[float] = []

    def one() -> float:
        if flush is not None:
            flush()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end))

    first = one()
    samples.append(first)
    reps = choose_reps(first, budget_ms, min_reps, max_reps)
    for _ in range(reps - 1):
        samples.append(one())
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples),
                  "cuda-events", samples)


def time_host(fn: Callable[[], Any], block: Callable[[Any], Any], warmup: int = 3,
              budget_ms: float = 300.0, min_reps: int = 5, max_reps: int = 100,
              flush: Flusher | None = None) -> Timing:
    """Median wall time of ``block(fn())`` (for work on streams the events cannot see)."""
    for _ in range(max(0, warmup)):
        block(fn())
    samples: list[float] = []

    def one() -> float:
        if flush is not None:
            import cupy as cp

            flush()
            cp.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        block(fn())
        return (time.perf_counter() - t0) * 1e3

    first = one()
    samples.append(first)
    for _ in range(choose_reps(first, budget_ms, min_reps, max_reps) - 1):
        samples.append(one())
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples), "host",
                  samples)
