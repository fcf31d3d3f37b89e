"""The launch plans' packed arguments (``explorer.runtime.cuda_plan._Step``), without a GPU:
``cuLaunchKernel`` is given an array of addresses, one per argument, each holding the argument's
8 bytes; a call writes its tensors' pointers into the slots the plan named, and leaves the
values fixed at build time (sizes, workspaces) as they were.  The driver's launch is replaced
by a recorder that reads the memory the way the driver does."""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import numpy as np
import pytest

from explorer.runtime.cuda_plan import _Step

#: the arguments of the kernel below
ARGS = 6

class _Kernel:
    block = (128, 1, 1)
    shared_bytes = 4096


class _Function:
    ptr = 0xF00D


class _RawKernel:
    """CuPy's RawKernel: the per-device Function under ``.kernel``."""

    kernel = _Function()


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def launch_kernel(f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                      smem: int, stream: int, params: int, extra: int) -> None:
        addresses = (ctypes.c_uint64 * ARGS).from_address(params)
        values = [ctypes.c_int64.from_address(a).value for a in addresses]
        seen.append({"f": f, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
                     "stream": stream, "values": values, "extra": extra})

    driver = types.SimpleNamespace(launchKernel=launch_kernel)
    cuda = types.ModuleType("cupy.cuda")
    cuda.driver = driver  # type: ignore[attr-defined]
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    return seen


@pytest.mark.parametrize("function", [_RawKernel(), _Function()])
def test_packed_arguments_reach_the_launch(launches: list[dict[str, Any]],
                                           function: Any) -> None:
    # inputs at 0 and 2, an output at 3; a size (C), a workspace pointer, a row divisor fixed
    template = [None, np.int64(1536), None, None, np.int64(0x7000_0000_1000), np.int64(-3)]
    slots = [(0, "in", 1), (2, "in", 0), (3, "out", 0)]
    step = _Step.packed(_Kernel(), function, (12288, 1, 1), template, slots)
    assert step.function == 0xF00D
    step.launch([0x1000, 0x2000], [0x3000], 77)
    step.launch([0x1100, 0x2200], [0x3300], 78)
    first, second = launches
    assert first["values"] == [0x2000, 1536, 0x1000, 0x3000, 0x7000_0000_1000, -3]
    assert second["values"] == [0x2200, 1536, 0x1100, 0x3300, 0x7000_0000_1000, -3]
    assert first["f"] == 0xF00D and first["grid"] == (12288, 1, 1)
    assert first["block"] == (128, 1, 1) and first["smem"] == 4096
    assert (first["stream"], second["stream"]) == (77, 78) and first["extra"] == 0


def test_a_backwards_gradients_share_one_allocation_added_ones_first():
    """A fused backward's plan lays its outputs out in one allocation (``_pooled``): each
    output aligned to 128 bytes, those the kernel adds into first and all of them inside the
    zeroed start, the others after it; with an output of another dtype it stays as it was."""
    import math

    torch = pytest.importorskip("torch")
    from explorer.runtime.cuda_plan import POOL_ALIGN, LaunchPlan, _pooled

    outputs = {"grad_dt": (2, 3, 37), "grad_B": (2, 1, 4, 37), "grad_A": (2, 3, 4),
               "grad_C": (2, 1, 4, 37), "grad_D": (2, 3)}
    plan = LaunchPlan(C=6, N=4, L=37, batch=(2, 3), device=0, stream=0, layouts=[],
                      outputs=outputs, out_dtypes=dict.fromkeys(outputs, torch.float32))
    plan.added = {"grad_B", "grad_C"}
    _pooled(plan)
    pool = torch.zeros(plan.pool)
    for name, shape in outputs.items():
        at = plan.offsets[name]
        assert at % POOL_ALIGN == 0 and at + math.prod(shape) <= plan.pool
        assert pool[at:at + math.prod(shape)].view(shape).shape == shape
    spans = sorted((plan.offsets[n], plan.offsets[n] + math.prod(s)) for n, s in outputs.items())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))   # no overlap
    for name in plan.added:
        assert plan.offsets[name] + math.prod(outputs[name]) <= plan.pool_zero
    assert all(plan.offsets[n] >= plan.pool_zero for n in outputs if n not in plan.added)
    other = LaunchPlan(C=6, N=4, L=37, batch=(2, 3), device=0, stream=0, layouts=[],
                       outputs=dict(outputs), out_dtypes={**plan.out_dtypes,
                                                          "grad_D": torch.bfloat16})
    _pooled(other)
    assert other.pool == 0 and other.offsets == {} and other.pool_zero == 0
