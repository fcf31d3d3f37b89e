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
  nothing broadcast, or one row per block of channels where the kernel takes a row divisor,
  or a parameter's row per channel of the trailing batch axes where it takes a row modulus:
  Mamba's ``A``, ``D`` and ``delta_bias`` of ``(D, ...)``): then its data pointer is passed
  as it is; otherwise a buffer of the plan takes its broadcast;
- every launch's arguments, packed once for ``cuLaunchKernel`` (each is 8 bytes: a pointer or
  an ``int64``): a call writes its pointers into them.

A later call of the same signature does what safety still needs and nothing else: every
tensor is a CUDA tensor on the plan's device (its dtype, shape and strides are the signature),
the outputs are allocated (``torch.empty`` of the output's dtype, on torch's allocator and
current stream; zeroed where the kernels add into them), the broadcast tensors are copied into
their buffers, and the kernels are launched with the data pointers.  Nothing waits for the
GPU.  The host work of such a call is what a short sequence's whole call costs beyond its
kernels (``bench/op_host.py`` and ``bench/mamba_speed.py`` measure it).

The tensors' memory must stay alive until the kernels ran: they are torch tensors used on
torch's current stream, whose caching allocator reuses freed memory in stream order.  A plan's
workspaces and buffers are shared by the calls of that signature: calls on one stream run in
order (a call's copy into a buffer runs after the previous call's kernels read it, and calls
from several threads take the plan's lock from their first copy to their last launch); a call
on another stream has another signature (the stream is part of it), so its own plan.
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

from explorer.runtime.cuda_device import _cupy
from explorer.runtime.shapes import ArgSpec, _full_shape, kept_rows, resolve, shared_rows

if TYPE_CHECKING:
    from explorer.runtime.cuda import CudaKernel

#: plans kept per kernel (least recently used dropped first)
MAX_PLANS = 32

@dataclass
class _Layout:
    """How one tensor reaches the kernels: as it is, or broadcast into a buffer of the plan."""

    name: str
    direct: bool
    #: broadcast to this shape (the batch axes the tensor lacks are leading ones), copied into
    #: ``buffer``: the kernels' flat layout
    target: tuple[int, ...] = ()
    #: the plan's buffer of shape ``target`` (allocated once, rewritten by every call, in
    #: stream order: a call's copy runs after the previous call's kernels read it)
    buffer: Any = None

    def pointer(self, x: Any) -> int:
        """The pointer the kernels get: the tensor's, or the buffer's once ``x`` is copied
        into it (broadcast: one torch operation, no allocation)."""
        if self.direct:
            return int(x.data_ptr())
        self.buffer.copy_(x)
        return int(self.buffer.data_ptr())


@dataclass
class _Step:
    """One kernel launch of a plan, its arguments packed once for ``cuLaunchKernel``: every
    argument is 8 bytes (a pointer or an ``int64``); a call writes the pointers of its tensors
    into ``values`` and launches with ``params``, the array of their addresses."""

    kernel: Any
    #: the ``CUfunction`` of the kernel on the plan's device
    function: int
    grid: tuple[int, int, int]
    #: the argument values (the fixed ones written at build time)
    values: np.ndarray
    #: the address of each value, the ``void**`` cuLaunchKernel reads
    params: np.ndarray
    #: (position, "in" | "out", index into the call's input or output pointers)
    slots: list[tuple[int, str, int]]
    #: the address of ``params`` and CuPy's driver module, read once (not a ctypes object and
    #: an import a call)
    params_ptr: int = 0
    driver: Any = None

    @classmethod
    def packed(cls, kernel: Any, function: Any, grid: tuple[int, int, int],
               template: list[Any], slots: list[tuple[int, str, int]]) -> _Step:
        from cupy.cuda import driver

        values = np.array([0 if v is None else int(v) for v in template], dtype=np.int64)
        params = (np.arange(len(values), dtype=np.uint64) * np.uint64(8)
                  + np.uint64(values.ctypes.data))
        # CuPy's RawKernel holds a Function per device (the current one's: the plan's)
        handle = int(getattr(function, "kernel", function).ptr)
        return cls(kernel, handle, grid, values, params, slots, int(params.ctypes.data), driver)

    def launch(self, ins: list[int], outs: list[int], stream_ptr: int) -> None:
        values = self.values
        for pos, kind, i in self.slots:
            values[pos] = ins[i] if kind == "in" else outs[i]
        self.driver.launchKernel(self.function, *self.grid, *self.kernel.block,
                                 self.kernel.shared_bytes, stream_ptr, self.params_ptr, 0)


@dataclass
class LaunchPlan:
    """What a launch of one call signature needs, bound once (see the module docstring)."""

    C: int
    N: int
    L: int
    batch: tuple[int, ...]
    device: int
    #: the raw CUDA stream the plan launches on (part of the call signature)
    stream: int
    layouts: list[_Layout]
    #: output name -> the shape returned (allocated so: the kernels' flat rows, contiguous)
    outputs: dict[str, tuple[int, ...]]
    #: output name -> its torch dtype; and the torch device (made once, used every call)
    out_dtypes: dict[str, Any] = field(default_factory=dict)
    tdevice: Any = None
    #: outputs the kernels add into (lane readouts): allocated zeroed
    added: set[str] = field(default_factory=set)
    steps: list[_Step] = field(default_factory=list)
    #: (pointer, bytes) of the workspaces zeroed before every launch
    reset: list[tuple[int, int]] = field(default_factory=list)
    #: device memory the plan owns (workspaces, zero initial states): kept alive with it
    owned: list[Any] = field(default_factory=list)
    poison: bool = False
    #: the CUDA context the plan was built in (its device's primary context)
    context: int = 0
    #: the outputs as views of one float32 allocation (a fused backward's gradients: one
    #: allocation and one memset a call, not one of each per output): its floats, each
    #: output's first float (aligned to 128 bytes), and the floats zeroed at its start (the
    #: outputs added into, placed first)
    pool: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    pool_zero: int = 0
    #: held from the first copy to the last launch of a call: calls of one plan from several
    #: threads enqueue their copies, resets and launches one call after the other
    lock: threading.Lock = field(default_factory=threading.Lock)


def call_key(tensors: dict[str, Any], L: int | None, time_chunk: int | None,
             want: Mapping[str, Any]) -> tuple[tuple[Any, ...] | None, int | None]:
    """The signature of a call (None where it takes the checking path) and torch's current
    stream on the first tensor's device (None when that is not a CUDA tensor)."""
    first = next(iter(tensors.values()), None)
    if not type(first).__module__.startswith("torch"):   # torch imported only for its tensors
        return None, None
    import torch

    if not isinstance(first, torch.Tensor) or not first.is_cuda:
        return None, None
    ptr = current_stream(first.get_device())
    return signature(tensors, L, time_chunk, ptr, want, torch.float32), ptr


def current_stream(device: int) -> int:
    """torch's current stream on ``device`` as its raw pointer (no Stream object made)."""
    global _RAW_STREAM
    if _RAW_STREAM is None:
        import torch

        _RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda d: torch.cuda.current_stream(d).cuda_stream)
    return int(_RAW_STREAM(device))


#: torch's function giving the current stream's pointer (found on first use)
_RAW_STREAM: Any = None


def signature(arrays: dict[str, Any], L: int | None, time_chunk: int | None,
              stream_ptr: int, want: Mapping[str, Any], default: Any
              ) -> tuple[Any, ...] | None:
    """The cache key of a call, or None when a tensor is not a CUDA tensor of its argument's
    dtype: ``want[name]`` (the 16-bit arguments' ``torch.bfloat16``/``torch.float16``), else
    ``default`` (``torch.float32``); the others take the checking path of ``prepare``, which
    rounds, casts or refuses them.  The tensors' shapes and strides as torch gives them
    (``torch.Size`` compares and hashes as the tuple it is)."""
    import torch

    parts: list[Any] = [L, time_chunk, stream_ptr]
    device = -1
    tensor = torch.Tensor
    for name in sorted(arrays):
        x = arrays[name]
        if not isinstance(x, tensor) or x.dtype != want.get(name, default):
            return None
        d = x.get_device()   # -1: not on a CUDA device
        if d < 0 or (device >= 0 and d != device):
            return None
        device = d
        parts.append((name, x.shape, x.stride()))
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
    modded = [a.name for a in kernel.artifact.kernels[0].args if a.role == "rowmod"]
    layouts, row_div, row_mod = _layouts(specs, arrays, batch, N, length, shared, C, modded)
    N = N if kernel.vector else 1   # as marshal: the lane axis of the kernels' side
    tdev = torch.device("cuda", device)
    with cp.cuda.Device(device):
        plan = LaunchPlan(C=C, N=N, L=length, batch=batch, device=device, stream=stream_ptr,
                          layouts=layouts, outputs={}, poison=kernel.poison, tdevice=tdev)
        for lay in layouts:
            if not lay.direct:
                lay.buffer = torch.empty(lay.target, dtype=arrays[lay.name].dtype, device=tdev)
                plan.owned.append(lay.buffer)
        for name, info in kernel.output_args.items():
            shown = (*batch, *((N,) if info.lane else ()), *((length,) if info.timed else ()))
            own = tuple(int(k) for k in (sums or {}).get(name, ()))
            if own and not info.reset:
                raise ValueError(f"{name} is not a lane readout: it cannot be summed over "
                                 "channels")
            # summed where the shape keeps leading axes of the batch and is one on the rest
            # (else returned whole: launch_torch sums it after)
            div = shared_rows(own, batch) if own and len(own) == len(batch) and C else None
            if div is not None:
                row_div[name] = div
                shown = (*own, N, length)
            plan.outputs[name] = shown
            plan.out_dtypes[name] = getattr(torch, kernel.narrow.get(name, "float32"))
            if info.reset:
                plan.added.add(name)
        from cupy.cuda import driver

        plan.context = int(driver.ctxGetCurrent())
        # a fused backward's outputs are gradients handed to autograd: views of one
        # allocation there (a forward's are an operator's outputs, which may not alias)
        if kernel.artifact.options.get("backward") and not plan.poison:
            _pooled(plan)
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
                elif a.role == "rowmod":
                    template.append(np.int64(row_mod.get(a.name, C)))
                else:
                    template.append(np.int64(values[a.name]))
            func = _module(kernel.artifact, k).get_function(k.name)
            if k.shared_bytes > 48 * 1024:
                try:
                    func.max_dynamic_shared_size_bytes = k.shared_bytes
                except Exception as err:
                    raise kernel._launch_error(k, grid, err) from err
            plan.steps.append(_Step.packed(k, func, grid, template, slots))
        plan.reset = [(workspaces[n].data_ptr(), workspaces[n].numel() * 4)
                      for n in reset_names]
    return plan


#: floats each pooled output is aligned to (128 bytes)
POOL_ALIGN = 32


def _pooled(plan: LaunchPlan) -> None:
    """Lay the outputs of ``plan`` out in one allocation (see ``LaunchPlan.pool``), the
    outputs added into first; left as they are unless every output is float32."""
    import torch

    if any(d != torch.float32 for d in plan.out_dtypes.values()) or not plan.outputs:
        return
    order = sorted(plan.outputs, key=lambda n: n not in plan.added)
    at = 0
    for name in order:
        at += -at % POOL_ALIGN
        plan.offsets[name] = at
        at += math.prod(plan.outputs[name])
        if name in plan.added:
            plan.pool_zero = at
    plan.pool = at


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def _layouts(specs: list[ArgSpec], arrays: dict[str, Any], batch: tuple[int, ...], N: int,
             length: int, shared: list[str], C: int, modded: list[str] | None = None
             ) -> tuple[list[_Layout], dict[str, int], dict[str, int]]:
    """Per tensor given: passed as it is when already in the kernels' layout (the rule of
    :func:`explorer.runtime.shapes.marshal`), else the broadcast that lays it out; with the
    row divisors and row moduli of the tensors read with fewer rows than channels."""
    out: list[_Layout] = []
    row_div: dict[str, int] = {}
    row_mod: dict[str, int] = {}
    for s in specs:
        x = arrays[s.name]
        tail = ((N,) if s.lane else ()) + ((s.steps(length),) if s.timed else ())
        full = _full_shape(s, tuple(x.shape), batch)
        own = full[:len(batch)]
        rows, div, mod = kept_rows(s.name, own, batch, shared, modded or ())
        if div is not None:
            row_div[s.name] = div
        if mod is not None:
            row_mod[s.name] = mod
        target, flat = (own if rows < C else batch) + tail, (rows, *tail)
        # as it is: contiguous and as many elements as the layout (nothing broadcast)
        direct = x.is_contiguous() and x.numel() == math.prod(flat) \
            and tuple(full[len(batch):]) == tail
        out.append(_Layout(s.name, direct, target))
    return out, row_div, row_mod


class PlanCache:
    """The plans of one kernel (or what else is bound per call signature), most recently used
    last, at most ``limit``."""

    def __init__(self, limit: int = MAX_PLANS) -> None:
        self.plans: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.lock = threading.Lock()
        self.limit = limit

    def get(self, key: tuple[Any, ...]) -> Any:
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
        return plan

    def put(self, key: tuple[Any, ...], plan: Any) -> None:
        with self.lock:
            self.plans[key] = plan
            while len(self.plans) > self.limit:
                self.plans.popitem(last=False)


def run_plan(kernel: CudaKernel, plan: LaunchPlan, arrays: dict[str, Any]) -> dict[str, Any]:
    """Launch the kernels of a plan on these tensors; the outputs by name as torch tensors
    (batch shape), enqueued on the plan's stream, not waited for."""
    import torch

    tdev = plan.tdevice
    outs = {}
    out_ptrs = []
    zero: list[tuple[int, int]] = []
    if plan.pool:
        pool = torch.empty(plan.pool, dtype=torch.float32, device=tdev)
        base = pool.data_ptr()
        for name, shown in plan.outputs.items():
            at = plan.offsets[name]
            outs[name] = pool.as_strided(shown, contiguous_strides(shown), at)
            out_ptrs.append(base + 4 * at)
        if plan.pool_zero:
            zero.append((base, plan.pool_zero * 4))
    for name, shown in (() if plan.pool else plan.outputs.items()):
        dtype = plan.out_dtypes[name]
        # allocated in the shape returned: the same contiguous memory as the kernels' side
        t = (torch.full(shown, float("nan"), dtype=dtype, device=tdev)
             if plan.poison and name not in plan.added
             else torch.empty(shown, dtype=dtype, device=tdev))
        outs[name] = t
        out_ptrs.append(t.data_ptr())
        if name in plan.added:   # the kernels add into it (a lane readout): zeroed below
            zero.append((out_ptrs[-1], t.numel() * t.element_size()))
    enqueue(kernel, plan, [arrays[lay.name] for lay in plan.layouts], out_ptrs, zero)
    return outs


def enqueue(kernel: CudaKernel, plan: LaunchPlan, tensors: list[Any], out_ptrs: list[int],
            zero: list[tuple[int, int]], direct: bool = False) -> None:
    """Enqueue a call of ``plan`` on its stream: ``tensors`` in the order of ``plan.layouts``,
    the outputs' pointers in the order of ``plan.outputs``, ``zero``: (pointer, bytes) of the
    outputs zeroed first (with the plan's workspaces reset); ``direct``: every layout passes
    its tensor as it is (its caller has looked)."""
    cp = _cupy()
    # another device's context is current, or none (a thread that has not used the runtime:
    # one a user starts; torch's allocator can hand out cached memory without a runtime call
    # that would make one current): the plan's device is set, which makes its context current
    prior = cp.cuda.driver.ctxGetCurrent()
    switch = prior != plan.context
    if switch:
        current = cp.cuda.runtime.getDevice()
        cp.cuda.runtime.setDevice(plan.device)
    try:
        with plan.lock:
            ptrs = ([x.data_ptr() for x in tensors] if direct else
                    [lay.pointer(x) for lay, x in zip(plan.layouts, tensors)])
            if plan.steps and (zero or plan.reset):
                for ptr, nbytes in (*zero, *plan.reset):
                    cp.cuda.runtime.memsetAsync(ptr, 0, nbytes, plan.stream)
            for step in plan.steps:
                try:
                    step.launch(ptrs, out_ptrs, plan.stream)
                except Exception as err:
                    raise kernel._launch_error(step.kernel, step.grid, err) from err
    finally:
        if switch and prior and current != plan.device:
            cp.cuda.runtime.setDevice(current)
