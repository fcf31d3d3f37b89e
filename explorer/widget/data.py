"""Example inputs for running a compiled recurrence from the widget.

The arrays follow the canonical layout (time is the last axis): a time-indexed input is
``(C, L)`` or ``(C, N, L)`` when indexed by the state axis ``n``; a parameter is ``(C,)`` or
``(C, N)``. Values are drawn so that the presets stay bounded over long sequences: time-indexed
inputs in [0.05, 0.5), parameters in [-0.5, -0.05) (a decay such as ``exp(dt[t] * A[n])`` then
stays below one, and two lag coefficients sum to less than one in magnitude). When the reference
of a recurrence overflows with these signs, :func:`bounded_inputs` tries positive parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def input_shapes(recurrence: Any, channels: int, length: int, state_size: int
                 ) -> dict[str, tuple[int, ...]]:
    """Shape of every input and parameter of ``recurrence`` in the canonical layout."""
    lanes = recurrence.lane_names
    shapes: dict[str, tuple[int, ...]] = {}
    for name in recurrence.inputs:
        shapes[name] = ((channels, state_size, length) if name in lanes
                        else (channels, length))
    for name in recurrence.params:
        shapes[name] = (channels, state_size) if name in lanes else (channels,)
    return shapes


def sample_inputs(recurrence: Any, channels: int, length: int, state_size: int = 16,
                  seed: int = 0, param_sign: float = -1.0) -> dict[str, np.ndarray]:
    """Random float32 inputs for ``recurrence`` (see the module docstring for the ranges)."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for name, shape in input_shapes(recurrence, channels, length, state_size).items():
        values = rng.uniform(0.05, 0.5, size=shape)
        if name in recurrence.params:
            values = param_sign * values
        arrays[name] = values.astype(np.float32)
    return arrays


def length_argument(recurrence: Any, length: int) -> dict[str, int]:
    """``{"L": length}`` when no input of ``recurrence`` is indexed by time (the arrays cannot
    say how long the sequence is), else nothing: the arrays carry the length."""
    return {} if recurrence.inputs else {"L": length}


def _finite_and_bounded(result: Any, bound: float = 1e6) -> bool:
    values = result.values() if isinstance(result, dict) else [result]
    for value in values:
        array = np.asarray(value)
        if not np.all(np.isfinite(array)) or (array.size and np.max(np.abs(array)) > bound):
            return False
    return True


def _flip(value: Any) -> Any:
    """``value`` reversed along time (its last axis); a dict of them, each reversed."""
    if isinstance(value, dict):
        return {k: _flip(v) for k, v in value.items()}
    return np.ascontiguousarray(np.asarray(value)[..., ::-1])


def bounded_inputs(recurrence: Any, reference: Callable[..., Any], channels: int, length: int,
                   state_size: int = 16, seed: int = 0, reverse: bool = False,
                   dtype: str = "float32", offsets: Any = ()
                   ) -> tuple[dict[str, np.ndarray], Any]:
    """Inputs whose float64 reference stays finite and bounded, with that reference.

    Tries negative parameters first, then positive ones; returns the last try if neither is
    bounded (the caller shows the numbers as they are).  ``reverse``: the reference of a scan
    backwards in time (compiled with ``reverse=True``), the forward reference of the inputs
    flipped in time, flipped back. ``dtype``: the inputs' dtype in the kernel: the time-indexed
    inputs are rounded to it first (as float32 values), so the reference sees what the kernel
    reads. ``offsets``: the compile's ``read_offsets`` (inputs read at another time).
    """
    from explorer.groundtruth import at_offsets
    from explorer.runtime.dtypes import NARROW, from_storage, to_storage

    arrays: dict[str, np.ndarray] = {}
    expected: Any = None
    for sign in (-1.0, 1.0):
        arrays = sample_inputs(recurrence, channels, length, state_size, seed, sign)
        if dtype in NARROW:
            arrays = {k: (from_storage(to_storage(k, v, dtype), dtype).astype(np.float32)
                          if k in recurrence.inputs else v) for k, v in arrays.items()}
        given = {k: _flip(v) if reverse and k in recurrence.inputs else v
                 for k, v in at_offsets(arrays, offsets).items()}
        expected = reference(recurrence, **length_argument(recurrence, length), **given)
        if reverse:
            expected = _flip(expected)
        if _finite_and_bounded(expected) or not recurrence.params:
            break
    return arrays, expected


def compare(result: Any, expected: Any, names: tuple[str, ...] = ("output",)
            ) -> list[dict[str, Any]]:
    """Per output: max absolute and max relative error of ``result`` against ``expected``.

    The relative error divides by the largest magnitude of the expected output (so that values
    near zero do not dominate).
    """
    if not isinstance(expected, dict):
        expected = {names[0]: expected}
        result = {names[0]: result}
    rows = []
    for name, want in expected.items():
        want64 = np.asarray(want, dtype=np.float64)
        if name not in result:
            # the call did not return it: a failure the table shows, never a pass
            rows.append({"output": name, "shape": None, "expected_shape": want64.shape,
                         "max_abs": float("nan"), "max_rel": float("nan"),
                         "missing": True})
            continue
        got64 = np.asarray(result[name], dtype=np.float64)
        if got64.shape != want64.shape:
            rows.append({"output": name, "shape": got64.shape, "expected_shape": want64.shape,
                         "max_abs": float("inf"), "max_rel": float("inf")})
            continue
        diff = np.abs(got64 - want64)
        max_abs = float(np.max(diff)) if diff.size else 0.0
        scale = float(np.max(np.abs(want64))) if want64.size else 0.0
        max_rel = max_abs / scale if scale > 0 else max_abs
        if not np.all(np.isfinite(got64)):
            max_abs = max_rel = float("nan")
        rows.append({"output": name, "shape": got64.shape, "max_abs": max_abs,
                     "max_rel": max_rel})
    return rows
