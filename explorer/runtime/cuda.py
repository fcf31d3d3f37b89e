"""Runtime stage, CUDA side: launch an artifact's PTX on the GPU through CuPy.

``CudaKernel.from_artifact(artifact)`` gives a callable ``kernel(**arrays) -> outputs``.  Arrays
follow the canonical shape rules of :mod:`explorer.runtime.shapes` (time is the last axis, batch
dimensions broadcast) and may be NumPy arrays (copied to the device and back), CuPy arrays or
PyTorch CUDA tensors (shared with the kernel through DLPack, no copy when already contiguous
float32).  The results come back as the same kind of array as the inputs.  A call on torch
CUDA tensors of the kernels' dtypes goes through a launch plan cached per shapes and strides
(:meth:`CudaKernel.launch_torch`) and, like any torch operation, returns without waiting for
the GPU.

The launch follows the kernel ABI of the artifact manifest: one pointer per input, parameter,
initial state and output, then ``int64`` C, N, L, the row divisors (an input the kernels may
read with a row per block of channels, such as Mamba's ``B`` of ``(batch, 1, N, L)`` beside
``x`` of ``(batch, D, L)``, is passed where it is, not copied per channel: see
:func:`explorer.runtime.shapes.marshal`), then the workspaces; ``block`` from the
manifest and ``grid_x = ceil(C * N / sequences_per_block)`` (times ``ceil(L / time_chunk)`` for
chunked kernels); the manifest's dynamic shared memory.  Several kernels run in manifest order
(skipping those with ``launch_when_longer_than >= L``), all with the same arguments.

A ``time_chunk`` chosen per call (the Blelloch kernels) follows the manifest's ``chunk_rule``
for this device: its SM count and the resident blocks per SM of the chunked kernels (CUDA's
occupancy calculator, through CuPy), see :func:`explorer.runtime.artifact.choose_time_chunk`.
When the sequences alone fill the GPU, each is scanned by one block and the chunk kernels are
skipped.

Only NumPy and CuPy are imported (CuPy lazily, so this module imports on a machine without a
GPU); never MLIR or sympy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorer.errors import LaunchError, RecurrenceError
from explorer.frontend.names import h0_name
from explorer.runtime.artifact import (
    ArgInfo,
    Artifact,
    KernelInfo,
    load_artifact,
)
from explorer.runtime.contract import check_lanes
from explorer.runtime.cuda_device import (  # noqa: F401 - the device API is this module's too
    _cupy,
    _external_stream,
    _from_cupy,
    _input_device,
    _result_kind,
    _ShapeOnly,
    _stream_ctx,
    _to_cupy,
    array_kind,
    check_array_dtype,
    gpu_available,
    gpu_unavailable_reason,
    require_gpu,
)
from explorer.runtime.cuda_modules import (  # noqa: F401 - device_machine is this module's too
    _module,
    call_sizes,
    device_machine,
)
from explorer.runtime.cuda_plan import LaunchPlan, PlanCache, build_plan, call_key, run_plan
from explorer.runtime.dtypes import NARROW, narrow_result, storage
from explorer.runtime.segments import (
    check_cu_seqlens,
    initial_keyword,
    last_shape,
    marshal_initial,
    packed_call,
    segment_marks,
    state_rows,
)
from explorer.runtime.shapes import (
    ArgSpec,
    as_array,
    check_dtype,
    check_float32_range,
    marshal,
    resolve,
)

#: CUDA's limit on gridDim.x
MAX_GRID_X = 2**31 - 1
#: dynamic shared memory a kernel may use without raising its attribute
DEFAULT_SHARED_LIMIT = 48 * 1024


# --- the kernel ------------------------------------------------------------------------------

@dataclass
class Launch:
    """Everything one call needs, on the device: arguments bound, outputs allocated.

    ``launch()`` enqueues the kernels without waiting (what a benchmark times); ``result()``
    waits and returns the outputs in the caller's kind and shape.
    """

    owner: CudaKernel
    C: int
    N: int
    L: int
    batch: tuple[int, ...]
    inputs: dict[str, Any]
    h0: dict[str, Any]
    outputs: dict[str, Any]
    kind: str = "cupy"
    template: Any = None
    stream: Any = None
    device: int | None = None
    workspaces: dict[str, Any] = field(default_factory=dict)
    #: the values of the size arguments (C, N, L and the per-call time_chunk when taken)
    sizes: dict[str, int] = field(default_factory=dict)
    _bound: list[tuple[KernelInfo, Any, tuple[int, int, int], tuple[Any, ...]]] = field(
        default_factory=list, repr=False)
    #: workspaces zeroed before every launch
    _reset: list[Any] = field(default_factory=list, repr=False)
    #: the sequences of a packed batch (``cu_seqlens``), None when the call is not packed
    sequences: int | None = None

    def launch(self, stream: Any = None) -> None:
        s = stream if stream is not None else self.stream
        if self.device is None or len(self._bound) == 0:
            self._launch_all(s)
            return
        with _cupy().cuda.Device(self.device):
            self._launch_all(s)

    def _launch_all(self, stream: Any) -> None:
        if self._reset:
            cp = _cupy()
            ptr = stream.ptr if stream is not None else cp.cuda.get_current_stream().ptr
            for ws in self._reset:   # the look-back flags start at "nothing published"
                cp.cuda.runtime.memsetAsync(ws.data.ptr, 0, ws.nbytes, ptr)
        for kernel, func, grid, args in self._bound:
            self.owner._launch_one(kernel, func, grid, args, stream)

    def synchronize(self) -> None:
        cp = _cupy()
        try:
            if self.stream is not None:
                self.stream.synchronize()
            else:
                cp.cuda.get_current_stream().synchronize()
        except Exception as err:
            kernel, _, grid, _ = self._bound[-1] if self._bound else (None, None, (0, 0, 0), ())
            raise self.owner._launch_error(kernel, grid, err, after=True) from err

    def result(self) -> Any:
        self.synchronize()
        outs = {}
        for name in self.owner.output_names:
            lane = self.owner.output_lane[name]
            arr = self.outputs[name]
            if not self.owner.output_args[name].timed:    # a last state
                shaped = arr.reshape(last_shape(self.sequences, self.batch, self.N, lane))
            else:
                shaped = arr.reshape((*self.batch, self.N, self.L) if lane
                                     else (*self.batch, self.L))
            dtype = self.owner.narrow.get(name)
            outs[name] = (_from_cupy(shaped, self.kind, self.template) if dtype is None else
                          narrow_result(shaped, dtype, self.kind, self.template, _from_cupy))
        if len(outs) == 1:
            return next(iter(outs.values()))
        return outs


class CudaKernel:
    """A compiled artifact ready to run on the current CUDA device."""

    def __init__(self, artifact: Artifact, cast: bool = False, poison: bool = False) -> None:
        self.artifact = artifact
        self.cast = cast
        self.poison = poison
        kernels = artifact.kernels
        specs: dict[str, ArgSpec] = {}
        h0: dict[str, ArgInfo] = {}
        outputs: dict[str, ArgInfo] = {}
        for k in kernels:
            for a in k.args:
                if a.role in ("input", "param"):
                    spec = ArgSpec(a.name, a.role == "input", a.lane, a.every)
                    if specs.setdefault(a.name, spec) != spec:
                        raise LaunchError(f"{a.name} is described differently by two kernels")
                elif a.role == "h0":
                    h0.setdefault(a.name, a)
                elif a.role == "output":
                    outputs.setdefault(a.name, a)
        self.specs, self.h0_args = tuple(specs.values()), h0
        # the keyword a caller uses for each initial state: ``<state>0`` (``h0`` for ``h``);
        # the manifest may name the argument after the state (``h``) or the keyword (``h0``)
        self.h0_keyword = {name: (h0_name(name) if name in outputs else name) for name in h0}
        order = list(artifact.outputs) or list(outputs)
        self.output_names = tuple(o for o in order if o in outputs)
        self.output_args = outputs
        self.output_lane = {n: outputs[n].lane for n in self.output_names}
        self.vector = artifact.vector or any(a.lane for a in outputs.values())
        #: the 16-bit inputs and outputs and their dtypes (see explorer.runtime.dtypes)
        self.narrow = {a.name: a.dtype for k in kernels for a in k.args if a.dtype in NARROW}
        self._plans = PlanCache()
        self._want: dict[str, Any] | None = None
        #: a varlen compile: the kernels read segment marks, a call may pass ``cu_seqlens``
        self.varlen = any(a.role == "segments" for k in kernels for a in k.args)
        #: last states stored (copies of the initial states first; a backward's: gradients)
        self.last_states = not artifact.options.get("backward") and any(
            not a.timed for a in outputs.values())

    @classmethod
    def from_artifact(cls, artifact: Artifact | str | os.PathLike[str], cast: bool = False,
                      poison: bool = False) -> CudaKernel:
        """From a loaded :class:`Artifact` or the path of an artifact directory."""
        if not isinstance(artifact, Artifact):
            artifact = load_artifact(artifact)
        return cls(artifact, cast=cast, poison=poison)

    # names the caller may pass
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    @property
    def h0_names(self) -> tuple[str, ...]:
        """Keyword names of the initial states: ``<state>0`` (``h0`` for the state ``h``)."""
        return tuple(self.h0_keyword[s] for s in self.h0_args)

    def __repr__(self) -> str:
        return (f"CudaKernel({self.artifact.describe()}, inputs={list(self.input_names)}, "
                f"outputs={list(self.output_names)})")

    def __call__(self, /, L: int | None = None, **arrays: Any) -> Any:
        """Run once: ``kernel(a=a, b=b)``; ``L`` only when no input is indexed by time.

        On PyTorch CUDA tensors of the kernels' dtypes the call goes through
        :meth:`launch_torch` (a launch plan cached per shapes and strides, the kernels enqueued
        on torch's current stream, not waited for, as any torch operation; packed calls and
        compiles storing last states are checked and waited for there); other arrays are
        checked, marshalled, launched and waited for (:meth:`prepare`)."""
        if arrays and type(next(iter(arrays.values()))).__module__.startswith("torch"):
            # torch tensors: a launch plan where they are CUDA tensors of the kernels' dtypes
            outs = self.launch_torch(L=L, **arrays)
            return next(iter(outs.values())) if len(outs) == 1 else outs
        run = self.prepare(L=L, **arrays)
        run.launch()
        return run.result()

    def prepare(self, /, stream: Any = None, L: int | None = None, time_chunk: int | None = None,
                **arrays: Any) -> Launch:
        """Check, marshal and bind the arrays; allocate the outputs.  Launches nothing.

        Names, dtypes and shapes are checked before CuPy is touched, so a wrong call raises
        :class:`RecurrenceError` naming the array without any device work.  ``time_chunk``
        forces the chunk length of kernels that take one per call (default: the manifest's
        rule for this device).
        """
        cu = packed_call(self.varlen, arrays)
        # with cu_seqlens an initial state is one per sequence: marshalled on its own
        per_seq = ({k: arrays.pop(k) for k in self.h0_names if k in arrays}
                   if cu is not None else {})
        kind, template = _result_kind(arrays)
        specs = self.check(L=L, **arrays)
        for name, value in per_seq.items():
            check_array_dtype(name, value, self.cast)
        require_gpu()
        cp = _cupy()
        device = _input_device(arrays)
        with cp.cuda.Device(device):
            if kind == "torch" and stream is None and template is not None and template.is_cuda:
                import torch

                stream = _external_stream(torch.cuda.current_stream(template.device)
                                          .cuda_stream)
            # 16-bit inputs are rounded into their storage by marshal (torch ones read there)
            device_arrays = {n: v if n in self.narrow else _to_cupy(n, v, self.cast)
                             for n, v in arrays.items()}
            run = self._bind(specs, device_arrays, kind, template, stream, L, time_chunk,
                             cu, {n: _to_cupy(n, v, self.cast) for n, v in per_seq.items()})
        run.device = device
        return run

    def launch_torch(self, /, L: int | None = None, time_chunk: int | None = None,
                     sums: Mapping[str, tuple[int, ...]] | None = None,
                     **tensors: Any) -> dict[str, Any]:
        """Launch on torch CUDA tensors, on torch's current stream, without waiting: the
        outputs by name as torch tensors (batch shape), through a launch plan per signature
        (:meth:`plan_for`) or, for other tensors, packed calls and compiles storing last states
        (float32 values of a 16-bit argument rounded), the path of :meth:`prepare` (waits).
        ``sums``: lane readouts summed to a batch shape (``cuda_plan.build_plan``)."""
        plan = self.plan_for(L, time_chunk, sums, tensors)
        if plan is None:
            run = self.prepare(L=L, time_chunk=time_chunk, **tensors)
            run.launch()
            out = run.result()
            out = out if isinstance(out, dict) else {self.output_names[0]: out}
        else:
            out = run_plan(self, plan, tensors)
        if not sums:
            return out
        # what the kernels did not sum (another path, a shape they cannot add into) is
        # summed here: either way each lane readout comes back in the shape asked for
        from explorer.torch_arrays import sum_to

        return {k: (sum_to(v, sums[k]) if k in sums else v) for k, v in out.items()}

    def plan_for(self, L: int | None, time_chunk: int | None,
                 sums: Mapping[str, tuple[int, ...]] | None,
                 tensors: dict[str, Any]) -> LaunchPlan | None:
        """The launch plan of a :meth:`launch_torch` call (built on its signature's first
        call), None where it takes the path of :meth:`prepare` (``torch_runner.Runner.bind``)."""
        if self._want is None:   # the torch dtype of each 16-bit argument
            import torch

            self._want = {n: getattr(torch, d) for n, d in self.narrow.items()}
        key, ptr = call_key(tensors, L, time_chunk, self._want)
        if key is None or self.varlen or self.last_states:
            return None
        key = (*key, tuple(sorted((k, tuple(v)) for k, v in sums.items()))) if sums else key
        plan = self._plans.get(key)
        if plan is None:
            require_gpu()
            assert ptr is not None   # a key is made only with torch's stream
            plan = build_plan(self, tensors, L, time_chunk, ptr, sums)
            self._plans.put(key, plan)
        return plan

    def check(self, /, L: int | None = None, **arrays: Any) -> list[ArgSpec]:
        """Names, dtypes and shapes (on the host, no copy); the specs to marshal with."""
        known = set(self.input_names) | set(self.h0_names)
        extra = sorted(set(arrays) - known)
        if extra:
            raise RecurrenceError(
                f"unexpected array{'s' * (len(extra) > 1)}: {', '.join(extra)} (the kernel "
                f"reads {', '.join(self.input_names)}"
                + (f"; initial states {', '.join(self.h0_names)}" if self.h0_names else "")
                + ")")
        missing = [n for n in self.input_names if n not in arrays]
        if missing:
            raise RecurrenceError(f"missing array{'s' * (len(missing) > 1)}: "
                                  f"{', '.join(missing)}")
        for name, value in arrays.items():
            if name in self.narrow:   # any real array: rounded to the 16-bit dtype
                check_dtype(name, as_array(name, value) if not hasattr(value, "dtype")
                            else _ShapeOnly(value))
                continue
            check_array_dtype(name, value, self.cast)
            if array_kind(value) == "numpy":  # values on the host: their range, before any copy
                check_float32_range(name, np.asarray(as_array(name, value)))
        # the spec list: inputs/params, then the initial states that were given
        specs = list(self.specs)
        for state, info in self.h0_args.items():
            if self.h0_keyword[state] in arrays:
                specs.append(ArgSpec(self.h0_keyword[state], False, info.lane))
        _, N, _ = resolve(specs, {n: _ShapeOnly(v) for n, v in arrays.items()}, L)
        try:
            check_lanes(self.artifact.kernels, N if self.vector else 1)
        except ValueError as err:
            raise RecurrenceError(str(err)) from None
        return specs

    def _bind(self, specs: list[ArgSpec], device_arrays: dict[str, Any], kind: str,
              template: Any, stream: Any, L: int | None = None,
              time_chunk: int | None = None, cu_seqlens: Any = None,
              per_seq: dict[str, Any] | None = None) -> Launch:
        cp = _cupy()
        # inputs the kernels may read with a row per block of channels: where they are
        shared = [a.name for a in self.artifact.kernels[0].args if a.role == "rowmap"]
        # parameters the kernels may read with a row per channel of the trailing batch axes
        modded = [a.name for a in self.artifact.kernels[0].args if a.role == "rowmod"]
        with _stream_ctx(stream):
            m = marshal(specs, device_arrays, xp=cp, dtype=cp.float32, L=L, vector=self.vector,
                        shared=shared, dtypes=self.narrow, modded=modded)
            C, N, L = m.C, m.N, m.L
            # a packed batch: its offsets checked, the marks the kernels read
            offsets = (check_cu_seqlens(cu_seqlens if cu_seqlens is not None else [0, L], L)
                       if self.varlen else None)
            sequences = (offsets.shape[0] - 1 if offsets is not None and cu_seqlens is not None
                         else None)
            marks = cp.asarray(segment_marks(offsets, L)) if offsets is not None else None
            h0 = {}
            for state, info in self.h0_args.items():
                key = self.h0_keyword[state]
                if per_seq and key in per_seq:
                    h0[state] = marshal_initial(key, per_seq[key], sequences or 1, m.batch,
                                                N, info.lane, cp)
                elif key in m.arrays:
                    h0[state] = m.arrays[key]
                else:
                    h0[state] = cp.zeros(state_rows(sequences or 1, C, N, info.lane),
                                         dtype=cp.float32)
            by_keyword = {self.h0_keyword[s]: s for s in self.h0_args}
            outputs = {}
            for name, info in self.output_args.items():
                if not info.timed:   # a last state: it starts as the initial state
                    start = h0.get(by_keyword.get(initial_keyword(name), ""))
                    outputs[name] = (start.reshape(-1).copy() if start is not None else
                                     cp.zeros(state_rows(sequences or 1, C, N, info.lane),
                                              dtype=cp.float32))
                    continue
                shape = (C, N, L) if info.lane else (C, L)
                kept = storage(info.dtype)   # NaN poison: 0xFFFF is a bfloat16 NaN too
                # zeroed where the kernels add into it (a lane readout)
                outputs[name] = (cp.zeros(shape, dtype=kept) if info.reset
                                 else cp.full(shape, np.nan if kept.kind == "f" else 0xFFFF,
                                              dtype=kept) if self.poison
                                 else cp.empty(shape, dtype=kept))
        run = Launch(owner=self, C=C, N=N, L=L, batch=m.batch,
                     inputs={s.name: m.arrays[s.name] for s in self.specs}, h0=h0,
                     outputs=outputs, kind=kind, template=template, stream=stream,
                     sequences=sequences)
        if C * N == 0 or L == 0:
            return run  # nothing to compute: empty outputs, no launch
        values = call_sizes(self.artifact, C, N, L, time_chunk)
        run.sizes = values
        sizes = {name: np.int64(v) for name, v in values.items()}
        workspaces: dict[str, Any] = {}
        for k in self.artifact.kernels:
            for a in k.args_with_role("workspace"):
                if a.name not in workspaces:
                    workspaces[a.name] = cp.zeros(a.workspace_size(C, N, L, values),
                                                  dtype=cp.float32)
        run.workspaces = workspaces
        for k in self.artifact.kernels:
            if not k.launched(L, values):
                continue
            # zeroed before every launch, where a kernel that runs reads them (a memset of the
            # look-back's flags costs a launch where only whole sequences are scanned)
            for a in k.args_with_role("workspace"):
                if a.reset and all(w is not workspaces[a.name] for w in run._reset):
                    run._reset.append(workspaces[a.name])
            grid = k.grid(C, N, L, values)
            args: list[Any] = []
            for a in k.args:
                if a.role in ("input", "param"):
                    args.append(run.inputs[a.name])
                elif a.role == "h0":
                    args.append(h0[a.name])
                elif a.role == "output":
                    args.append(outputs[a.name])
                elif a.role == "workspace":
                    args.append(workspaces[a.name])
                elif a.role == "rowmap":
                    args.append(np.int64(m.row_div.get(a.name, 1)))
                elif a.role == "rowmod":
                    args.append(np.int64(m.row_mod.get(a.name, C)))
                elif a.role == "segments":
                    args.append(marks)
                else:
                    args.append(sizes[a.name])
            if grid[0] > MAX_GRID_X:
                raise self._launch_error(k, grid, f"grid_x {grid[0]} exceeds CUDA's limit "
                                         f"{MAX_GRID_X} (C*N={C * N} sequences)")
            func = _module(self.artifact, k).get_function(k.name)
            if k.shared_bytes > DEFAULT_SHARED_LIMIT:
                try:
                    func.max_dynamic_shared_size_bytes = k.shared_bytes
                except Exception as err:
                    raise self._launch_error(k, grid, err) from err
            run._bound.append((k, func, grid, tuple(args)))
        return run

    # --- errors ------------------------------------------------------------------------------

    def _launch_error(self, kernel: KernelInfo | None, grid: tuple[int, int, int],
                      err: object, after: bool = False) -> LaunchError:
        name = kernel.name if kernel else "?"
        block = list(kernel.block) if kernel else []
        shared = kernel.shared_bytes if kernel else 0
        when = "while running" if after else "launching"
        msg = (f"CUDA error {when} kernel {name!r} (grid {list(grid)}, block {block}, "
               f"dynamic shared memory {shared} bytes) from artifact {self.artifact.path}: {err}")
        if after:
            msg += ("\n(an error raised by a running kernel, such as an illegal address, "
                    "leaves the CUDA context unusable; restart the process)")
        exc = LaunchError(msg)
        exc.kernel = name  # type: ignore[attr-defined]
        exc.grid = tuple(grid)  # type: ignore[attr-defined]
        exc.block = tuple(block)  # type: ignore[attr-defined]
        exc.shared_bytes = shared  # type: ignore[attr-defined]
        return exc

    def _launch_one(self, kernel: KernelInfo, func: Any, grid: tuple[int, int, int],
                    args: tuple[Any, ...], stream: Any) -> None:
        try:
            func(grid, kernel.block, args, shared_mem=kernel.shared_bytes, stream=stream)
        except Exception as err:
            raise self._launch_error(kernel, grid, err) from err


def run_artifact(path: str | os.PathLike[str] | Artifact, /, **arrays: Any) -> Any:
    """Load an artifact and run it once: ``run_artifact("out/", a=a, b=b)``."""
    return CudaKernel.from_artifact(path)(**arrays)


__all__ = ["CudaKernel", "Launch", "gpu_available", "gpu_unavailable_reason", "require_gpu",
           "run_artifact", "array_kind", "check_array_dtype"]
