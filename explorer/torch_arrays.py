"""The array operations of the gradient formulas (:class:`explorer.gradients.Ops`) on torch
tensors, for :mod:`explorer.torch_op`.  The shifts along time write into one new tensor (no
zeros, no concatenation) and a product with a shifted array reads it where it is.
"""

from __future__ import annotations

from typing import Any

from explorer.gradients import Ops


class TorchOps(Ops):
    """The array operations of the gradient formulas, on torch tensors."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def exp(self, x: Any) -> Any:
        return self.torch.exp(x)

    def log(self, x: Any) -> Any:
        return self.torch.log(x)

    def tanh(self, x: Any) -> Any:
        return self.torch.tanh(x)

    def sigmoid(self, x: Any) -> Any:
        return self.torch.sigmoid(x)

    def softplus(self, x: Any) -> Any:
        # no threshold: log(1 + exp(x)) computed without overflow at every x
        return self.torch.logaddexp(x, self.torch.zeros((), dtype=x.dtype, device=x.device))

    def abs(self, x: Any) -> Any:
        return self.torch.abs(x)

    def sign(self, x: Any) -> Any:
        return self.torch.sign(x)

    def sqrt(self, x: Any) -> Any:
        return self.torch.sqrt(x)

    def power(self, x: Any, p: float) -> Any:
        return self.torch.pow(x, p)

    def maximum(self, x: Any, y: Any) -> Any:
        if isinstance(x, float):
            return self.torch.clamp_min(y, x)
        if isinstance(y, float):
            return self.torch.clamp_min(x, y)
        return self.torch.maximum(x, y)

    def minimum(self, x: Any, y: Any) -> Any:
        if isinstance(x, float):
            return self.torch.clamp_max(y, x)
        if isinstance(y, float):
            return self.torch.clamp_max(x, y)
        return self.torch.minimum(x, y)

    def sum(self, x: Any, axis: int) -> Any:
        return x.sum(dim=axis, keepdim=True)

    def cat(self, parts: list[Any]) -> Any:
        return self.torch.cat(parts, dim=-1)

    def broadcast(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.expand(shape)

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        return like.new_zeros(shape)

    def flip(self, x: Any) -> Any:
        return self.torch.flip(x, dims=[-1])

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)

    # the shifts write into one new tensor (no zeros, no concatenation), and a product with a
    # shifted array reads it where it is
    def shift(self, x: Any, k: int, init: Any, L: int) -> Any:
        if k == 0 or k >= L:
            return super().shift(x, k, init, L)
        out = x.new_empty(x.shape)
        out[..., k:].copy_(x[..., :L - k])
        if init is None:
            out[..., :k].zero_()
        else:
            out[..., :k].copy_(super().shift(x[..., :k], k, init, k))
        return out

    def next(self, x: Any) -> Any:
        if x.shape[-1] <= 1:
            return x
        out = x.new_empty(x.shape)
        out[..., :-1].copy_(x[..., 1:])
        out[..., -1:].copy_(x[..., -1:])
        return out

    def mul_shifted(self, r: Any, x: Any, k: int, init: Any, L: int) -> Any:
        if k == 0 or k >= L or not hasattr(r, "shape"):
            return super().mul_shifted(r, x, k, init, L)
        shape = _broadcast(tuple(r.shape), tuple(x.shape))
        out = x.new_empty(shape, dtype=self.torch.result_type(r, x))
        timed = r.shape[-1] == L
        self.torch.mul(r[..., k:] if timed else r, x[..., :L - k], out=out[..., k:])
        if init is None:   # x[t-k] is zero before the sequence starts
            out[..., :k].zero_()
        else:
            head = super().shift(x[..., :k], k, init, k)
            out[..., :k].copy_(r[..., :k] * head if timed else r * head)
        return out

    def dense(self, x: Any, shape: tuple[int, ...], like: Any) -> Any:
        if hasattr(x, "shape") and tuple(x.shape) == tuple(shape) and x.dtype == like.dtype:
            if x.is_contiguous():
                return x          # a tensor of its own already: no zeros, no sum
            return x.contiguous()
        return super().dense(x, shape, like)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of two shapes (the caller's shapes broadcast: checked by the product)."""
    if a == b:
        return a
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def sum_to(x: Any, own: tuple[int, ...]) -> Any:
    """A lane readout ``batch + (N, L)`` summed over the batch axes that ``own`` holds as 1."""
    import torch

    x = torch.as_tensor(x)
    axes = [i for i, k in enumerate(own) if k == 1 and x.shape[i] != 1]
    return x.sum(dim=axes, keepdim=True) if axes else x
