"""What the eager forward saves where the fused backward kernel will run, on the host side
(:mod:`explorer.backward_kernel`): the kernel reads the states at its tiles' last steps as an
argument of one step in its tile (``every``: the runtime's shape rule ``(..., N, L // every)``),
the forward's checkpoints as they are or a view of every state (:func:`kernel_states`), and,
where something else runs the backward, the states recomputed by the forward's kernel
(:func:`restored`). The GPU side (the forward saving them, the kernel's gradients from them) is
``tests/gpu/test_autodiff_gpu.py``."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

import explorer as ex
from explorer.errors import RecurrenceError
from explorer.runtime.contract import ArtifactError, parse_kernels
from explorer.runtime.shapes import ArgSpec, marshal, resolve

torch = pytest.importorskip("torch")

from explorer.backward_kernel import kernel_states, restored  # noqa: E402


def _op(inputs: tuple[str, ...] = ("dt",)) -> SimpleNamespace:
    return SimpleNamespace(compiled=SimpleNamespace(recurrence=SimpleNamespace(inputs=inputs)))


@pytest.mark.parametrize("length", [1100, 1024, 511, 512, 7])
def test_the_kernel_reads_the_last_step_of_each_whole_tile(length: int):
    """Every state saved: the kernel gets the steps ``every-1, 2*every-1, ...`` (a view, no
    copy: the runtime lays it out); the forward's checkpoints (already those steps, a last axis
    that is not the inputs' length): themselves."""
    every = 512
    kernel = SimpleNamespace(scan_plan=SimpleNamespace(tile=every))
    h = torch.randn(2, 3, 4, length)
    arrays = {"dt": torch.randn(2, 3, length)}
    view = kernel_states(_op(), kernel, arrays, {}, h)
    assert view.shape == (2, 3, 4, length // every)
    if length >= every:   # a view of h (an empty one has no storage of its own)
        assert view.data_ptr() == h.data_ptr() + 4 * (every - 1)
    for k in range(length // every):
        assert torch.equal(view[..., k], h[..., (k + 1) * every - 1])
    saved = h[..., every - 1::every].contiguous()
    assert kernel_states(_op(), kernel, arrays, {}, saved) is saved
    # a recurrence without inputs: the length of its output gradients
    cot = {"y": torch.ones(2, 3, length)}
    assert kernel_states(_op(()), kernel, {}, cot, saved) is saved
    assert torch.equal(kernel_states(_op(()), kernel, {}, cot, h), view)


def test_the_runtime_takes_an_argument_of_one_step_in_a_tile():
    """An input of one step in ``every`` has ``L // every`` steps, the others ``L``: its own
    length does not decide ``L``, a wrong one is refused with the length it must have, and it
    is laid out with its own steps."""
    specs = [ArgSpec("x", True, False), ArgSpec("h", True, True, every=4)]
    x, h = np.ones((3, 10)), np.ones((3, 2, 2))
    assert resolve(specs, {"x": x, "h": h}) == ((3,), 2, 10)
    with pytest.raises(RecurrenceError, match=r"h holds one step in 4: its last axis must be "
                                              r"L // 4 = 2 for L=10, not 3"):
        resolve(specs, {"x": x, "h": np.ones((3, 2, 3))})
    with pytest.raises(RecurrenceError, match="h holds one step in 4"):
        resolve(specs, {"x": x, "h": np.ones((3, 2, 10))})   # every state: not this argument
    m = marshal(specs, {"x": x, "h": np.arange(12.0).reshape(3, 2, 2)}, vector=True)
    assert m.arrays["h"].shape == (3, 2, 2) and m.L == 10
    assert ArgSpec("h", True, True, every=4).describe() == "(..., N, L // 4)"


def _kernel(arg: dict) -> list:
    return [{"name": "k", "block": [32, 1, 1], "args": [
        {"name": "x", "role": "input", "timed": True}, arg,
        {"name": "L", "role": "size", "dtype": "int64"}]}]


def test_a_contract_says_which_input_holds_one_step_in_a_tile():
    """``every`` is read back as written, and refused on anything but a timed float32 input
    and as anything but a positive integer (a tampered manifest)."""
    good = {"name": "h", "role": "input", "timed": True, "lane": True, "every": 512}
    (k,) = parse_kernels(_kernel(good))
    assert k.args[1].every == 512 and k.args[1].as_dict()["every"] == 512
    assert "every" not in k.args[0].as_dict()
    for bad in (0, -512, True, 512.0, "512", None, 2**63):
        with pytest.raises(ArtifactError, match="every must be a positive integer"):
            parse_kernels(_kernel(dict(good, every=bad)))
    for other in ({"role": "param"}, {"timed": False}, {"dtype": "bfloat16"}):
        with pytest.raises(ArtifactError, match="has every but is not a timed float32 input"):
            parse_kernels(_kernel(dict(good, **other)))


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


def test_a_sequence_shorter_than_a_tile_still_has_its_gradients():
    """Saved one step in a tile, a sequence shorter than a tile saved none: that is not an
    empty backward (its gradients are computed, not zeros); no channel or no step is."""
    from explorer.backward_kernel import _no_steps

    op = _op()
    assert not _no_steps(op, {"dt": torch.ones(2, 3, 37)}, {"h": torch.ones(2, 3, 4, 0)}, {})
    assert not _no_steps(op, {"dt": torch.ones(2, 3, 37)}, {"h": torch.ones(2, 3, 4, 37)}, {})
    assert _no_steps(op, {"dt": torch.ones(2, 3, 0)}, {"h": torch.ones(2, 3, 4, 0)}, {})
    assert _no_steps(op, {"dt": torch.ones(0, 3, 37)}, {"h": torch.ones(0, 3, 4, 0)}, {})
    # a recurrence without inputs: the length of its output gradients
    assert not _no_steps(_op(()), {}, {"h": torch.ones(2, 3, 4, 0)}, {"h": torch.ones(2, 3, 4, 37)})
    assert _no_steps(_op(()), {}, {"h": torch.ones(2, 3, 4, 0)}, {"h": torch.ones(2, 3, 4, 0)})
