"""What a torch operator of a compile runs (:mod:`explorer.torch_op`): the arguments of one
recurrence as the operator's schema (:class:`Specs`), and a :class:`Runner` that runs the
forward or the adjoint on real tensors: the float64 reference, the CPU compile or the CUDA
kernels on torch's current stream."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from explorer.frontend.names import h0_name

if TYPE_CHECKING:
    from explorer.compiler import Compiled
    from explorer.frontend.recurrence import Recurrence


class Specs:
    """The arguments and results of one compiled recurrence, in the order of its operator."""

    def __init__(self, rec: Recurrence, sums: bool = False) -> None:
        self.rec = rec
        #: with ``sums``, the lane readouts whose batch shape each call may give (an optional
        #: ``SymInt[]`` per readout after the tensors): summed over the channels that share a
        #: row of that shape (the adjoint's gradients of inputs given with a row per block of
        #: channels, summed in its kernel)
        self.sums = list(rec.lane_readouts) if sums and rec.vector else []
        #: name -> (indexed by time, indexed by n)
        self.args = [(n, True, n in rec.lane_names) for n in rec.inputs]
        self.args += [(n, False, n in rec.lane_names) for n in rec.params]
        self.h0 = [(h0_name(s), False, rec.vector) for s in rec.states]
        self.outputs = list(rec.states) + list(rec.readouts)
        self.lane_outputs = ({*rec.states, *rec.lane_readouts} if rec.vector else set())
        #: no input indexed by time: the length is an argument
        self.needs_length = not rec.inputs
        #: the tensors' names, in the operator's order
        self.names = [a[0] for a in self.args + self.h0]

    def schema(self) -> str:
        params = [f"Tensor a{i}" for i in range(len(self.args))]
        params += [f"Tensor? s{i}" for i in range(len(self.h0))]
        if self.needs_length:
            params.append("SymInt length")
        params += [f"SymInt[]? r{i}" for i in range(len(self.sums))]   # always passed
        outs = "Tensor" if len(self.outputs) == 1 else \
            "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        return f"({', '.join(params)}) -> {outs}"

    def sizes(self, values: Sequence[Any], length: Any = None) -> tuple[tuple[Any, ...], Any,
                                                                           Any]:
        """(batch, N, L) from the tensors' shapes (broadcast like the runtime does)."""
        import torch

        batches, N, L = [], None, length
        for (name, timed, lane), x in zip(self.args + self.h0, values):
            if x is None:
                continue
            shape = list(x.shape)
            need = int(timed) + int(lane)
            if len(shape) < need:
                raise ValueError(f"{name} has shape {tuple(shape)}, too few axes")
            if timed:
                L = shape.pop()
            if lane:
                N = shape.pop()
            batches.append(tuple(shape))
        if L is None:
            raise ValueError("no input is indexed by time: pass L=")
        batch = tuple(torch.broadcast_shapes(*batches)) if batches else ()
        return batch, (N if N is not None else 1), L


def dtype_of(values: Sequence[Any]) -> Any:
    """float64 when any tensor is, float32 when all are; other dtypes are refused."""
    import torch

    dtypes = {x.dtype for x in values if x is not None}
    bad = dtypes - {torch.float32, torch.float64}
    if bad:
        raise TypeError(f"the recurrence takes float32 tensors (float64 runs the float64 "
                        f"reference), got {', '.join(str(d) for d in sorted(bad, key=str))}")
    return torch.float64 if torch.float64 in dtypes else torch.float32


def device_of(values: Sequence[Any]) -> Any:
    devices = {x.device for x in values if x is not None}
    if len(devices) > 1:
        raise ValueError(f"the tensors are on several devices: {sorted(map(str, devices))}")
    return next(iter(devices))


def _flip(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x[..., ::-1])


class Runner:
    """Runs one recurrence (the forward or the adjoint) on real tensors."""

    def __init__(self, specs: Specs, reverse: bool,
                 compiled_for: Callable[[str], Compiled],
                 offsets: Mapping[str, int] | None = None) -> None:
        self.specs = specs
        self.reverse = reverse
        self.compiled_for = compiled_for
        #: inputs read at another time (the compiles' ``read_offsets``; the reference too)
        self.offsets = dict(offsets or {})

    def shapes(self, values: Sequence[Any], length: Any = None,
               sums: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        batch, N, L = self.specs.sizes(values, length)
        sums = sums or {}
        return [(*tuple(sums.get(o, batch)), N, L) if o in self.specs.lane_outputs
                else (*batch, L) for o in self.specs.outputs]

    def fake(self, *args: Any) -> Any:
        values, length, sums = self._split(args)
        dtype, device = dtype_of(values), device_of(values)
        first = next(x for x in values if x is not None)
        outs = [first.new_empty(s, dtype=dtype, device=device)
                for s in self.shapes(values, length, sums)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __call__(self, *args: Any) -> Any:
        import torch

        values, length, sums = self._split(args)
        dtype, device = dtype_of(values), device_of(values)
        names = self.specs.names
        given = {n: x for n, x in zip(names, values) if x is not None}
        L = int(length) if length is not None else None
        if dtype == torch.float64:
            outs = self._reference(given, L)
            res = [torch.from_numpy(outs[o]).to(device) for o in self.specs.outputs]
        elif device.type == "cuda":
            return self._result(self._cuda(given, L, sums), {})
        else:
            c = self.compiled_for("cpu")
            arrays = {n: x.detach().numpy() for n, x in given.items()}
            out = c(device="cpu", L=L, **arrays)
            out = out if isinstance(out, dict) else {self.specs.outputs[0]: out}
            res = [torch.from_numpy(np.ascontiguousarray(out[o])) for o in self.specs.outputs]
        return self._result(res, sums)

    def bind(self, *args: Any) -> Callable[..., Any] | None:
        """What :meth:`__call__` does for arguments of this signature (the tensors' shapes,
        strides, dtype and device, the arguments left out, the length), bound to its launch
        plan: a call launches it on the tensors given, without checking them again (its
        caller has: a traced backward keys its graphs on its tensors' layouts,
        :mod:`explorer.fused_backward`); on another stream it takes :meth:`__call__`. None
        where these arguments take no launch plan (not float32 CUDA tensors, lane readouts
        summed, packed compiles)."""
        import torch

        values, length, sums = self._split(args)
        tensors = [x for x in values if x is not None]
        if sums or not all(type(x) is torch.Tensor and x.dtype == torch.float32 and x.is_cuda
                           for x in tensors) or len({x.device for x in tensors}) != 1:
            return None
        from explorer.runtime.cuda_plan import current_stream, run_plan

        names = self.specs.names
        present = [i for i, x in enumerate(values) if x is not None]
        kernel: Any = self.compiled_for("cuda").runner("cuda")
        plan = kernel.plan_for(int(length) if length is not None else None, None, None,
                               {names[i]: values[i] for i in present})
        if plan is None:
            return None
        outputs, device = self.specs.outputs, plan.device

        def launch(*call: Any) -> Any:
            if current_stream(device) != plan.stream:
                return self(*call)
            outs = run_plan(kernel, plan, {names[i]: call[i] for i in present})
            return outs[outputs[0]] if len(outputs) == 1 else tuple(outs[o] for o in outputs)

        return launch

    def _result(self, res: list[Any], sums: Mapping[str, Any]) -> Any:
        """The outputs, the lane readouts in ``sums`` summed to their batch shapes."""
        from explorer.torch_arrays import sum_to

        res = [(sum_to(x, tuple(sums[o])) if o in sums else x)
               for o, x in zip(self.specs.outputs, res)]
        return res[0] if len(res) == 1 else tuple(res)

    def _split(self, args: Sequence[Any]) -> tuple[list[Any], Any, dict[str, Any]]:
        """(tensors, the length or None, lane readout -> the batch shape it is summed to)."""
        k = len(self.specs.sums)
        rows = list(args[len(args) - k:]) if k else []
        args = args[:len(args) - k]
        sums = {o: tuple(r) for o, r in zip(self.specs.sums, rows) if r is not None}
        if self.specs.needs_length:
            return list(args[:-1]), args[-1], sums
        return list(args), None, sums

    def _reference(self, given: dict[str, Any], L: int | None) -> dict[str, np.ndarray]:
        """float64: the sequential float64 reference (a reverse scan as the forward scan of the
        flipped sequence)."""
        from explorer.groundtruth import at_offsets, reference

        rec = self.specs.rec
        arrays = at_offsets({n: x.detach().cpu().numpy().astype(np.float64)
                             for n, x in given.items()}, self.offsets)
        if self.reverse:
            arrays = {n: (_flip(v) if n in rec.inputs else v) for n, v in arrays.items()}
        out = reference(rec, L=L, **arrays)
        out = out if isinstance(out, dict) else {self.specs.outputs[0]: out}
        return {k: (_flip(v) if self.reverse else np.array(v, dtype=np.float64))
                for k, v in out.items()}

    def _cuda(self, given: dict[str, Any], L: int | None,
              sums: Mapping[str, tuple[int, ...]]) -> list[Any]:
        """The PTX kernels through CuPy, on torch's current stream, without synchronising; a
        launch plan cached per shapes and strides (:mod:`explorer.runtime.cuda_plan`) makes a
        repeated call cost little host time."""
        kernel: Any = self.compiled_for("cuda").runner("cuda")
        outs = kernel.launch_torch(L=L, sums=sums or None, **given)
        return [outs[o] for o in self.specs.outputs]
