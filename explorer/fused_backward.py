"""Runtime, PyTorch side: the torch operator's backward with its gradient formulas fused.

In eager mode the backward of :class:`explorer.torch_op.RecurrenceOp` launches the adjoint scan
and then runs the gradient formulas (:func:`explorer.gradients.gradients`) as one torch operation
per product, sum and shift, each reading and writing whole tensors: for the selective scan at
8 x 1536 x 16 x 2^11 that is some twenty passes over B x D x N x L floats around one adjoint
kernel.  Inside ``torch.compile`` the same autograd formula is traced and inductor fuses those
operations into a few kernels.  :class:`FusedBackward` gives eager callers that fusion: it traces
the whole backward once per signature (shapes, strides, dtypes, device, which gradients are
asked for and which output gradients are given) with ``make_fx`` (the aten operations, and the
adjoint scan as its registered custom operator ``scanweaver::bwd_<key>``), compiles the graph
with ``torch.compile`` and runs it from then on.

Traced backward: where the formulas are few (the affine scan's backward is the adjoint kernel
and views of its outputs) fusing saves nothing, but running them still costs the host the
Python of :func:`explorer.gradients.gradients` (the environment, the derivatives, the layouts)
on every call.  ``"traced"`` traces the backward of a signature once as above (fake tensors:
nothing runs while tracing), drops the views that give back a layout they were taken from, and
replays that graph of torch operations, the adjoint's node calling the operator's runner
directly (no dispatch): the same operations, in the same order, without the Python that chose
them.  The node's first call checks the runner's outputs against the trace; its later calls
launch the launch plan of that call directly (``Runner.bind``: the graph runs only for the
signature it was traced for).  Measured on H200 machines (README, *The traced backward*): the
affine scan's backward at 4096 x 1024 took 446 us of host time a call with the eager formulas,
228 us traced, 109 to 121 us with the plan bound (accelerated-scan's: 111 to 129 us).

When (``RecurrenceOp.fuse_backward``): ``"auto"`` (the default) fuses the backwards of vector
recurrences (a lane axis n: their formulas run over B x D x N x L tensors) on float32 CUDA
tensors (the kernels' own; float64 runs the reference) from
the second call of a signature (a training loop repeats its shapes; a backward run once would
pay seconds of compilation to save milliseconds), and replays the traced backward of the other
recurrences on those tensors from the second call; ``"always"`` fuses from the first call, for
any recurrence on any device; ``"traced"`` replays from the first call, on any device;
``"never"`` runs the eager formulas; ``"kernel"`` runs the fused backward kernel of
``compile(text, backward=True)`` where it applies (:mod:`explorer.backward_kernel`), the eager
formulas elsewhere. ``"auto"`` runs that kernel first wherever it applies.  Measured in one
run on an H100 (``bench/grad_speed.py``, methods ``ours`` and ``ours-unfused``), before that
kernel: the selective scan's backward 1.90x faster fused at 8 x 1536 x 16 x 2^11 (20.4 -> 10.8
ms) and 1.34x at 2 x 512 x 16 x 2^10; the
affine scan's (two elementwise operations around the adjoint, bound by host time) within 5%
either way, hence not fused by ``"auto"``.  A signature whose trace or compilation fails
keeps the eager formulas, with one warning naming the error; a compilation that succeeds is
logged (``logging``, INFO, with its seconds).  The last :data:`KEPT` compiled signatures are
kept.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from explorer import backward_kernel
from explorer.runtime.cuda_plan import PlanCache

if TYPE_CHECKING:
    from explorer.torch_op import RecurrenceOp
    from explorer.torch_runner import Runner

log = logging.getLogger(__name__)

#: the values of ``RecurrenceOp.fuse_backward``
POLICIES = ("auto", "always", "traced", "never", "kernel")
#: compiled signatures kept per operator (least recently used dropped)
KEPT = 8

#: a backward's gradients: name -> tensor (None: not asked for)
Gradients = dict[str, Any]


def check_policy(value: object) -> str:
    """``value`` if it is one of POLICIES (True and False read as always and never)."""
    if value is True:
        return "always"
    if value is False:
        return "never"
    if not isinstance(value, str) or value not in POLICIES:
        raise ValueError(f"fuse_backward must be one of {', '.join(POLICIES)} (or True, False), "
                         f"got {value!r:.40}")
    return value


class FusedBackward:
    """The fused backwards of one operator, by signature (see the module docstring)."""

    def __init__(self, op: RecurrenceOp, backend: str = "inductor") -> None:
        self.op = op
        #: the ``torch.compile`` backend (tests on the CPU take ``aot_eager``)
        self.backend = backend
        #: the devices whose backwards ``"auto"`` fuses
        self.auto_devices: tuple[str, ...] = ("cuda",)
        self._seen: dict[tuple[Any, ...], int] = {}
        self._fused: OrderedDict[tuple[Any, ...], Callable[..., Any]] = OrderedDict()
        self._failed: dict[tuple[Any, ...], str] = {}
        self._lock = threading.Lock()
        #: the eager backward's replays, keyed on what autograd hands it (:meth:`eager`)
        self._replays = PlanCache(KEPT)

    def eager(self, ctx: Any, saved: tuple[Any, ...], grads: tuple[Any, ...]
              ) -> tuple[Any, ...]:
        """The eager autograd function's backward where the fused kernel's bound call did not
        take it (``ctx`` of ``explorer.torch_op._Eager``): the gradients in the forward's
        argument order. A signature whose backward replays a graph (traced or fused) is keyed
        on what autograd hands it (the policy, the gradients asked for, the arguments given,
        each saved tensor's and output gradient's shape, strides, offset, dtype and device)
        once its graph runs, and a later call of that key replays it directly: no dictionary
        of names, no key of names and layouts (:class:`_Replay`)."""
        op = self.op
        key = None
        # (an operator the fused kernel takes runs it, not a graph: no key to make a call)
        if not ctx.every and saved and not backward_kernel.may_apply(op):
            key = _replay_key(op, ctx, saved, grads)
            call = self._replays.get(key)
            if call is not None:
                return call(saved, grads)
        arrays, states, cotangents, needed = op._unpack(ctx, grads, ctx.needs_input_grad[1:],
                                                        saved)
        if ctx.every:   # the states saved one step in a tile: laid out again
            states, _ = backward_kernel.restored(op, ctx, arrays, states, cotangents)
        return op._pack(arrays, self(arrays, states, cotangents, needed, key))

    def __call__(self, arrays: dict[str, Any], states: dict[str, Any],
                 cotangents: dict[str, Any], needed: set[str],
                 replay: tuple[Any, ...] | None = None) -> Gradients:
        """The gradients of ``needed`` (what :meth:`RecurrenceOp.gradients` returns), fused
        where the policy says so; ``replay``: the key of :meth:`eager` under which a graph
        that runs is kept (its tensors are the saved ones, then the output gradients given)."""
        policy = self.op.fuse_backward
        # the fused backward kernel computes every gradient itself where it applies and
        # compiles (explorer.backward_kernel; "kernel": the eager formulas elsewhere)
        kernel = self.op.kernel_for(arrays, states, cotangents)
        if kernel is not None:
            return backward_kernel.gradients(self.op, kernel, arrays, states, cotangents,
                                             needed)
        if policy in ("never", "kernel"):
            return self.op.gradients(arrays, states, cotangents, needed)
        traced = policy == "traced" or (policy == "auto" and not self.op.specs.rec.vector)
        tensors = [*arrays.values(), *states.values(), *cotangents.values()]
        layouts = tuple((t.shape, t.stride(), t.storage_offset(), t.dtype, t.device)
                        for t in tensors)
        names = tuple(sorted(needed))
        key = ("traced" if traced else "fused", tuple(arrays), tuple(states),
               tuple(cotangents), names, layouts)
        with self._lock:
            run = self._fused.get(key)
            if run is not None:
                self._fused.move_to_end(key)
        if run is None:   # a signature kept runs as kept, whichever policy made it
            if policy == "auto" and not all(lay[4].type in self.auto_devices
                                            and lay[3] == torch.float32 for lay in layouts):
                return self.op.gradients(arrays, states, cotangents, needed)
            with self._lock:
                calls = self._seen[key] = self._seen.get(key, 0) + 1
                if len(self._seen) > 64 * KEPT:   # a bound on what a shape-changing loop leaves
                    self._seen = {key: calls}
            if key in self._failed or (policy == "auto" and calls < 2):
                return self.op.gradients(arrays, states, cotangents, needed)
            made = self._compile(key, arrays, states, cotangents, list(names))
            if made is None:
                return self.op.gradients(arrays, states, cotangents, needed)
            run, outs = made
        else:
            outs = run(*tensors)
        if replay is not None:
            self._keep(replay, run, names, outs, arrays)
        return {n: g for n, g in zip(names, outs, strict=True) if g is not None}

    def _keep(self, key: tuple[Any, ...], run: Callable[..., Any], names: tuple[str, ...],
              outs: Any, arrays: dict[str, Any]) -> None:
        """Keep ``run`` for :meth:`eager`'s key where its gradients need nothing after it (each
        in its array's dtype: the forward's argument order is all that is left)."""
        if any(g is not None and g.dtype != arrays[n].dtype
               for n, g in zip(names, outs, strict=True)):
            return
        specs = self.op.specs
        at = {n: i for i, n in enumerate(names)}
        order = [at.get(n) if n in arrays else None for n in specs.names]
        self._replays.put(key, _Replay(run, order, specs.needs_length))

    @property
    def signatures(self) -> int:
        """How many signatures run fused now."""
        return len(self._fused)

    def _compile(self, key: tuple[Any, ...], arrays: dict[str, Any], states: dict[str, Any],
                 cotangents: dict[str, Any], names: list[str]
                 ) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """Trace and compile the backward of ``key``, keep it, and return it with its
        gradients of ``names`` from this call (None: it failed, and the eager formulas are to
        run)."""
        from torch.fx.experimental.proxy_tensor import make_fx

        needed = set(names)
        split = (len(arrays), len(states))

        def backward(*tensors: Any) -> tuple[Any, ...]:
            a, s = tensors[:split[0]], tensors[split[0]:split[0] + split[1]]
            g = tensors[split[0] + split[1]:]
            res = self.op.gradients(dict(zip(arrays, a)), dict(zip(states, s)),
                                    dict(zip(cotangents, g)), needed)
            return tuple(res.get(n) for n in names)

        tensors = [*arrays.values(), *states.values(), *cotangents.values()]
        start = time.perf_counter()
        mode = key[0]
        try:
            # functional: the formulas' shifts write into views (out=), which the compilers
            # take only as functional operations (views stay views: as copies, inductor would
            # copy the saved states)
            functional = torch.func.functionalize(backward, remove="mutations")
            if mode == "fused":
                graph = make_fx(functional)(*tensors)
                run = torch.compile(graph, backend=self.backend, dynamic=False, fullgraph=True)
            else:
                graph = make_fx(functional, tracing_mode="fake")(*tensors)
                run = _direct_adjoint(graph, self.op)
            outs = run(*tensors)   # compiles now: a failure falls back here, not later
        except Exception as err:  # noqa: BLE001 - any failure keeps the eager formulas
            why = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            with self._lock:
                if len(self._failed) > 64 * KEPT:
                    self._failed.clear()
                self._failed[key] = why
            what = "compiled" if mode == "fused" else "traced"
            warnings.warn(f"the {mode} backward of {self.op!r} could not be {what} for these "
                          f"shapes ({why}); its gradients run as eager torch operations",
                          RuntimeWarning, stacklevel=4)
            return None
        log.info("%s the %s backward of %r for shapes %s in %.1f s",
                 "compiled" if mode == "fused" else "traced", mode, self.op,
                 [tuple(t.shape) for t in tensors], time.perf_counter() - start)
        with self._lock:
            self._fused[key] = run
            while len(self._fused) > KEPT:
                self._fused.popitem(last=False)
        return run, tuple(outs)


def _replay_key(op: RecurrenceOp, ctx: Any, saved: tuple[Any, ...], grads: tuple[Any, ...]
                ) -> tuple[Any, ...]:
    parts: list[Any] = [op.fuse_backward, ctx.needs_input_grad, ctx.present]
    for x in saved:
        parts.append((x.shape, x.stride(), x.storage_offset(), x.dtype, x.device))
    for g in grads:
        parts.append(None if g is None else (type(g), g.shape, g.stride(), g.storage_offset(),
                                             g.dtype, g.device))
    return tuple(parts)


class _Replay:
    """A graph replayed for one key of :meth:`FusedBackward.eager`: its tensors are the saved
    ones and the output gradients given, in order (what :meth:`FusedBackward.__call__` passes
    it); ``order``: per argument of the forward, the index of its gradient among the graph's
    outputs (None: not asked for)."""

    def __init__(self, run: Callable[..., Any], order: list[int | None], length: bool) -> None:
        self.run, self.order, self.length = run, order, length

    def __call__(self, saved: tuple[Any, ...], grads: tuple[Any, ...]) -> tuple[Any, ...]:
        outs = self.run(*saved, *[g for g in grads if g is not None])
        res = [None if j is None else outs[j] for j in self.order]
        if self.length:
            res.append(None)
        return tuple(res)


def _direct_adjoint(graph: Any, op: RecurrenceOp) -> Any:
    """``graph`` (traced by ``make_fx`` on fake tensors) with its calls of the operator's adjoint
    (``scanweaver::bwd_<key>``) calling the adjoint's runner instead: what the custom operator
    runs in eager mode, without its dispatch.  The operations after it were traced on the fake
    implementation's outputs: the node's first call checks that the runner's outputs have the
    shapes, strides and dtypes those had (a view traced on other strides would read other
    elements), and raises where they do not; then launches that call's plan (:func:`_checked`)."""
    target = op.adjoint_overload
    runner = op.adjoint_runner
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target is target:
            val = node.meta.get("val")
            vals = val if isinstance(val, (tuple, list)) else (val,)
            node.target = _checked(runner, tuple(_layout(v) for v in vals))
    _drop_identity_views(graph.graph)
    graph.recompile()
    return graph.forward   # the module's call machinery (hooks) is not needed


def _view_ops() -> frozenset[Any]:
    aten = torch.ops.aten
    return frozenset([aten.view.default, aten._unsafe_view.default, aten.select.int,
                      aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
                      aten.squeeze.dims, aten.slice.Tensor, aten.alias.default,
                      aten.permute.default])


def _drop_identity_views(graph: Any) -> None:
    """Views that give back the layout of a tensor they were taken from (through views only):
    the canonical layout's reshapes around the adjoint (``(C, L)`` to ``(C, 1, L)`` and back)
    are most of a scalar recurrence's traced backward, each a few microseconds of dispatch. A
    view with the shape, strides and storage offset of one of its view ancestors reads the same
    elements of the same storage: its uses take that ancestor."""
    views = _view_ops()

    def layout(node: Any) -> Any:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if not isinstance(val, torch.Tensor):
            return None
        return (tuple(val.shape), tuple(val.stride()), val.storage_offset())

    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in views:
            continue
        want = layout(node)
        src = node.args[0]
        while want is not None and src is not None:
            if layout(src) == want:
                node.replace_all_uses_with(src)
                break
            src = (src.args[0] if getattr(src, "op", None) == "call_function"
                   and src.target in views else None)
    graph.eliminate_dead_code()


def _layout(t: Any) -> tuple[Any, ...] | None:
    return None if t is None else (tuple(t.shape), tuple(t.stride()), t.dtype)


def _checked(runner: Runner, want: tuple[Any, ...]) -> Callable[..., Any]:
    """The adjoint's node: the runner's call, its outputs checked against the trace's layouts;
    from then on, on CUDA, the launch plan of that call bound (``Runner.bind``: the graph runs
    only for the signature it was traced for, so the adjoint's arguments keep their layouts,
    and the plan allocates the outputs the check saw)."""
    bound: list[Any] = []

    def adjoint(*args: Any) -> Any:
        if bound and bound[0] is not None:
            return bound[0](*args)
        out = runner(*args)
        outs = out if isinstance(out, tuple) else (out,)
        got = tuple(_layout(o) for o in outs)
        if got != want:
            raise RuntimeError(f"the adjoint returned {got}, its trace had {want}")
        if not bound:
            try:
                bound.append(runner.bind(*args))
            except Exception:  # noqa: BLE001 - unbound, the checked call goes on
                bound.append(None)
        return out

    return adjoint
