"""Scans backwards in time (``reverse=True``, the plan's ``scan.grid {direction = "reverse"}``):
``h[t] = A_t h[t+1] + b_t`` from the initial state after the last step, on every strategy."""

from __future__ import annotations

import numpy as np
import pytest

import explorer as ex

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

from tests.unit.test_plan_is_program import _inputs  # noqa: E402


def _flip(x):
    return {k: np.ascontiguousarray(v[..., ::-1]) for k, v in x.items()} \
        if isinstance(x, dict) else np.ascontiguousarray(x[..., ::-1])


@pytest.mark.parametrize("strategy", ["sequential", "blelloch", "kogge_stone", "warp_shuffle"])
@pytest.mark.parametrize("preset", ["affine scan", "second order", "selective scan"])
def test_reverse_is_the_forward_scan_of_the_flipped_sequence(strategy, preset):
    text = ex.PRESETS[preset]
    rec = ex.Recurrence.parse(text)
    c = ex.compile(text, target="cpu", strategy=strategy, reverse=True, block_size=32,
                   elements_per_thread=2, chunk_tiles=1)
    assert '"reverse"' in c.stages["scan-plan"].text
    arrays = _inputs(text, 3, 500, seed=3)
    h0 = {f"{s}0": np.full((3, 4) if rec.vector else (3,), 0.5, np.float32)
          for s in rec.states}
    timed = {k: v for k, v in arrays.items() if k in rec.inputs}
    fixed = {k: v for k, v in arrays.items() if k not in rec.inputs}
    out = c(**arrays, **h0)
    ref = _flip(ex.reference(text, **_flip(timed), **fixed, **h0))
    # the outputs the compile stores (the readouts alone when there are some)
    outs = out if isinstance(out, dict) else {c.outputs[0]: out}
    refs = ref if isinstance(ref, dict) else {c.outputs[0]: ref}
    assert tuple(outs) == c.outputs
    for name in outs:
        scale = np.abs(refs[name]).max() + 1e-6
        assert np.abs(outs[name] - refs[name]).max() / scale < 1e-5, name


def test_reverse_must_be_a_bool():
    with pytest.raises(ex.OptionError, match="reverse"):
        ex.compile("h[t] = a[t] * h[t-1] + b[t]", reverse="yes")
