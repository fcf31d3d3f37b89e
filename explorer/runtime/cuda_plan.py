"""Runtime stage, CUDA side: cached launch plans for calls on PyTorch CUDA tensors.

``CudaKernel.prepare`` checks, marshals and binds every argument on each call: the right thing
for a single call, and most of a call's time when a training loop or a backward calls the same
kernels again and again with tensors of the same shapes (about 0.8 ms of host time a call on
the affine scan).  :meth:`CudaKernel.launch_torch` keeps instead one :class:`LaunchPlan` per
call *signature*: the device, the stream, ``L`` and ``time_chunk`` given, and for every tensor
given its name, shape, strides and dtype.  The first call of a signature runs the full checks
of :meth:`CudaKernel.check` (names, dtypes, shapes, the lanes the kernels can hold) and builds
the plan:

- the sizes (C, N, L, the chosen ``time_chunk``), the grid of every kernel launched and its
  function handle (the PTX module loaded once, the dynamic shared memory raised once);
- every argument slot: the size and row-divisor values, the workspaces (allocated once per plan
  and reused by later calls on the same stream; those a kernel reads before it writes them,
  ``reset`` in the contract, are zeroed before every launch, as ``prepare`` does), the zero
  initial states not given (allocated once, read only), and which slot takes which tensor;
- for each tensor, whether it is already in the kernels' canonical layout (contiguous, of its
  argument's dtype: float32, or a 16-bit argument's ``torch.bfloat16``/``torch.float16``;
  nothing broadcast, or one row per block of channels where the kernel takes a row divisor):
  then its data pointer is passed as it is; otherwise it is broadcast and copied (``expand``,
  ``contiguous``).

A later call of the same signature does what safety still needs and nothing else: every
tensor is a CUDA tensor on the plan's device (its dtype, shape and strides are the signature),
the outputs are allocated (``torch.empty`` of the output's dtype, on torch's allocator and
current stream), and the
kernels are launched with the data pointers of the tensors.  Nothing waits for the GPU.

The tensors' memory must stay alive until the kernels ran: they are torch tensors used on
torch's current stream, whose caching allocator reuses freed memory in stream order.  A plan's
workspaces are shared by the calls of that signature: calls on one stream run in order; a call
on another stream has another signature (the stream is part of it), so its own workspaces.
Plans are kept per kernel, the most recent :data:`MAX_PLANS` of them.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from explorer.runtime.cuda_device import _cupy, _external_stream
from explorer.runtime.shapes import ArgSpec, _full_shape, resolve, shared_rows

if TYPE_CHECKING:
    from explorer.runtime.cuda import CudaKernel

#: plans kept per kernel (least recently used dropped first)
MAX_PLANS = 32

_STREAMS: dict[int, Any] = {}
_STREAMS_LOCK = threading.Lock()


def cupy_stream(ptr: int) -> Any:
    """The CuPy stream object for a raw stream pointer (made once per pointer)."""
    hit = _STREAMS.get(ptr)
    if hit is None:
        with _STREAMS_LOCK:
            hit = _STREAMS.get(ptr)
            if hit is None:
                hit = _external_stream(ptr)
                _STREAMS[ptr] = hit
    return hit


@dataclass
class _Layout:
    """How one tensor reaches the kernels: as it is, or broadcast and copied."""

    name: str
    direct: bool
    #: broadcast to this shape (the batch axes the tensor lacks are leading ones, which
    #: ``expand`` adds), then copied contiguous: the kernels' flat layout
    target: tuple[int, ...] = ()

    def pointer(self, x: Any, keep: list[Any]) -> int:
        if self.direct:
            return x.data_ptr()
        y = x.expand(self.target).contiguous()   # two torch calls a tensor: host time a call
        keep.append(y)
        return y.data_ptr()


@dataclass
class LaunchPlan:
    """What a launch of one call signature needs, bound once (see the module docstring)."""

    C: int
    N: int
    L: int
    batch: tuple[int, ...]
    device: int
    stream: Any
    layouts: list[_Layout]
    #: output name -> (shape on the kernels' side, shape returned)
    outputs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    #: output name -> its torch dtype; and the torch device (made once, used every call)
    out_dtypes: dict[str, Any] = field(default_factory=dict)
    tdevice: Any = None
    #: outputs the kernels add into (lane readouts): allocated zeroed
    added: set[str] = field(default_factory=set)
    #: (kernel, function, grid, argument template, slots: position -> ("in"|"out", index))
    steps: list[tuple[Any, Any, tuple[int, int, int], list[Any], list[tuple[int, str, int]]]] \
        = field(default_factory=list)
    #: (pointer, bytes) of the workspaces zeroed before every launch
    reset: list[tuple[int, int]] = field(default_factory=list)
    #: device memory the plan owns (workspaces, zero initial states): kept alive with it
    owned: list[Any] = field(default_factory=list)
    poison: bool = False


def signature(arrays: dict[str, Any], L: int | None, time_chunk: int | None,
              stream_ptr: int, narrow: dict[str, str] | None = None) -> tuple[Any, ...] | None:
    """The cache key of a call, or None when a tensor is not a CUDA tensor of its argument's
    dtype: float32, or for the 16-bit arguments ``narrow`` names (name -> ``bfloat16`` /
    ``float16``) that dtype itself (the others take the checking path of ``prepare``, which
    rounds, casts or refuses them)."""
    import torch

    parts: list[Any] = [L, time_chunk, stream_ptr]
    device = None
    narrow = narrow or {}
    for name in sorted(arrays):
        x = arrays[name]
        want = getattr(torch, narrow[name]) if name in narrow else torch.float32
        if not isinstance(x, torch.Tensor) or not x.is_cuda or x.dtype != want:
            return None
        if device is None:
            device = x.device.index
        elif x.device.index != device:
            return None
        parts.append((name, tuple(x.shape), x.stride()))
    parts.append(device)
    return tuple(parts)


def build_plan(kernel: CudaKernel, arrays: dict[str, Any], L: int | None,
               time_chunk: int | None, stream_ptr: int,
               sums: Mapping[str, tuple[int, ...]] | None = None) -> LaunchPlan:
    """Check a call fully (as ``prepare`` does) and bind what does not depend on the data.
    ``sums``: lane readouts to sum in the kernels over the channels that share a row of the
    batch shape given (``(8, 1)`` of a batch ``(8, 1536)``: 1536 channels a row), returned in
    that shape."""
    import torch

    from explorer.runtime.cuda import MAX_GRID_X
    from explorer.runtime.cuda_modules import _module, call_sizes

    specs = kernel.check(L=L, **arrays)
    cp = _cupy()
    device = next(iter(arrays.values())).device.index if arrays else int(cp.cuda.Device().id)
    from explorer.runtime.cuda_device import _ShapeOnly

    batch, N, length = resolve(specs, {n: _ShapeOnly(v) for n, v in arrays.items()}, L)
    C = math.prod(batch)
    shared = [a.name for a in kernel.artifact.kernels[0].args if a.role == "rowmap"]
    layouts, row_div = _layouts(specs, arrays, batch, N, length, shared, C)
    N = N if kernel.vector else 1   # as marshal: the lane axis of the kernels' side
    tdev = torch.device("cuda", device)
    with cp.cuda.Device(device):
        stream = cupy_stream(stream_ptr)
        plan = LaunchPlan(C=C, N=N, L=length, batch=batch, device=device, stream=stream,
                          layouts=layouts, outputs={}, poison=kernel.poison, tdevice=tdev)
        for name, info in kernel.output_args.items():
            inner = (C, N, length) if info.lane else (C, length)
            shown = (*batch, N, length) if info.lane else (*batch, length)
            own = tuple(int(k) for k in (sums or {}).get(name, ()))
            if own and not info.reset:
                raise ValueError(f"{name} is not a lane readout: it cannot be summed over "
                                 "channels")
            # summed where the shape keeps leading axes of the batch and is one on the rest
            # (else returned whole: launch_torch sums it after)
            div = shared_rows(own, batch) if own and len(own) == len(batch) and C else None
            if div is not None:
                row_div[name] = div
                inner, shown = (C // div, N, length), (*own, N, length)
            plan.outputs[name] = (inner, shown)
            plan.out_dtypes[name] = getattr(torch, kernel.narrow.get(name, "float32"))
            if info.reset:
                plan.added.add(name)
        if C * N == 0 or length == 0:
            return plan
        values = call_sizes(kernel.artifact, C, N, length, time_chunk)
        index = {lay.name: i for i, lay in enumerate(layouts)}
        out_index = {name: i for i, name in enumerate(plan.outputs)}
        workspaces: dict[str, Any] = {}
        zeros: dict[str, Any] = {}
        for k in kernel.artifact.kernels:
            for a in k.args_with_role("workspace"):
                if a.name not in workspaces:
                    workspaces[a.name] = torch.zeros(a.workspace_size(C, N, length, values),
                                                     dtype=torch.float32, device=tdev)
                    plan.owned.append(workspaces[a.name])
        reset_names: list[str] = []
        for k in kernel.artifact.kernels:
            if not k.launched(length, values):
                continue
            for a in k.args_with_role("workspace"):
                if a.reset and a.name not in reset_names:
                    reset_names.append(a.name)
            grid = k.grid(C, N, length, values)
            if grid[0] > MAX_GRID_X:
                raise kernel._launch_error(k, grid, f"grid_x {grid[0]} exceeds CUDA's limit "
                                           f"{MAX_GRID_X} (C*N={C * N} sequences)")
            template: list[Any] = []
            slots: list[tuple[int, str, int]] = []
            for a in k.args:
                if a.role in ("input", "param"):
                    slots.append((len(template), "in", index[a.name]))
                    template.append(None)
                elif a.role == "h0":
                    key = kernel.h0_keyword[a.name]
                    if key in index:
                        slots.append((len(template), "in", index[key]))
                        template.append(None)
                    else:
                        if a.name not in zeros:
                            shape = (C, N) if a.lane else (C,)
                            zeros[a.name] = torch.zeros(shape, dtype=torch.float32,
                                                        device=tdev)
                            plan.owned.append(zeros[a.name])
                        template.append(np.int64(zeros[a.name].data_ptr()))
                elif a.role == "output":
                    slots.append((len(template), "out", out_index[a.name]))
                    template.append(None)
                elif a.role == "workspace":
                    template.append(np.int64(workspaces[a.name].data_ptr()))
                elif a.role == "rowmap":
                    template.append(np.int64(row_div.get(a.name, 1)))
                else:
                    template.append(np.int64(values[a.name]))
            func = _module(kernel.artifact, k).get_function(k.name)
            if k.shared_bytes > 48 * 1024:
                try:
                    func.max_dynamic_shared_size_bytes = k.shared_bytes
                except Exception as err:
                    raise kernel._launch_error(k, grid, err) from err
            plan.steps.append((k, func, grid, template, slots))
        plan.reset = [(workspaces[n].data_ptr(), workspaces[n].numel() * 4)
                      for n in reset_names]
    return plan


def _layouts(specs: list[ArgSpec], arrays: dict[str, Any], batch: tuple[int, ...], N: int,
             length: int, shared: list[str], C: int) -> tuple[list[_Layout], dict[str, int]]:
    """Per tensor given: passed as it is when already in the kernels' layout (the rule of
    :func:`explorer.runtime.shapes.marshal`), else the broadcast that lays it out."""
    out: list[_Layout] = []
    row_div: dict[str, int] = {}
    for s in specs:
        x = arrays[s.name]
        tail = ((N,) if s.lane else ()) + ((length,) if s.timed else ())
        full = _full_shape(s, tuple(x.shape), batch)
        own = full[:len(batch)]
        div = shared_rows(own, batch) if s.name in shared and C > 0 else None
        if div is not None and div > 1:
            row_div[s.name] = div
            target, flat = own + tail, (C // div, *tail)
        else:
            target, flat = batch + tail, (C, *tail)
        # as it is: contiguous and as many elements as the layout (nothing broadcast)
        direct = x.is_contiguous() and x.numel() == math.prod(flat) \
            and tuple(full[len(batch):]) == tail
        out.append(_Layout(s.name, direct, target))
    return out, row_div


class PlanCache:
    """The plans of one kernel, most recently used last."""

    def __init__(self) -> None:
        self.plans: OrderedDict[tuple[Any, ...], LaunchPlan] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> LaunchPlan | None:
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
        return plan

    def put(self, key: tuple[Any, ...], plan: LaunchPlan) -> None:
        with self.lock:
            self.plans[key] = plan
            while len(self.plans) > MAX_PLANS:
                self.plans.popitem(last=False)


def run_plan(kernel: CudaKernel, plan: LaunchPlan, arrays: dict[str, Any]) -> dict[str, Any]:
    """Launch the kernels of a plan on these tensors; the outputs as torch tensors (batch
    shape), enqueued on the plan's stream, not waited for."""
    import torch

    tdev = plan.tdevice
    keep: list[Any] = []
    ptrs = [lay.pointer(arrays[lay.name], keep) for lay in plan.layouts]
    outs = {}
    out_ptrs = []
    for name, (inner, _) in plan.outputs.items():
        dtype = plan.out_dtypes[name]
        # zeroed where the kernels add into it (a lane readout)
        t = (torch.zeros(inner, dtype=dtype, device=tdev) if name in plan.added
             else torch.full(inner, float("nan"), dtype=dtype, device=tdev) if plan.poison
             else torch.empty(inner, dtype=dtype, device=tdev))
        outs[name] = t
        out_ptrs.append(t.data_ptr())
    if plan.steps:
        cp = _cupy()
        current = cp.cuda.runtime.getDevice()
        if current != plan.device:
            cp.cuda.runtime.setDevice(plan.device)
        try:
            for ptr, nbytes in plan.reset:
                cp.cuda.runtime.memsetAsync(ptr, 0, nbytes, plan.stream.ptr)
            for k, func, grid, template, slots in plan.steps:
                args = list(template)
                for pos, kind, i in slots:
                    args[pos] = np.int64(ptrs[i] if kind == "in" else out_ptrs[i])
                try:
                    func(grid, k.block, tuple(args), shared_mem=k.shared_bytes,
                         stream=plan.stream)
                except Exception as err:
                    raise kernel._launch_error(k, grid, err) from err
        finally:
            if current != plan.device:
                cp.cuda.runtime.setDevice(current)
    return {name: outs[name].view(shown) for name, (_, shown) in plan.outputs.items()}
