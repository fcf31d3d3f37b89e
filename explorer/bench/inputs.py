"""Random float32 inputs for any compiled kernel, in ranges where its recurrence is stable (for
a 16-bit input, float32 values it holds exactly).

A name that is a whole entry of the transition ``A_t`` of the recurrence's affine form (the ``a``
of ``h[t] = a[t] * h[t-1] + b[t]``, a parameter decay ``g * h[t-1]``, the coefficients of a
second-order recurrence) gets decays in (0.5, 1) divided by the number of nonzero entries in its
row, so that the state stays bounded over any length; Mamba's ``dt`` (a step size) is positive and
its ``A`` (decay rates) negative, so ``exp(dt * A) < 1``; everything else is standard normal (half
that for parameters).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from explorer.runtime.dtypes import from_storage, to_storage


def decay_bounds(recurrence: str) -> dict[str, float]:
    """For each name that is a whole entry of ``A_t`` in the affine form of ``recurrence``, the
    largest decay it may take: one over the number of nonzero entries of its row (the smallest
    over the rows it appears in)."""
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose

    form = decompose(Recurrence.parse(recurrence))
    bounds: dict[str, float] = {}
    for i in range(form.size):
        row = [form.A[i, j] for j in range(form.size) if form.A[i, j] != 0]
        for entry in row:
            if entry.is_Symbol:
                name = str(entry)
                bounds[name] = min(bounds.get(name, 1.0), 1.0 / len(row))
    return bounds


def random_inputs(kernel: Any, C: int, L: int, N: int = 16, seed: int = 0) -> dict[str, Any]:
    """NumPy arrays for every input and parameter of ``kernel`` (a ``CudaKernel``)."""
    rng = np.random.default_rng(seed)
    decays = decay_bounds(kernel.artifact.recurrence)
    arrays: dict[str, Any] = {}
    for spec in kernel.specs:
        shape: tuple[int, ...] = (C,)
        if spec.lane:
            shape += (N,)
        if spec.timed:
            shape += (spec.steps(L),)   # (one step in ``every``: its own length)
        if spec.name in decays:
            value = decays[spec.name] * (0.5 + 0.5 * rng.random(shape))
        elif spec.name == "dt":
            value = rng.uniform(0.01, 0.2, shape)
        elif spec.name == "A":
            value = -rng.uniform(0.5, 2.0, shape)
        elif spec.timed:
            value = rng.standard_normal(shape)
        else:
            value = 0.5 * rng.standard_normal(shape)
        narrow = getattr(kernel, "narrow", {}).get(spec.name)
        if narrow is not None:
            # values the 16-bit input holds exactly: the launcher's rounding changes nothing,
            # and the float64 reference sees what the kernel reads
            value = from_storage(to_storage(spec.name, value, narrow), narrow)
        arrays[spec.name] = value.astype(np.float32)
    return arrays


def mamba_shape(spec: Any, batch: int, D: int, N: int, L: int) -> tuple[int, ...]:
    """The shape of an input or parameter in Mamba's layout (``spec``: an ``ArgSpec``, whether
    it is indexed by time and by the lane n): an input with the lane axis given once per batch
    row, ``(batch, 1, N, L)`` (``B``, ``C``); another input per channel, ``(batch, D, L)``;
    a parameter per channel of the trailing batch axis, ``(D, N)`` or ``(D,)``, shared by the
    batch rows."""
    if spec.timed:
        return (batch, 1, N, L) if spec.lane else (batch, D, L)
    return (D, N) if spec.lane else (D,)
