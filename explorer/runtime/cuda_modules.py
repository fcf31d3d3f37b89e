"""Runtime, CUDA side: the loaded modules of an artifact's PTX and the device's geometry for
its chunked kernels, cached per artifact and device (:mod:`explorer.runtime.cuda` launches)."""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

from explorer.errors import LaunchError
from explorer.runtime.artifact import Artifact, KernelInfo, Machine, size_values
from explorer.runtime.cuda_device import _cupy

_MODULES: dict[tuple[str, str, int], Any] = {}
_MODULES_LOCK = threading.Lock()


def _module(artifact: Artifact, kernel: KernelInfo) -> Any:
    """The loaded CuPy module holding ``kernel`` (cached per PTX content and device)."""
    cp = _cupy()
    device = cp.cuda.Device().id
    text = artifact.ptx_text.get(kernel.ptx, "")
    key = (artifact.hash or str(hash(text)), kernel.ptx, device)
    with _MODULES_LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            if artifact.path is not None and (artifact.path / kernel.ptx).is_file():
                path = str(artifact.path / kernel.ptx)
            else:
                fd, path = tempfile.mkstemp(suffix=".ptx", prefix="scanweaver-")
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)
            try:
                mod = cp.RawModule(path=path)
            except Exception as err:  # the driver's PTX JIT refused the module
                raise LaunchError(f"loading {kernel.ptx} ({kernel.name}) failed: {err}") from err
            _MODULES[key] = mod
    return mod


_MACHINES: dict[tuple[str, int], Machine] = {}


def device_machine(artifact: Artifact) -> Machine:
    """SMs of the current device and the blocks of the artifact's chunked kernels that fit on
    one SM at once (the smallest over those kernels), cached per artifact and device."""
    cp = _cupy()
    device = int(cp.cuda.Device().id)
    key = (artifact.hash or str(id(artifact)), device)
    hit = _MACHINES.get(key)
    if hit is not None:
        return hit
    attrs = cp.cuda.Device(device).attributes
    sms = int(attrs.get("MultiProcessorCount", 1))
    per_sm = []
    for k in artifact.kernels:
        if not k.chunked_per_call:
            continue
        func = _module(artifact, k).get_function(k.name)
        try:
            n = int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                func.ptr, k.threads, k.shared_bytes))
        except Exception:
            n = min(int(attrs.get("MaxBlocksPerMultiprocessor", 16)),
                    int(attrs.get("MaxThreadsPerMultiProcessor", 2048)) // k.threads)
        per_sm.append(max(1, n))
    machine = Machine(sms=max(1, sms), blocks_per_sm=min(per_sm) if per_sm else 1)
    _MACHINES[key] = machine
    return machine


def call_sizes(artifact: Artifact, C: int, N: int, L: int,
               time_chunk: int | None = None) -> dict[str, int]:
    """The size arguments of one call (``time_chunk``: forced instead of chosen for the current
    device); LaunchError where the kernels take no chunk length per call, or a forced one is
    not positive."""
    per_call = any(k.chunked_per_call for k in artifact.kernels)
    if time_chunk is not None and (not per_call or int(time_chunk) < 1):
        raise LaunchError(f"time_chunk={time_chunk!r}: the kernels take no chunk length "
                          "per call" if not per_call else "time_chunk must be positive")
    machine = device_machine(artifact) if per_call and time_chunk is None else Machine(1, 1)
    return size_values(artifact.kernels[0].args, C, N, L, machine, time_chunk)
