"""What the eager forward saves where the fused backward kernel will run, on the host side
(:mod:`explorer.backward_kernel`): the states at the kernel's tile ends laid out again where the
kernel reads them (:func:`spread`), and, where something else runs the backward, the states
recomputed by the forward's kernel (:func:`restored`). The GPU side (the forward saving them,
the kernel's gradients from them) is ``tests/gpu/test_autodiff_gpu.py``."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

import explorer as ex

torch = pytest.importorskip("torch")

from explorer.adjoint_options import CHECKPOINT_BYTES  # noqa: E402
from explorer.backward_kernel import restored, spread  # noqa: E402


@pytest.mark.parametrize("length", [1100, 1024, 511, 512, 7])
def test_spread_puts_each_saved_state_back_at_its_step(length: int):
    """``h[..., every-1::every]`` spread into the states' shape: each at the step it was saved
    from (the last of its tile), whatever the length (a ragged last tile, one shorter than a
    tile: nothing saved); the shape and dtype the states' own."""
    every = 512
    h = torch.randn(2, 3, 4, length)
    saved = h[..., every - 1::every].contiguous()
    full = spread(saved, tuple(h.shape), every)
    assert full.shape == h.shape and full.dtype == h.dtype and full.is_contiguous()
    assert torch.equal(full[..., every - 1::every], saved)
    assert saved.shape[-1] == length // every


def test_checkpoints_start_where_the_states_are_large():
    """The default (``"auto"``) saves one step in a tile from 256 MiB of states on: the
    8 x 1536 x 16 x 2^11 selective scan's states (1.5 GiB) are saved so, 2 x 512 x 16 x 2^10's
    (64 MiB) whole."""
    assert 2 * 512 * 16 * 1024 * 4 < CHECKPOINT_BYTES <= 8 * 1536 * 16 * 2048 * 4


@pytest.mark.skipif(importlib.util.find_spec("mlir") is None,
                    reason="compiling needs the MLIR Python bindings")
def test_a_backward_without_the_kernel_recomputes_the_states():
    """Saved one step in a tile, then a backward that does not run the fused kernel (here on
    the CPU, where it never does): the states are those of the forward's kernel, recomputed
    from the tensors saved, bit for bit."""
    from tests.unit.test_autodiff import BLELLOCH, _compile, _inputs

    text = ex.PRESETS["selective scan"]
    arrays, h0 = _inputs(text)
    op = _compile(text, BLELLOCH).torch()
    given = {k: torch.tensor(v) for k, v in {**arrays, **h0}.items()}
    out = op(**given)
    every = 4
    ctx = SimpleNamespace(every=every, full=tuple(out["h"].shape))
    saved = {"h": out["h"][..., every - 1::every].contiguous()}
    states, spread_ok = restored(op, ctx, given, saved, {"y": torch.ones_like(out["y"])})
    assert not spread_ok
    assert torch.equal(states["h"], out["h"])
    assert np.isfinite(states["h"].numpy()).all()


def test_an_unknown_checkpoints_setting_is_refused():
    """``op.checkpoints`` is True, False or "auto"; anything else is refused at the forward,
    not read as one of them."""
    from explorer.backward_kernel import checkpoints

    for bad in ("yes", 0, 1, 0.0, None):
        op = SimpleNamespace(checkpoints=bad)
        with pytest.raises(ValueError, match="True, False or 'auto'"):
            checkpoints(op, SimpleNamespace(needs_input_grad=(False, True)), [], None)
