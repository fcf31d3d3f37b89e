"""What the run panel measures: a :class:`Measurement` per implementation and length, timed on
the CPU path (``time.perf_counter``, beside the float64 reference) or on the GPU through
:func:`explorer.bench.sweep` (CUDA events, beside the baselines and the copy roofline).

The sweeps are generators, so the panel plots each point as it arrives and a stop request ends
them between two measurements.
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from explorer.widget.data import length_argument, sample_inputs

if TYPE_CHECKING:
    from explorer.compiler import Compiled


@dataclass
class Measurement:
    """One point of a sweep: an implementation timed at one length ``L``."""

    name: str
    length: int
    channels: int
    seconds: float
    bytes_moved: int
    device: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gigabytes_per_second(self) -> float:
        return self.bytes_moved / self.seconds / 1e9 if self.seconds > 0 else float("nan")

    @property
    def elements_per_second(self) -> float:
        steps = self.channels * self.length
        return steps / self.seconds if self.seconds > 0 else float("nan")


def device_label(device: str) -> str:
    """A sentence saying where runs happen."""
    if device == "cuda":
        name = ""
        try:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        except Exception:  # noqa: BLE001 - the name is decoration only
            name = ""
        return f"GPU (CUDA{', ' + name if name else ''}): the compiled PTX runs on the device"
    return ("CPU: no GPU here, so the kernel runs through the CPU path (MLIR ExecutionEngine) "
            "and is timed with time.perf_counter")


def _total_bytes(arrays: dict[str, np.ndarray], result: Any) -> int:
    outputs = result.values() if isinstance(result, dict) else [result]
    return int(sum(a.nbytes for a in arrays.values())
               + sum(np.asarray(o).nbytes for o in outputs))


def time_call(fn: Callable[[], Any], min_seconds: float = 0.2, max_repeats: int = 25
              ) -> float:
    """Median wall time of ``fn()`` after one warm-up call, with ``time.perf_counter``."""
    fn()
    times: list[float] = []
    total = 0.0
    while len(times) < max_repeats and (total < min_seconds or len(times) < 3):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return float(np.median(times))


def cpu_sweep(compiled: Compiled, reference: Callable[..., Any], sizes: list[int], channels: int,
              state_size: int, stop: threading.Event, reference_limit: int = 1 << 16
              ) -> Iterator[Measurement]:
    """Time the compiled kernel on the CPU path at each length, and the float64 NumPy reference
    (the sequential baseline) up to ``reference_limit`` steps."""
    rec = compiled.recurrence
    for length in sizes:
        if stop.is_set():
            return
        arrays = sample_inputs(rec, channels, length, state_size)
        given: dict[str, Any] = {**length_argument(rec, length), **arrays}
        result = compiled(**given)
        seconds = time_call(functools.partial(compiled, **given))
        yield Measurement(f"compiled {compiled.strategy} (CPU)", length, channels, seconds,
                          _total_bytes(arrays, result), "cpu")
        if stop.is_set():
            return
        if length <= reference_limit:
            seconds = time_call(functools.partial(reference, rec, **given), max_repeats=3)
            yield Measurement("explorer.reference, NumPy float64 (CPU)", length, channels, seconds,
                              _total_bytes(arrays, result), "cpu")


#: baselines quick to set up, for sweeps started from the notebook
INTERACTIVE_BASELINES = "cuda-sequential,cub-inclusive-scan,torch-associative-scan"


def gpu_sweep(compiled: Compiled, sizes: list[int], channels: int, state_size: int,
              stop: threading.Event) -> Iterator[Measurement]:
    """Time on the GPU with :func:`explorer.bench.sweep`: CUDA events, L2 flushed, every method
    checked against float64 first, the copy roofline beside the kernel.

    The baselines (CUDA C sequential, CUB, torch's associative_scan) compute the scalar affine
    scan ``h[t] = a[t] * h[t-1] + b[t]`` forwards in time, so they run beside a compile whose
    affine form is that scan (:func:`explorer.bench.affine.form_roles`) only; any other
    recurrence is timed on its own inputs against the copy of the same bytes.  Baselines that
    take minutes to build (accelerated-scan) are left to ``scanweaver bench``.
    """
    from explorer import bench
    from explorer.bench.affine import form_roles

    alike = form_roles(compiled.form) is not None and not compiled.options["reverse"]
    names = INTERACTIVE_BASELINES if alike else "none"
    with tempfile.TemporaryDirectory(prefix="explorer-sweep-") as folder:
        compiled.save(folder)
        label = f"compiled {compiled.strategy}"
        for record in bench.sweep([(channels, length) for length in sizes], artifacts=[folder],
                                  baseline_names=names, state_size=state_size, stop=stop):
            name = label if record.kind == "generated" else record.method
            extra = {"kind": record.kind, "status": record.status, "reason": record.reason,
                     "max_rel_err": record.max_rel_err,
                     # which of the compile's kernels this length launched (short, plain,
                     # look-back): where the line bends
                     "kernels": tuple(record.extra.get("kernels", ()))}
            seconds = (record.time_ms or 0.0) / 1e3
            yield Measurement(name, record.L, record.C, seconds, record.bytes, "cuda", extra)
