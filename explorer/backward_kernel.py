"""The fused backward kernel (``compile(text, backward=True)``) as the torch operator runs it.

With ``fuse_backward="auto"`` (the default) or ``"kernel"``, where it applies (a diagonal
recurrence scanned forwards, readouts summed over the lanes, float32 CUDA tensors,
:func:`explorer.passes.fused_adjoint.supported`), the operator's backward is this one kernel:
it reads the tensors the forward saved (the inputs, parameters and the states at its tiles'
last steps: :func:`checkpoints`) and the output gradients, and writes every gradient; no
adjoint ``lam`` is laid out and no formula runs after it (a parameter given for trailing batch
axes alone gets its gradient in its own rows; one given otherwise, per channel, summed after).
Where the loss reads the readouts alone (no state has a gradient, the usual case) the kernel is
the ``backward="readouts"`` compile, which reads no state cotangent; else the
``backward=True`` one. An output the loss does not read gets zeros (a tensor kept with the
call: of one sequence for a state, a row every channel reads; of the channels' steps for a
readout). Measured faster than the adjoint and its fused formulas (README, *Gradients*).

A call's host work is bound once per signature (:class:`_Bound`: the tensors' shapes and
strides, the cotangents given, the gradients asked for, torch's stream): the kernel's launch
plan, the zeros it reads and the sums after it; a later call of that signature allocates the
gradients and launches. Where nothing runs after the kernel (every gradient is a view of its
outputs' one allocation: the usual case), the eager autograd function goes further
(:func:`fast`): keyed on what autograd hands its backward (the saved tensors and the output
gradients as they come), a call is one allocation, one memset, one launch and a view per
gradient, no dictionary of names built (and a contiguous copy of an output gradient given
otherwise, such as the expanded one of a ``y.sum()``); the backward's host time is most of a
short sequence's (README, *The fused backward kernel*).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from explorer.runtime.cuda_plan import PlanCache, contiguous_strides, current_stream, enqueue

#: signatures bound per kernel (least recently used dropped first)
KEPT = 8


def applies(op: Any, arrays: dict[str, Any], states: dict[str, Any]) -> bool:
    """Whether ``op``'s backward on these tensors runs the fused kernel."""
    if not may_apply(op):
        return False
    tensors = [*arrays.values(), *states.values()]
    return all(type(x) is torch.Tensor and x.is_cuda and x.dtype == torch.float32
               for x in tensors)


def reads_states(op: Any, cotangents: dict[str, Any]) -> bool:
    """Whether the kernel must read the states' cotangents: the loss reads a state, or the
    recurrence has no readouts (then ``backward="readouts"`` has nothing to read)."""
    rec = op.compiled.recurrence
    return not rec.readouts or any(s in cotangents for s in rec.states)


@dataclass
class _Bound:
    """One signature's call, bound: the kernel's launch plan and what runs around it."""

    runner: Any
    plan: Any
    #: the state and the kernel's argument of its saved values
    state: str
    saved: str
    #: the kernel's arguments that are not the call's tensors: zeros (kept, never written)
    zeros: dict[str, Any]
    #: cotangent argument -> the forward output whose gradient it is (those given)
    cotangents: dict[str, str]
    #: kernel output -> the batch axes summed after it (lane readouts not summed inside)
    after: dict[str, list[int]]
    #: (argument, kernel output, leading axes summed, then axes summed keeping them); for a
    #: parameter whose rows the kernel added into, None and the strides of its shape (the
    #: output's first rows are its gradient)
    grads: list[tuple[str, str, tuple[int, ...] | None, list[int]]] = field(
        default_factory=list)


@dataclass
class _Fast:
    """A bound signature whose gradients are views of the kernel's outputs (see
    :func:`fast`): the call with nothing around the launch."""

    runner: Any
    plan: Any
    #: per tensor the plan reads (``plan.layouts``' order): (0, index into the saved tensors),
    #: (1, index into the output gradients) or (2, index into ``zeros``)
    sources: list[tuple[int, int]]
    zeros: tuple[Any, ...]
    #: each kernel output's first byte in the allocation (``plan.outputs``' order)
    offsets: list[int]
    #: per argument of the forward (the length too, where it is one): None, or (shape, strides,
    #: first float) of its gradient in the allocation
    views: list[tuple[tuple[int, ...], tuple[int, ...], int] | None]
    #: every tensor passed as it is (none broadcast into a buffer of the plan)
    direct: bool = False
    #: every state saved (no :func:`checkpoints`): their index among the saved tensors and
    #: the kernel's tile, whose last steps it reads (copied into the plan's buffer)
    thin: tuple[int, int] | None = None
    #: the output gradients given not contiguous (the expanded one of a ``y.sum()``, a
    #: strided one), by index: copied contiguous first, as the general path lays them out
    copied: tuple[int, ...] = ()

    def __call__(self, saved: tuple[Any, ...], grads: tuple[Any, ...]) -> tuple[Any, ...]:
        plan = self.plan
        if self.copied:
            grads = tuple(g.contiguous() if i in self.copied else g
                          for i, g in enumerate(grads))
        if self.thin is not None:
            i, every = self.thin
            saved = (*saved[:i], tile_ends(saved[i], every), *saved[i + 1:])
        pool = torch.empty(plan.pool, dtype=torch.float32, device=plan.tdevice)
        base = pool.data_ptr()
        given = (saved, grads, self.zeros)
        zero = [(base, plan.pool_zero * 4)] if plan.pool_zero else []
        enqueue(self.runner, plan, [given[k][i] for k, i in self.sources],
                [base + at for at in self.offsets], zero, self.direct)
        return tuple(None if v is None else pool.as_strided(*v) for v in self.views)


def fast(op: Any, ctx: Any, saved: tuple[Any, ...], grads: tuple[Any, ...]
         ) -> tuple[Any, ...] | None:
    """The gradients of an eager backward (``ctx`` of ``explorer.torch_op._Eager``: the
    operator's arguments, in order) where its signature is bound to a :class:`_Fast` call;
    None where it takes the general path (not CUDA, not the fused kernel, or something runs
    after it). The key is what the general path decides on: the policy, torch's stream, the
    gradients asked for, the arguments given, every saved tensor's shape, strides and dtype,
    and each output gradient's (None where the loss does not read that output)."""
    first = saved[0] if saved else None
    if first is None or not first.is_cuda or not may_apply(op):
        return None
    parts: list[Any] = [op.fuse_backward, current_stream(first.get_device()),
                        ctx.needs_input_grad, ctx.present, ctx.every, ctx.full]
    for x in saved:
        parts.append((x.shape, x.stride(), x.dtype))
    for g in grads:
        parts.append(None if g is None else (type(g), g.shape, g.stride(), g.dtype, g.device))
    key = tuple(parts)
    call = op.bindings.get(key)
    if call is None:
        call = _make_fast(op, ctx, saved, grads) or False   # False: the general path, kept
        op.bindings.put(key, call)
    return call(saved, grads) if call else None


def may_apply(op: Any) -> bool:
    """What :func:`applies` decides of the operator alone (its policy, its recurrence),
    without a tensor: also asked before a key is made, so that an operator whose backward
    never runs the kernel (a scalar recurrence's, ``fuse_backward="never"``) pays nothing for
    it."""
    if op.fuse_backward not in ("auto", "kernel") or op.reverse or op.lane_gradients:
        return False
    if op.kernel_form is None:   # decided once per operator
        from explorer.passes.fused_adjoint import supported

        op.kernel_form = supported(op.compiled.form) is None
    return bool(op.kernel_form)


def _make_fast(op: Any, ctx: Any, saved: tuple[Any, ...], grads: tuple[Any, ...]
               ) -> _Fast | None:
    """The :class:`_Fast` call of this signature, or None where it takes the general path."""
    arrays, states, cotangents, needed = op._unpack(ctx, grads, ctx.needs_input_grad[1:],
                                                    saved)
    if ctx.every:
        states, kept = restored(op, ctx, arrays, states, cotangents)
        if not kept:   # recomputed by the forward: the general path
            return None
    kernel = op.kernel_for(arrays, states, cotangents)
    if kernel is None or _no_steps(op, arrays, states, cotangents):
        return None
    bound = _bind(op, kernel, arrays, states, cotangents, needed)
    if bound is None or bound.after or not bound.plan.pool:
        return None
    plan = bound.plan
    specs = op.specs
    given = [n for n, p in zip(specs.names, ctx.present) if p]
    where = {n: (0, i) for i, n in enumerate(given)}
    where[bound.saved] = (0, len(given) + list(specs.rec.states).index(bound.state))
    where.update({arg: (1, specs.outputs.index(o)) for arg, o in bound.cotangents.items()})
    where.update({arg: (2, i) for i, arg in enumerate(bound.zeros)})
    if any(lay.name not in where for lay in plan.layouts):
        return None
    grads_of = {name: (target, lead, keep) for name, target, lead, keep in bound.grads}
    views: list[tuple[tuple[int, ...], tuple[int, ...], int] | None] = []
    for name in specs.names:
        if name not in grads_of:
            views.append(None)
            continue
        target, lead, keep = grads_of[name]
        want, at = tuple(arrays[name].shape), plan.offsets[target]
        if lead is None:   # a parameter's rows the kernel added into: its first rows
            views.append((want, tuple(keep), at))
        elif not lead and not keep and tuple(plan.outputs[target]) == want:
            views.append((want, contiguous_strides(want), at))
        else:
            return None   # summed after the kernel
    if specs.needs_length:
        views.append(None)
    state_at = where[bound.saved][1]
    copied = tuple(specs.outputs.index(o) for o in bound.cotangents.values()
                   if not cotangents[o].is_contiguous())
    return _Fast(bound.runner, plan, [where[lay.name] for lay in plan.layouts],
                 tuple(bound.zeros.values()), [4 * plan.offsets[o] for o in plan.outputs],
                 views, all(lay.direct for lay in plan.layouts),
                 None if ctx.every else (state_at, tile_of(kernel)), copied)


def checkpoints(op: Any, ctx: Any, values: Sequence[Any], out: Any) -> int | None:
    """The steps between the states the eager forward saves, or None where it saves every
    state. The fused kernel reads the state at the last step of each of its tiles alone
    (``scan.recompute {every}``; its argument of one step in ``every``) and recomputes the
    others: where it will run the backward (its policy and recurrence, float32 CUDA tensors, a
    gradient asked for, the kernel compiled or read from a record) the forward saves those
    steps (``h[..., every-1::every]``, 1/512 of the states at the default tile) and the
    kernel reads them as they are. ``op.checkpoints = False`` saves every state (the kernel
    then reads its steps through a copy a call); a backward that runs anything else
    recomputes the states with the forward's kernel (:func:`restored`)."""
    if not (op.checkpoints is True or op.checkpoints is False or op.checkpoints == "auto"):
        # (identity: 1 and 0 compare equal to True and False, and 0 would have meant "on")
        raise ValueError(f"op.checkpoints is True, False or 'auto', not {op.checkpoints!r:.40}")
    # (a Function's forward runs with grad mode off: what is asked of it is needs_input_grad)
    if op.checkpoints is False or not any(ctx.needs_input_grad) or not may_apply(op):
        return None
    outs = out if isinstance(out, tuple) else (out,)
    if len(op._state_outputs) != 1:
        return None
    h = outs[op._state_outputs[0]]
    tensors = [x for x in values if x is not None and not isinstance(x, int)]
    if not all(type(x) is torch.Tensor and x.is_cuda and x.dtype == torch.float32
               for x in (*tensors, h)):
        return None
    kernel = op._backward_kernel(states=False)
    return None if kernel is None else tile_of(kernel)


def tile_of(compiled: Any) -> int:
    """The steps of a fused backward kernel's tile: it reads the states one step in these."""
    return int(compiled.scan_plan.tile)


def tile_ends(h: Any, every: int) -> Any:
    """The states ``h`` at the last step of each tile of ``every`` steps (a view): what the
    fused kernel reads of them, and what the eager forward saves (:func:`checkpoints`)."""
    return h[..., every - 1::every]


def restored(op: Any, ctx: Any, arrays: dict[str, Any], states: dict[str, Any],
             cotangents: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The states of a backward whose forward saved one step in a tile (:func:`checkpoints`):
    as saved where the fused kernel that runs reads those steps (True), else recomputed by the
    forward's kernel from the tensors saved (False: a policy changed since, another kernel's
    tile)."""
    (name, saved), = states.items()
    kernel = op.kernel_for(arrays, states, cotangents)
    if kernel is not None and tile_of(kernel) == ctx.every:
        return states, True
    values: list[Any] = [arrays.get(n) for n in op.specs.names]
    if op.specs.needs_length:
        values.append(ctx.full[-1])
    with torch.no_grad():
        out = op.forward_call(values)
    outs = out if isinstance(out, tuple) else (out,)
    return {name: outs[op.specs.outputs.index(name)]}, False


def _length(op: Any, arrays: dict[str, Any], cotangents: dict[str, Any]) -> int:
    """The steps of a backward: its inputs' last axis, or (a recurrence without inputs) its
    output gradients' (a backward has one at least)."""
    inputs = op.compiled.recurrence.inputs
    x = arrays[inputs[0]] if inputs else next(iter(cotangents.values()))
    return int(x.shape[-1])


def _no_steps(op: Any, arrays: dict[str, Any], states: dict[str, Any],
              cotangents: dict[str, Any]) -> bool:
    """Whether the states have no step at all (no channel, no lane or a length of 0): the
    saved ones' own size does not say, since a forward that saved one step in a tile saved
    none of a sequence shorter than a tile."""
    h = next(iter(states.values()))
    return math.prod(h.shape[:-1]) * _length(op, arrays, cotangents) == 0


def kernel_states(op: Any, compiled: Any, arrays: dict[str, Any], cotangents: dict[str, Any],
                  h: Any) -> Any:
    """What the fused kernel of ``compiled`` reads of the states ``h``: the steps at its tiles'
    ends (one in its tile); ``h`` itself where it holds those alone (the forward saved them:
    its last axis is not the backward's length), else a view of them."""
    if h.shape[-1] != _length(op, arrays, cotangents):
        return h
    return tile_ends(h, tile_of(compiled))


def bindings() -> Any:
    """The bound signatures of one operator (see the module docstring), at most :data:`KEPT`."""
    return PlanCache(KEPT)


def _key(states_read: bool, arrays: dict[str, Any], states: dict[str, Any],
         cotangents: dict[str, Any], needed: set[str]) -> tuple[Any, ...]:
    first = next(iter(states.values()))
    parts: list[Any] = [states_read, current_stream(first.get_device()), first.get_device(),
                        tuple(sorted(needed))]
    for group in (arrays, states, cotangents):
        parts += [(n, x.shape, x.stride()) for n, x in group.items()]
    return tuple(parts)


def gradients(op: Any, compiled: Any, arrays: dict[str, Any], states: dict[str, Any],
              cotangents: dict[str, Any], needed: set[str]) -> dict[str, Any]:
    """The gradients of ``needed`` from the kernel of ``compiled`` (a ``backward=True`` or
    ``"readouts"`` compile of ``op``'s recurrence)."""
    from explorer.passes.backward import reads_states as compiled_reads
    from explorer.runtime.cuda_plan import run_plan

    states_read = compiled_reads(compiled.options["backward"])
    if _no_steps(op, arrays, states, cotangents):   # nothing to launch: every gradient is zero
        return {name: torch.zeros_like(arrays[name]) for name in needed}
    table = op.bindings
    key = _key(states_read, arrays, states, cotangents, needed)
    bound = table.get(key)
    if bound is None:
        bound = _bind(op, compiled, arrays, states, cotangents, needed)
        if bound is None:   # another launch path (not a plan): every call takes it
            return _unbound(op, compiled, arrays, states, cotangents, needed)
        table.put(key, bound)
    given = dict(arrays)
    given[bound.saved] = kernel_states(op, compiled, arrays, cotangents,
                                       states[bound.state])
    for name, o in bound.cotangents.items():
        given[name] = cotangents[o].contiguous()   # itself where it is
    given.update(bound.zeros)
    outs = run_plan(bound.runner, bound.plan, given)
    for name, axes in bound.after.items():
        outs[name] = outs[name].sum(dim=axes, keepdim=True)
    res: dict[str, Any] = {}
    for name, target, lead, keep in bound.grads:
        x = outs[target]
        if lead is None:   # its first rows, in the parameter's shape (``keep``: its strides)
            res[name] = x.as_strided(arrays[name].shape, keep)
            continue
        if lead:
            x = x.sum(dim=lead)
        res[name] = x.sum(dim=keep, keepdim=True) if keep else x
    return res


def _adjoint(op: Any, compiled: Any) -> Any:
    """The terms the kernel of ``compiled`` computes (its ``backward`` option says whether it
    reads the states' cotangents)."""
    from explorer.passes.backward import reads_states as compiled_reads
    from explorer.passes.fused_adjoint import derived

    return derived(op.compiled.form, compiled_reads(compiled.options["backward"]))


def _inputs(op: Any, compiled: Any, fa: Any, arrays: dict[str, Any], states: dict[str, Any],
            cotangents: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any],
                                                 dict[str, str], dict[str, Any]]:
    """(the kernel's tensors, the zeros among them, the cotangents given by argument, the
    sums asked of its lane readouts) of a call of the kernel computing ``fa``."""

    rec = op.compiled.recurrence
    h = states[fa.state]
    batch, N = tuple(h.shape[:-2]), h.shape[-2]
    L = _length(op, arrays, cotangents)
    given = dict(arrays)
    given[fa.saved] = kernel_states(op, compiled, arrays, cotangents, h)
    zeros: dict[str, Any] = {}
    named: dict[str, str] = {}
    for o, name in fa.cotangents.items():
        g = cotangents.get(o)
        if g is None:
            shape = ((1,) * len(batch) + (N, L)) if o in rec.states else (*batch, L)
            zeros[name] = given[name] = torch.zeros(shape, dtype=torch.float32,
                                                    device=h.device)
        else:
            named[name] = o
            given[name] = g.contiguous()
    sums = {g.target: tuple(arrays[g.of].shape[:-2]) for g in fa.gradients
            if g.over == "rows" and g.of in arrays}
    return given, zeros, named, sums


def _bind(op: Any, compiled: Any, arrays: dict[str, Any], states: dict[str, Any],
          cotangents: dict[str, Any], needed: set[str]) -> _Bound | None:
    """The call's signature bound (None where its kernel takes the path without a plan)."""
    fa = _adjoint(op, compiled)
    given, zeros, named, sums = _inputs(op, compiled, fa, arrays, states, cotangents)
    runner: Any = compiled.runner("cuda")
    plan = runner.plan_for(None, None, sums or None, given)
    if plan is None:
        return None
    after = {}
    for name, own in sums.items():
        shown = plan.outputs[name]
        axes = [i for i, k in enumerate(own) if k == 1 and shown[i] != 1]
        if axes:
            after[name] = axes
    bound = _Bound(runner, plan, fa.state, fa.saved, zeros, named, after)
    for g in fa.gradients:
        if g.of not in needed:
            continue
        if g.over in ("time", "all") and _added_into_rows(g, arrays[g.of], plan.batch):
            shape = tuple(arrays[g.of].shape)
            strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
            bound.grads.append((g.of, g.target, None, strides))
            continue
        shown = plan.outputs[g.target]
        if g.target in after:
            shown = tuple(1 if i in after[g.target] else k for i, k in enumerate(shown))
        want = tuple(arrays[g.of].shape)
        lead = max(0, len(shown) - len(want))
        rest = shown[lead:]
        # a parameter's rows, or an input's batch axes given as 1: summed over the channels
        # that share them
        keep = [i for i, k in enumerate(want) if k == 1 and rest[i] != 1]
        bound.grads.append((g.of, g.target, tuple(range(lead)), keep))
    return bound


def _added_into_rows(g: Any, x: Any, batch: tuple[int, ...]) -> bool:
    """Whether the kernel added a parameter's gradient into the parameter's own rows (it is
    given for trailing batch axes alone: the channels read row ``c % rows``, the first rows of
    the output are its gradient); otherwise the output is per channel, summed after."""
    from explorer.runtime.shapes import ArgSpec, _full_shape, kept_rows

    own = _full_shape(ArgSpec(g.of, False, g.over == "time"), tuple(x.shape), batch)
    _, _, mod = kept_rows(g.of, own[:len(batch)], batch, (), (g.of,))
    return mod is not None


def _unbound(op: Any, compiled: Any, arrays: dict[str, Any], states: dict[str, Any],
             cotangents: dict[str, Any], needed: set[str]) -> dict[str, Any]:
    """A call whose kernel takes the checking path (no launch plan)."""
    from explorer.torch_arrays import sum_to

    fa = _adjoint(op, compiled)
    given, _, _, sums = _inputs(op, compiled, fa, arrays, states, cotangents)
    outs = compiled.runner("cuda").launch_torch(sums=sums or None, **given)
    res: dict[str, Any] = {}
    for g in fa.gradients:
        if g.of not in needed:
            continue
        x = outs[g.target]
        want = tuple(arrays[g.of].shape)
        lead = len(x.shape) - len(want)
        if lead > 0:
            x = x.sum(dim=tuple(range(lead)))
        res[g.of] = sum_to(x, want)
    return res
