"""Recurrences the tests run through every stage, with a maker of well-conditioned inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import explorer as ex


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    kind: str  # scalar | diagonal | dense

    def inputs(self, batch: tuple[int, ...], L: int, N: int = 4, seed: int = 0
               ) -> dict[str, np.ndarray]:
        """Random inputs with |A_t| < 1-ish, so that long scans stay bounded."""
        rec = ex.Recurrence.parse(self.text)
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for name in rec.inputs + rec.params:
            shape = tuple(batch)
            if name in rec.lane_names:
                shape += (N,)
            if name in rec.inputs:
                shape += (L,)
            lo, hi = GATES.get(name, (-1.0, 1.0))
            out[name] = rng.uniform(lo, hi, size=shape).astype(np.float32)
        return out


#: value ranges for names that act as decay factors or step sizes
GATES = {
    "a": (0.5, 0.999), "A": (-1.0, -0.1), "dt": (0.001, 0.1), "alpha": (0.05, 0.5),
    "lam": (0.8, 0.99), "r": (0.5, 0.95), "decay": (0.9, 0.999), "gamma": (0.5, 0.99),
    "f": (0.5, 0.99), "g": (-2.0, 2.0), "z": (-2.0, 2.0), "k": (0.1, 0.9),
}

CASES = [
    Case("affine", "h[t] = a[t] * h[t-1] + b[t]", "scalar"),
    Case("ema", "h[t] = 0.9 * h[t-1] + 0.1 * x[t]", "scalar"),
    Case("ema-param", "h[t] = gamma * h[t-1] + (1 - gamma) * x[t]", "scalar"),
    Case("gated-ema", "h[t] = sigmoid(g[t]) * h[t-1] + (1 - sigmoid(g[t])) * x[t]", "scalar"),
    Case("leaky-integrator", "h[t] = h[t-1] - alpha * (h[t-1] - x[t])", "scalar"),
    Case("decay-exp", "h[t] = exp(-softplus(z[t])) * h[t-1] + x[t]", "scalar"),
    Case("tanh-input", "h[t] = decay * h[t-1] + tanh(x[t]) / 2", "scalar"),
    Case("division", "h[t] = (h[t-1] + x[t]) / (1 + k)", "scalar"),
    Case("sqrt-abs", "h[t] = a[t] * h[t-1] + sqrt(abs(x[t])) - max(x[t], 0) + min(b[t], 0.5)",
         "scalar"),
    Case("second-order", "h[t] = 1.6 * h[t-1] - 0.64 * h[t-2] + x[t]", "dense"),
    Case("third-order", "h[t] = 0.5 * h[t-1] + 0.2 * h[t-2] + 0.1 * h[t-3] + x[t]", "dense"),
    Case("coupled", "h[t] = lam * h[t-1] + 0.1 * g[t-1] + x[t]\n"
                    "g[t] = -0.1 * h[t-1] + lam * g[t-1]", "dense"),
    Case("readout", "h[t] = a[t] * h[t-1] + b[t]\ny[t] = 2 * h[t] + x[t]", "scalar"),
    Case("diagonal", "h[t, n] = r[n] * h[t-1, n] + x[t]", "diagonal"),
    Case("selective-scan", ex.PRESETS["selective scan"], "diagonal"),
    Case("selective-scan-softplus",
         "h[t, n] = exp(softplus(dt[t]) * A[n]) * h[t-1, n] + softplus(dt[t]) * B[t, n] * x[t]\n"
         "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]", "diagonal"),
]
