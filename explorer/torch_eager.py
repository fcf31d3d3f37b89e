"""When a call of the torch operator (:mod:`explorer.torch_op`) may skip the dispatcher, and
when it may skip autograd too.

In eager mode on plain tensors (:func:`eager`) the operator runs its forward, autograd formula
and adjoint as a plain ``torch.autograd.Function`` instead of through its custom operators'
dispatch; where autograd would record nothing (:func:`records` false: ``torch.no_grad()``,
inference mode, no tensor asking for a gradient, no forward-mode AD) the call is its forward's
launch alone, with no autograd function and nothing saved for a backward. Both run on every
call: loops, not ``all()`` over generators.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd import forward_ad


def eager(values: Sequence[Any]) -> bool:
    """Whether a call may skip the dispatcher: eager mode (not traced by ``torch.compile`` or
    ``torch.jit.trace``, no dispatch or function mode, no functorch transform) on plain
    tensors. Then ``torch_op._Eager`` runs the same forward, autograd formula and adjoint as
    the operators, without their dispatch (``bench/op_host.py`` times the operator's host
    work)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() \
            or torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return False
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    for x in values:
        if type(x) is torch.Tensor:
            if wrapped(x):
                return False
        elif not (x is None or isinstance(x, int | list)):
            return False
    return True


def records(values: Sequence[Any]) -> bool:
    """Whether autograd would record an eager call (one :func:`eager` allows): grad mode on and
    a tensor asking for a gradient, or forward-mode AD under way (a dual tensor asks for no
    gradient: the autograd function is what refuses it, having no ``jvp``, where the forward
    alone would drop its tangent). Where it would not, the operator's call is its forward alone
    (``RecurrenceOp.forward_call``: the launch the autograd function makes, without the
    function or what it saves for a backward)."""
    if getattr(forward_ad, "_current_level", 0) >= 0:
        return True
    if not torch.is_grad_enabled():
        return False
    for x in values:
        if type(x) is torch.Tensor and x.requires_grad:
            return True
    return False
