"""Host side of the kernels' array dtypes (NumPy/CuPy only): what a 16-bit argument accepts, how
values are rounded into it, and what comes back.

The contract gives every array argument a dtype (``float32``, ``bfloat16`` or ``float16``;
:mod:`explorer.runtime.contract`). A 16-bit argument is kept in memory as its *storage*: NumPy's
``float16`` for ``float16``, and for ``bfloat16``, which NumPy lacks, the 16-bit patterns as
``uint16`` (the upper half of the float32 with the same value).

What a 16-bit input accepts (:func:`to_storage`):

* an array already of that dtype: a ``torch.bfloat16``/``torch.float16`` tensor, an
  ``ml_dtypes.bfloat16`` or ``numpy.float16`` array, taken bit for bit;
* any other real array or number (float64, float32, integers): rounded to the nearest value of
  the dtype, ties to even (as ``torch.Tensor.to(torch.bfloat16)`` and ``numpy.astype(float16)``
  round). A finite value that would round to infinity (beyond 65504 for float16, about
  3.39e38 for bfloat16) is refused, not silently made inf.

What comes back (:func:`from_storage`): ``float16`` outputs as float16 arrays; ``bfloat16``
outputs as torch.bfloat16 tensors to torch callers, and to NumPy/CuPy callers as float32 arrays
that hold the bfloat16 values exactly (every bfloat16 value is a float32 value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from explorer.errors import RecurrenceError

#: the dtypes a kernel's arrays may have (the contract's ``dtype`` of an array argument)
ARRAY_DTYPES = ("float32", "bfloat16", "float16")
#: the 16-bit ones
NARROW = ("bfloat16", "float16")
#: float16's largest finite value
FLOAT16_MAX = 65504.0
#: the relative rounding error of each dtype (half its machine epsilon: 2**-8 for bfloat16's
#: 8 significant bits, 2**-11 for float16's 11, 2**-24 for float32's 24)
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def storage(dtype: str) -> np.dtype:
    """The NumPy dtype that holds an array of the contract dtype ``dtype`` in memory."""
    if dtype == "float32":
        return np.dtype(np.float32)
    if dtype == "float16":
        return np.dtype(np.float16)
    if dtype == "bfloat16":
        return np.dtype(np.uint16)
    raise ValueError(f"unknown array dtype {dtype!r}; expected one of {', '.join(ARRAY_DTYPES)}")


def dtype_name(x: Any) -> str:
    """``x``'s dtype as one word: ``bfloat16`` for torch and ml_dtypes alike."""
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def round_bf16(f32: Any, xp: Any = np) -> Any:
    """The bfloat16 patterns (uint16) nearest to the float32 values ``f32``, ties to even;
    NaNs stay NaNs (quiet, sign kept)."""
    u = xp.ascontiguousarray(f32, dtype=xp.float32).view(xp.uint32)
    rounded = (u + xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1))) >> xp.uint32(16)
    quiet = (u >> xp.uint32(16)) | xp.uint32(0x0040)
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(nan, quiet, rounded).astype(xp.uint16)


def widen_bf16(bits: Any, xp: Any = np) -> Any:
    """The float32 values of bfloat16 patterns (exact)."""
    return (xp.asarray(bits).astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def to_storage(name: str, arr: Any, dtype: str, xp: Any = np) -> Any:
    """``arr`` (a NumPy or CuPy array, or an ml_dtypes bfloat16 array) as the storage of
    ``dtype``: rounded to nearest even unless it has that dtype already (see the module)."""
    if dtype not in NARROW:
        return arr
    if type(arr).__module__.startswith("torch"):
        arr, stored = _from_torch(arr, dtype, xp)
        if stored:   # the storage itself (bfloat16 patterns are uint16): no rounding again
            return arr
    text = dtype_name(arr)
    if text == dtype:
        return arr.view(np.uint16) if dtype == "bfloat16" else arr
    kind = np.dtype(np.float32 if text == "bfloat16" else arr.dtype).kind
    if kind not in "fiu":
        raise RecurrenceError(f"{name} has dtype {text}; the kernel takes {dtype} (give "
                              "real numbers)")
    wide = xp.asarray(arr, dtype=xp.float64 if kind == "f" and arr.dtype.itemsize > 4
                      else xp.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):   # overflow is refused below, with the value
            out = wide.astype(xp.float16)
        limit = FLOAT16_MAX
    else:
        with np.errstate(over="ignore"):
            f32 = wide.astype(xp.float32)
        out = round_bf16(f32, xp)
        limit = float(np.finfo(np.float32).max)
    overflow = xp.isfinite(wide) & ((xp.abs(wide) > limit) | _is_inf(out, dtype, xp))
    if bool(overflow.any()):
        worst = float(xp.where(overflow, xp.abs(wide), 0).max())
        raise RecurrenceError(f"{name} holds {worst:.4g}, beyond {dtype}'s range: rounded for "
                              "the kernel it would become inf; scale it")
    return out


def _is_inf(out: Any, dtype: str, xp: Any) -> Any:
    if dtype == "float16":
        return xp.isinf(out)
    return (out & xp.uint16(0x7FFF)) == xp.uint16(0x7F80)


def from_storage(arr: Any, dtype: str, xp: Any = np) -> Any:
    """An output of ``dtype`` from its storage, for a NumPy or CuPy caller: float16 as is,
    bfloat16 as the float32 array of the same values."""
    return widen_bf16(arr, xp) if dtype == "bfloat16" else arr


def _from_torch(x: Any, dtype: str, xp: Any) -> tuple[Any, bool]:
    """A torch tensor as an array of ``xp``, and whether it is the storage of ``dtype``: a CUDA
    tensor of ``dtype`` is (read where it is; bfloat16 through an int16 view, as CuPy has no
    bfloat16); any other tensor gives its float32 values (exact from 16 bits, so rounding them
    back gives the same bits)."""
    x = x.detach()
    if x.is_cuda and xp is not np:
        if dtype_name(x) == dtype:
            import torch

            return ((xp.from_dlpack(x.contiguous().view(torch.int16)).view(xp.uint16)
                     if dtype == "bfloat16" else xp.from_dlpack(x.contiguous())), True)
        return xp.from_dlpack(x.float().contiguous()), False
    return x.float().cpu().numpy(), False


def torch_output(bits: Any, dtype: str) -> Any:
    """A torch tensor of ``dtype`` from its storage on the GPU (a CuPy array), no copy."""
    import torch

    if dtype == "bfloat16":
        return torch.from_dlpack(bits.view("int16")).view(torch.bfloat16)
    return torch.from_dlpack(bits)


def narrow_result(bits: Any, dtype: str, kind: str, template: Any,
                  from_cupy: Callable[[Any, str, Any], Any]) -> Any:
    """A 16-bit output (its storage, a CuPy array) for a caller who passed ``kind`` arrays:
    torch gets a tensor of ``dtype`` (where the inputs were), NumPy and CuPy see
    :func:`from_storage`."""
    import cupy as cp

    if kind == "torch":
        if template is not None and template.is_cuda:
            return torch_output(bits, dtype)
        import torch

        values = torch.from_numpy(cp.asnumpy(from_storage(bits, dtype, cp)))
        return values.to(torch.bfloat16) if dtype == "bfloat16" else values
    return from_cupy(from_storage(bits, dtype, cp), kind, template)
