"""Named recurrences people start from (the widget's presets and the tutorials use them)."""

from __future__ import annotations

PRESETS: dict[str, str] = {
    "affine scan": "h[t] = a[t] * h[t-1] + b[t]",
    "EMA": "h[t] = 0.9 * h[t-1] + 0.1 * x[t]",
    "gated EMA": "h[t] = sigmoid(g[t]) * h[t-1] + (1 - sigmoid(g[t])) * x[t]",
    "second order": "h[t] = 1.6 * h[t-1] - 0.64 * h[t-2] + x[t]",
    "selective scan": (
        "h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
        "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]"
    ),
    # mamba-ssm's selective_scan_fn with its options: delta_bias and delta_softplus on dt,
    # the D skip, and the z gate y * silu(z)
    "Mamba selective scan": (
        "h[t, n] = exp(softplus(dt[t] + dt_bias) * A[n]) * h[t-1, n]"
        " + softplus(dt[t] + dt_bias) * B[t, n] * x[t]\n"
        "y[t] = (sum(C[t, n] * h[t, n]) + D * x[t]) * z[t] * sigmoid(z[t])"
    ),
}

#: the Mamba selective scan (S6): per channel an N-wide diagonal state, readout summed over n
SELECTIVE_SCAN = PRESETS["selective scan"]
AFFINE_SCAN = PRESETS["affine scan"]
