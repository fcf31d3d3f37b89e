"""Random float32 inputs for any compiled kernel, in ranges where its recurrence is stable.

The name that multiplies the state in the plain affine scan gets decays in (0.5, 1); Mamba's
``dt`` (a step size) is positive and its ``A`` (decay rates) negative, so ``exp(dt * A) < 1``;
everything else is standard normal (half that for parameters).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from explorer.bench.affine import affine_roles


def random_inputs(kernel: Any, C: int, L: int, N: int = 16, seed: int = 0) -> dict[str, Any]:
    """NumPy arrays for every input and parameter of ``kernel`` (a ``CudaKernel``)."""
    rng = np.random.default_rng(seed)
    roles = affine_roles(kernel.artifact.recurrence)
    arrays: dict[str, Any] = {}
    for spec in kernel.specs:
        shape: tuple[int, ...] = (C,)
        if spec.lane:
            shape += (N,)
        if spec.timed:
            shape += (L,)
        if roles is not None and spec.name == roles[1]:
            value = 0.5 + 0.5 * rng.random(shape)
        elif spec.name == "dt":
            value = rng.uniform(0.01, 0.2, shape)
        elif spec.name == "A":
            value = -rng.uniform(0.5, 2.0, shape)
        elif spec.timed:
            value = rng.standard_normal(shape)
        else:
            value = 0.5 * rng.standard_normal(shape)
        arrays[spec.name] = value.astype(np.float32)
    return arrays
