"""The fused backward kernel (``compile(text, backward=True)``) as the torch operator runs it.

With ``fuse_backward="auto"`` (the default) or ``"kernel"``, where it applies (a diagonal
recurrence scanned forwards, readouts summed over the lanes, float32 CUDA tensors,
:func:`explorer.passes.fused_adjoint.supported`), the operator's backward is this one kernel:
it reads the tensors the forward saved (the inputs, parameters and the states) and the output
gradients, and writes every gradient; no adjoint ``lam`` is laid out, and no formula runs after
it but the sums of the parameters' per-channel gradients over the channels that share them. An
output the loss does not read gets zeros: of one sequence for a state (a row every channel
reads), of the channels' steps for a readout. Measured faster than the adjoint and its fused
formulas (README, *Gradients*).
"""

from __future__ import annotations

from typing import Any


def applies(op: Any, arrays: dict[str, Any], states: dict[str, Any]) -> bool:
    """Whether ``op``'s backward on these tensors runs the fused kernel."""
    import torch

    from explorer.passes.fused_adjoint import supported

    if op.fuse_backward not in ("auto", "kernel") or op.reverse or op.lane_gradients:
        return False
    if supported(op.compiled.form) is not None:
        return False
    tensors = [*arrays.values(), *states.values()]
    return all(type(x) is torch.Tensor and x.is_cuda and x.dtype == torch.float32
               for x in tensors)


def gradients(op: Any, compiled: Any, arrays: dict[str, Any], states: dict[str, Any],
              cotangents: dict[str, Any], needed: set[str]) -> dict[str, Any]:
    """The gradients of ``needed`` from the kernel of ``compiled`` (a ``backward=True``
    compile of ``op``'s recurrence)."""
    import torch

    from explorer.passes.fused_adjoint import derived
    from explorer.torch_arrays import sum_to

    fa = derived(op.compiled.form)
    rec = op.compiled.recurrence
    state = fa.state
    h = states[state]
    batch, (N, L) = tuple(h.shape[:-2]), tuple(h.shape[-2:])
    if L == 0 or N == 0 or h.numel() == 0:   # nothing to launch: every gradient is zero
        return {name: torch.zeros_like(arrays[name]) for name in needed}
    given = dict(arrays)
    given[fa.saved] = h
    for o, name in fa.cotangents.items():
        g = cotangents.get(o)
        if g is None:
            shape = ((1,) * len(batch) + (N, L)) if o in rec.states else (*batch, L)
            g = torch.zeros(shape, dtype=torch.float32, device=h.device)
        given[name] = g.contiguous()   # itself where it is
    sums = {g.target: tuple(arrays[g.of].shape[:-2]) for g in fa.gradients
            if g.over == "rows" and g.of in arrays}
    kernel: Any = compiled.runner("cuda")
    outs = kernel.launch_torch(sums=sums or None, **given)
    res: dict[str, Any] = {}
    for g in fa.gradients:
        name = g.of
        if name not in needed:
            continue
        x = outs[g.target]
        want = tuple(arrays[name].shape)
        if tuple(x.shape) != want:
            # a parameter's rows, or an input's batch axes given as 1: summed over the
            # channels that share them
            lead = len(x.shape) - len(want)
            if lead > 0:
                x = x.sum(dim=tuple(range(lead)))
            x = sum_to(x, want)
        res[name] = x
    return res
